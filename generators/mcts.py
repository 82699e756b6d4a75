"""Monte-Carlo tree search over any environment that can snapshot and restore its state.

A node holds the environment snapshot after its action and the history that led there. One
iteration: select leaves by UCT (value / visits + c * sqrt(ln N_parent / N)), expand each with
`generations` candidate actions drawn in ONE `propose(history, n=generations)` call (parallel
samples), roll every new child out to a terminal state with the greedy policy (done, max depth,
a negative step reward or an unreadable answer), and back-propagate the outcome reward.

Parallel expansion: the rollouts of one expansion (and, with `leaves_per_iteration > 1`, the
expansions of several leaves picked under virtual loss) run concurrently (`asyncio.gather`),
each on its own environment from a small pool, so an iteration costs about one expansion call
plus the longest rollout chain of model calls; `SearchStats.critical_calls` counts exactly that.

Determinism: children keep the proposal order, ties in UCT go to the earlier child, tool call
ids are renumbered by position (`call_<step index>`), and identical proposals are merged, so a
scripted model gives the same tree every time.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson
from pydantic import BaseModel, ConfigDict, Field

from envs.base import Environment, Snapshot, Task
from generators.agent import AgentPolicy
from schemas.models import Action, Observation, Step

ACTION_KINDS = ("api", "code", "message")


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
    snapshot: Snapshot
    depth: int = 0  # agent actions from the root
    terminal: bool = False
    children: list[Node] = field(default_factory=list)
    visits: int = 0
    value_sum: float = 0.0
    # The greedy continuation from this node to a terminal state, and the outcome of the whole path.
    rollout: list[Step] = field(default_factory=list)
    outcome: float | None = None

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
    revisits: int = 0  # selections that ended on a terminal / depth-capped node

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


def with_call_id(step: Step, index: int, call_id: str | None) -> Step:
    """A copy of `step` whose tool call id is positional, so equal paths have equal content."""
    if step.kind == "api":
        return step.model_copy(update={"tool_call_id": f"call_{index}"})
    if step.kind not in ACTION_KINDS and step.tool_call_id is not None:
        return step.model_copy(update={"tool_call_id": call_id})
    return step


def renumber_calls(steps: list[Step]) -> list[Step]:
    """Positional tool call ids for a whole trajectory (after splicing, ids must stay unique)."""
    out: list[Step] = []
    mapping: dict[str, str] = {}
    for i, step in enumerate(steps):
        if step.kind == "api":
            new = f"call_{i}"
            if step.tool_call_id:
                mapping[step.tool_call_id] = new
            out.append(step.model_copy(update={"tool_call_id": new}))
        elif step.kind not in ACTION_KINDS and step.tool_call_id is not None:
            out.append(step.model_copy(update={"tool_call_id": mapping.get(step.tool_call_id, step.tool_call_id)}))
        else:
            out.append(step)
    return out


class EnvPool:
    """Environments for concurrent chains: each chain restores its own snapshot on a borrowed env."""

    def __init__(self, factory: Callable[[], Environment]) -> None:
        self.factory = factory
        self._free: list[Environment] = []
        self._all: list[Environment] = []

    def acquire(self) -> Environment:
        if not self._free:
            env = self.factory()
            self._all.append(env)
            return env
        return self._free.pop()

    def release(self, env: Environment) -> None:
        self._free.append(env)

    def close(self) -> None:
        for env in self._all:
            env.close()
        self._all.clear()
        self._free.clear()


@dataclass
class StepOutcome:
    action: Action
    observation: Observation
    reward: float
    done: bool
    snapshot: Snapshot | None


async def apply(env: Environment, snapshot: Snapshot | None, action: Action, index: int, *, keep: bool = True) -> StepOutcome:
    """Restore `snapshot` on `env` (None: act on the current state), take `action` at step `index`.

    The action gets the positional call id `call_<index>`; `keep` snapshots the state after it.
    """
    if snapshot is not None:
        env.restore(snapshot)
    action = with_call_id(action, index, None)  # type: ignore[assignment]
    result = await env.astep(action)
    obs = with_call_id(result.observation, index + 1, action.tool_call_id)  # type: ignore[arg-type]
    return StepOutcome(action, obs, result.reward, result.done, env.snapshot() if keep else None)  # type: ignore[arg-type]


async def rollout(
    env: Environment, policy: AgentPolicy, history: list[Step], depth: int, max_depth: int,
    *, guidance: str | None = None,
) -> tuple[list[Step], float, int]:
    """Greedy continuation from the env's current state: (new steps, outcome reward, model calls).

    Ends on done (outcome = the final step reward), a negative step reward (that reward), an
    unreadable answer (0.0) or `max_depth` agent actions (the environment's evaluation).
    """
    steps: list[Step] = []
    calls = 0
    while depth < max_depth:
        proposal = (await policy.propose(history + steps, n=1, guidance=guidance))[0]
        calls += 1
        if proposal.action is None:
            return steps, 0.0, calls
        out = await apply(env, None, proposal.action, len(history) + len(steps), keep=False)
        steps += [out.action, out.observation]
        depth += 1
        if out.done or out.reward < 0:
            return steps, out.reward, calls
    return steps, env.evaluate(), calls


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
        env = self.pool.acquire()
        try:
            first = await env.areset(task)
            root = Node(0, None, [first], env.snapshot())
        finally:
            self.pool.release(env)
        tree = Tree(task, root, [root], SearchStats())
        try:
            for _ in range(self.config.iterations):
                leaves = self._select_leaves(tree)
                chains = await asyncio.gather(*(self._grow(tree, leaf) for leaf in leaves))
                tree.stats.iterations += 1
                tree.stats.critical_calls += max(chains, default=0)
        finally:
            self.pool.close()
        return tree

    # ---- selection ----------------------------------------------------------------------------

    def _select_leaves(self, tree: Tree) -> list[Node]:
        """Distinct leaves to grow now; virtual visits steer later picks of this round elsewhere."""
        picked: list[Node] = []
        virtual: list[Node] = []
        for _ in range(self.config.leaves_per_iteration):
            node = tree.root
            while node.children and not node.terminal:
                node = max(node.children, key=lambda ch: ch.uct(self.config.c))  # max keeps the first on ties
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
        if leaf.terminal or leaf.depth >= self.config.max_depth:
            tree.stats.revisits += 1
            self._backprop(leaf, leaf.outcome if leaf.outcome is not None else 0.0)
            return 0
        proposals = await self.policy.propose(leaf.history, n=self.config.generations)
        tree.stats.model_calls += 1
        tree.stats.expansions += 1
        children: list[Node] = []
        seen: set[str] = set()
        env = self.pool.acquire()
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
                out = await apply(env, leaf.snapshot, p.action, len(leaf.history))
                tree.stats.env_steps += 1
                assert out.snapshot is not None
                child = Node(len(tree.nodes), leaf, leaf.history + [out.action, out.observation], out.snapshot,
                             depth=leaf.depth + 1, terminal=out.done or out.reward < 0)
                if child.terminal:
                    child.outcome = out.reward
                tree.nodes.append(child)
                children.append(child)
        finally:
            self.pool.release(env)
        leaf.children.extend(children)
        calls = await asyncio.gather(*(self._simulate(tree, ch) for ch in children))
        for child in children:
            self._backprop(child, child.outcome or 0.0)
        return 1 + max(calls, default=0)

    async def _simulate(self, tree: Tree, node: Node) -> int:
        if node.terminal:
            return 0
        env = self.pool.acquire()
        try:
            env.restore(node.snapshot)
            steps, outcome, calls = await rollout(env, self.rollout_policy, node.history, node.depth,
                                                  self.config.max_depth)
        finally:
            self.pool.release(env)
        node.rollout, node.outcome = steps, outcome
        tree.stats.model_calls += calls
        tree.stats.env_steps += sum(1 for s in steps if s.kind in ACTION_KINDS)
        return calls

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
