"""Monte-Carlo tree search over any environment: snapshot-capable ones and those restored by replay.

A node holds a checkpoint of the environment after its action (a snapshot where the world can
copy itself, else the history a fresh episode replays) and the history that led there. One
iteration: select leaves by UCT (value / visits + c * sqrt(ln N_parent / N)) among the children whose
subtree is still open, expand each with
`generations` candidate actions drawn in ONE `propose(history, n=generations)` call (parallel
samples), roll every new child out to the end of its episode with the greedy policy through the
one episode loop (`continue_episode`), and back-propagate the outcome: the environment's own
evaluation at the end of every path (done, the depth cap, failed answers), whatever evaluates it
(goal state, criteria, an LLM judge).

Ended paths, as in Agent-R's `mcts_raw.py` (`best_child` skips terminal children, `update_terminal`):
a node whose episode ended (done or the depth cap) is backed up with its value once, when it is
made, and is *closed*: selection never lands on it again, and a node whose children are all
closed is closed too. No iteration is spent re-counting a known outcome; when the root closes
(every path of the tree is known) the search stops early (`mcts_exhausted`).

Parallel expansion: the rollouts of one expansion (and, with `leaves_per_iteration > 1`, the
expansions of several leaves picked under virtual loss) run concurrently (`asyncio.gather`),
each on its own environment from a small pool, so an iteration costs about one expansion call
plus the longest rollout chain of model calls; `SearchStats.critical_calls` counts exactly that.

Determinism: children keep the proposal order, ties in UCT go to the earlier child, tool call
ids are positional (`call_<step index>`), and identical proposals are merged, so a scripted
model gives the same tree every time.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson
from pydantic import BaseModel, ConfigDict, Field

from envs.base import Checkpoint, Environment, Evaluation, Task, checkpoint, restore
from generators._episode import act, continue_episode, opened
from generators.agent import AgentPolicy
from schemas.models import Action, Step


class SearchConfig(BaseModel):
    """The shape of the search; defaults are Agent-R's (4 iterations x 4 generations, depth 10, c = 0.25)."""

    model_config = ConfigDict(extra="forbid")

    iterations: int = Field(4, ge=1, description="selection/expansion/rollout rounds per tree")
    generations: int = Field(4, ge=1, description="candidate actions sampled per expansion (one n= call)")
    max_depth: int = Field(10, ge=1, description="agent actions per path, tree part and rollout together")
    c: float = Field(0.25, ge=0, description="UCT exploration constant")
    leaves_per_iteration: int = Field(1, ge=1, description="leaves expanded concurrently per iteration (virtual loss)")
    dedupe_children: bool = Field(True, description="merge identical sampled actions into one child")


@dataclass
class Node:
    """A tree node: the state after `action` (and its `observation`) plus search statistics."""

    id: int
    parent: Node | None
    history: list[Step]
    point: Checkpoint
    depth: int = 0  # agent actions from the root
    terminal: bool = False
    # Nothing left to learn below: the node ended, or every child is closed (Agent-R's `update_terminal`).
    closed: bool = False
    children: list[Node] = field(default_factory=list)
    visits: int = 0
    value_sum: float = 0.0
    # The greedy continuation from this node to a terminal state, and the outcome of the whole path.
    rollout: list[Step] = field(default_factory=list)
    outcome: float | None = None
    evaluation: Evaluation | None = None

    @property
    def action(self) -> Action | None:
        return self.history[-2] if self.parent is not None else None  # type: ignore[return-value]

    @property
    def q(self) -> float:
        return self.value_sum / self.visits if self.visits else 0.0

    def uct(self, c: float) -> float:
        if self.visits == 0:
            return math.inf
        assert self.parent is not None
        return self.q + c * math.sqrt(math.log(max(self.parent.visits, 1)) / self.visits)

    def path_steps(self) -> list[Step]:
        """The complete trajectory this node stands for: its history, then its rollout."""
        return self.history + self.rollout


@dataclass
class SearchStats:
    iterations: int = 0
    expansions: int = 0
    env_steps: int = 0
    model_calls: int = 0
    # Model calls on the critical path: per iteration, one expansion call plus the longest rollout.
    critical_calls: int = 0
    duplicate_samples: int = 0
    unreadable_samples: int = 0
    exhausted: int = 0  # 1 when the search stopped early: every path of the tree had ended
    replays: int = 0  # restores by replaying a recorded history (worlds that cannot snapshot)

    def as_counts(self) -> dict[str, int]:
        return {f"mcts_{k}": v for k, v in self.__dict__.items()}


@dataclass
class Tree:
    task: Task
    root: Node
    nodes: list[Node]
    stats: SearchStats

    def depth(self) -> int:
        return max(n.depth for n in self.nodes)

    def expanded(self) -> list[Node]:
        return [n for n in self.nodes if n.children]


def action_key(action: Action) -> str:
    """What makes two actions the same move (thoughts and call ids do not)."""
    data = action.model_dump(mode="json", include={"kind", "function", "arguments", "content", "language"})
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode()


class EnvPool:
    """Started environments for concurrent chains: each chain restores its own checkpoint on a borrowed env."""

    def __init__(self, factory: Callable[[], Environment]) -> None:
        self.factory = factory
        self._free: list[Environment] = []
        self._all: list[Environment] = []

    async def acquire(self) -> Environment:
        if self._free:
            return self._free.pop()
        env = self.factory()
        self._all.append(env)
        await env.start()
        return env

    def release(self, env: Environment) -> None:
        self._free.append(env)

    @property
    def replays(self) -> int:
        return sum(env.replays for env in self._all)

    async def close(self) -> None:
        envs, self._all, self._free = self._all, [], []
        for env in envs:
            await env.close()


class MCTS:
    """One search per task: `await MCTS(...).search(task)` returns the tree."""

    def __init__(
        self, env_factory: Callable[[], Environment], policy: AgentPolicy, config: SearchConfig,
        rollout_policy: AgentPolicy | None = None,
    ) -> None:
        self.pool = EnvPool(env_factory)
        self.policy = policy
        self.rollout_policy = rollout_policy or policy
        self.config = config

    async def search(self, task: Task) -> Tree:
        try:
            env = await self.pool.acquire()
            opening = opened(self.policy, await env.reset(task))  # paths open with the system step
            root = Node(0, None, opening, checkpoint(env, opening))
            self.pool.release(env)
            tree = Tree(task, root, [root], SearchStats())
            for _ in range(self.config.iterations):
                leaves = self._select_leaves(tree)
                if not leaves:  # every path has ended: more iterations would only re-count known outcomes
                    tree.stats.exhausted = 1
                    break
                chains = await asyncio.gather(*(self._grow(tree, leaf) for leaf in leaves))
                tree.stats.iterations += 1
                tree.stats.critical_calls += max(chains, default=0)
            tree.stats.replays = self.pool.replays
        finally:
            await self.pool.close()
        return tree

    # ---- selection ----------------------------------------------------------------------------

    def _select_leaves(self, tree: Tree) -> list[Node]:
        """Distinct open leaves to grow now (none when the root is closed); virtual visits steer later picks of
        this round elsewhere. Closed children are never chosen (Agent-R's `best_child` skips terminal ones)."""
        picked: list[Node] = []
        virtual: list[Node] = []
        for _ in range(self.config.leaves_per_iteration):
            if tree.root.closed:
                break
            node = tree.root
            while node.children:
                node = max((ch for ch in node.children if not ch.closed),
                           key=lambda ch: ch.uct(self.config.c))  # max keeps the first on ties
            if node in picked:
                break
            picked.append(node)
            walk: Node | None = node
            while walk is not None:  # virtual loss: a pending visit counted as a failure (-1)
                walk.visits += 1
                walk.value_sum -= 1.0
                virtual.append(walk)
                walk = walk.parent
        for n in virtual:
            n.visits -= 1
            n.value_sum += 1.0
        return picked

    # ---- expansion + simulation ------------------------------------------------------------------

    async def _grow(self, tree: Tree, leaf: Node) -> int:
        """Expand `leaf` and roll out its children concurrently; returns critical-path model calls."""
        assert not leaf.closed and leaf.depth < self.config.max_depth  # ended nodes are closed when made
        proposals = await self.policy.propose(leaf.history, n=self.config.generations)
        tree.stats.model_calls += 1
        tree.stats.expansions += 1
        children: list[Node] = []
        seen: set[str] = set()
        env = await self.pool.acquire()
        try:
            for p in proposals:
                if p.action is None:
                    tree.stats.unreadable_samples += 1
                    continue
                key = action_key(p.action)
                if self.config.dedupe_children and key in seen:
                    tree.stats.duplicate_samples += 1
                    continue
                seen.add(key)
                await restore(env, leaf.point)
                action, observation, result = await act(env, p.action, len(leaf.history))
                tree.stats.env_steps += 1
                history = leaf.history + [action, observation]
                child = Node(len(tree.nodes), leaf, history, checkpoint(env, history), depth=leaf.depth + 1,
                             terminal=result.done)
                if child.terminal or child.depth >= self.config.max_depth:
                    # The path ends here: the environment's evaluation is its outcome.
                    child.terminal = child.closed = True
                    child.evaluation = await env.evaluate()
                    child.outcome = child.evaluation.reward
                tree.nodes.append(child)
                children.append(child)
        finally:
            self.pool.release(env)
        leaf.children.extend(children)
        calls = await asyncio.gather(*(self._simulate(tree, ch) for ch in children))
        for child in children:
            self._backprop(child, child.outcome or 0.0)
        self._close(leaf)
        return 1 + max(calls, default=0)

    async def _simulate(self, tree: Tree, node: Node) -> int:
        if node.terminal:
            return 0
        env = await self.pool.acquire()
        try:
            await restore(env, node.point)
            episode = await continue_episode(env, self.rollout_policy, node.history, max_steps=self.config.max_depth,
                                             actions_taken=node.depth)
        finally:
            self.pool.release(env)
        node.rollout = episode.steps[len(node.history):]
        node.evaluation = episode.evaluation
        node.outcome = episode.reward
        calls = episode.actions - node.depth + episode.parse_failures
        tree.stats.model_calls += calls
        tree.stats.env_steps += episode.actions - node.depth
        return calls

    @staticmethod
    def _close(node: Node | None) -> None:
        """Close `node` and its ancestors while all their children are closed."""
        while node is not None and node.children and all(ch.closed for ch in node.children):
            node.closed = True
            node = node.parent

    @staticmethod
    def _backprop(node: Node | None, value: float) -> None:
        while node is not None:
            node.visits += 1
            node.value_sum += value
            node = node.parent


def tree_signature(tree: Tree) -> list[tuple[Any, ...]]:
    """A comparable summary of a tree (for determinism checks)."""
    return [
        (n.id, n.parent.id if n.parent else None, n.depth, n.visits, round(n.value_sum, 6), n.outcome,
         action_key(n.action) if n.action is not None else None, len(n.rollout))
        for n in tree.nodes
    ]
