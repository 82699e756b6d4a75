"""Curriculum and task evolution (DreamGym / AgentGen Bi-Evol), kept verifiable.

Per seed task: `rollouts` attempts (one MCTS expansion of the root: `rollouts` distinct first
actions sampled in one call, each continued greedily), rewards tracked per task
(`RewardTracker`). A task is informative when its mean reward lies strictly inside `band`
(neither always nor never solved: non-zero variance). Informative tasks are evolved easier and
harder: the model writes a new instruction (structured `EvolvedTask`), and - so the result stays
verifiable - it is mapped to the most similar environment-generated task (word overlap) among
candidates with fewer (easier) or more (harder) reference actions. An evolved task is kept only
if its own rollouts land in the band again (then it may be evolved further, `generations`);
otherwise its trajectories are rejected with the reason. Every rollout is written with
`details["curriculum"]` (task, generation, parent, mean reward, in band).
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from typing import Any, Iterable, Literal

from pydantic import BaseModel, Field

from envs.base import Environment, Task
from envs.registry import make_env
from generators.agent import AgentPolicy
from generators.base import GenerationMethod, MethodConfig, TaskResult, TaskSpec
from generators.mcts import MCTS, SearchConfig
from generators.registry import register_method
from schemas.models import Trajectory

EVOLVE = (
    "Here is a customer-service task an agent solves about {rate:.0%} of the time:\n{instruction}\n\n"
    "Write a new, {direction} task of the same kind for the same shop (more steps make it harder, fewer "
    "easier). Reply with JSON: {{\"instruction\": \"...\", \"direction\": \"{direction}\"}}."
)


class EvolvedTask(BaseModel):
    instruction: str
    direction: Literal["easier", "harder"]


class CurriculumConfig(MethodConfig):
    method: Literal["curriculum"] = "curriculum"
    env: str = "retail"
    env_config: dict[str, Any] = Field(default_factory=dict)
    num_tasks: int = Field(8, ge=1)
    task_seed: int = 0
    task_ids: list[str] | None = None
    candidates: int = Field(32, ge=1, description="environment tasks (another seed) evolution may map to")
    rollouts: int = Field(4, ge=2)
    band: tuple[float, float] = Field((0.0, 1.0), description="keep tasks whose mean reward is strictly inside")
    generations: int = Field(1, ge=0, description="evolution rounds per seed task")
    max_depth: int = Field(10, ge=1)
    temperature: float = 1.0


class RewardTracker:
    """Rewards per task over rollouts; selects tasks by reward variance."""

    def __init__(self, band: tuple[float, float]) -> None:
        self.band = band
        self.rewards: dict[str, list[float]] = defaultdict(list)

    def record(self, task_id: str, reward: float) -> None:
        self.rewards[task_id].append(reward)

    def mean(self, task_id: str) -> float:
        return statistics.fmean(self.rewards[task_id]) if self.rewards[task_id] else 0.0

    def variance(self, task_id: str) -> float:
        r = self.rewards[task_id]
        return statistics.pvariance(r) if len(r) > 1 else 0.0

    def in_band(self, task_id: str) -> bool:
        return self.band[0] < self.mean(task_id) < self.band[1]

    def select(self, task_ids: Iterable[str], k: int) -> list[str]:
        """Up to k in-band tasks, highest reward variance first (ties: given order)."""
        ids = [t for t in task_ids if self.in_band(t)]
        return sorted(ids, key=lambda t: -self.variance(t))[:k]


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def nearest_task(instruction: str, parent: Task, pool: list[Task], direction: str) -> Task | None:
    """The pool task most similar to `instruction` that is easier / harder than `parent` (reference actions)."""
    n = len(parent.goal.get("actions", []))
    fits = [t for t in pool if t.id != parent.id and (len(t.goal.get("actions", [])) < n if direction == "easier"
                                                      else len(t.goal.get("actions", [])) > n)]
    words = _words(instruction)

    def score(t: Task) -> float:
        other = _words(t.instruction)
        return len(words & other) / max(len(words | other), 1)

    return max(fits, key=score, default=None)  # max keeps the first on ties: deterministic


@register_method
class Curriculum(GenerationMethod):
    """DreamGym / AgentGen: roll out tasks, keep those in the reward band, evolve them easier / harder."""

    name = "curriculum"
    Config = CurriculumConfig
    templates = (EVOLVE,)
    config: CurriculumConfig

    def __init__(self, config: CurriculumConfig, llm: Any):
        super().__init__(config, llm)
        self.tracker = RewardTracker(config.band)
        self._seeds: dict[str, Task] | None = None
        self._pool: list[Task] | None = None

    def make_env(self) -> Environment:
        return make_env(self.config.env, **self.config.env_config)

    def seed_tasks(self) -> dict[str, Task]:
        if self._seeds is None:
            with self.make_env() as env:
                tasks = env.generate_tasks(self.config.num_tasks, seed=self.config.task_seed)
                self._pool = env.generate_tasks(self.config.candidates, seed=self.config.task_seed + 1)
            if self.config.task_ids is not None:
                tasks = [t for t in tasks if t.id in set(self.config.task_ids)]
            self._seeds = {t.id: t for t in tasks}
        return self._seeds

    def pool(self) -> list[Task]:
        self.seed_tasks()
        assert self._pool is not None
        return self._pool

    def tasks(self) -> Iterable[TaskSpec]:
        for t in self.seed_tasks().values():
            yield TaskSpec(id=t.id, instruction=t.instruction)

    async def attempt(self, task: Task, generation: int, parent: str | None) -> list[Trajectory]:
        """`rollouts` attempts at `task`, recorded in the tracker."""
        with self.make_env() as env:
            tools = env.tools()
        policy = AgentPolicy(self.llm, tools, temperature=self.config.temperature)
        greedy = AgentPolicy(self.llm, tools, temperature=0.0)
        search = SearchConfig(iterations=1, generations=self.config.rollouts, max_depth=self.config.max_depth,
                              dedupe_children=False)
        tree = await MCTS(self.make_env, policy, search, rollout_policy=greedy).search(task)
        out = []
        for child in tree.root.children:
            reward = float(child.outcome or 0.0)
            self.tracker.record(task.id, reward)
            out.append(Trajectory(
                id=f"{self.name}/{task.id}/g{generation}/r{len(out)}", source=self.name, steps=child.path_steps(),
                tools=tools, reward=reward, success=reward >= 1.0,
                provenance=self.provenance(task.id, parents=[parent] if parent else [], seed=task.seed),
                details={"task": task.model_dump(mode="json"), "env": self.config.env, "env_config": self.config.env_config},
            ))
        for t in out:
            t.details["curriculum"] = {"task_id": task.id, "generation": generation, "parent": parent,
                                       "mean_reward": self.tracker.mean(task.id), "in_band": self.tracker.in_band(task.id)}
        return out

    async def evolve(self, task: Task, direction: str) -> Task | None:
        prompt = EVOLVE.format(rate=self.tracker.mean(task.id), instruction=task.instruction, direction=direction)
        answer = await self.llm.structured([{"role": "user", "content": prompt}], EvolvedTask, temperature=0.7)
        if answer is None:
            return None
        found = nearest_task(answer.instruction, task, self.pool(), direction)
        if found is None:
            return None
        return found.model_copy(update={"metadata": {**found.metadata, "evolved_from": task.id, "direction": direction,
                                                     "proposed_instruction": answer.instruction}})

    async def run_task(self, spec: TaskSpec) -> TaskResult:
        result = TaskResult()
        frontier = [(self.seed_tasks()[spec.id], None)]
        for generation in range(self.config.generations + 1):
            next_frontier = []
            for task, parent in frontier:
                trajs = await self.attempt(task, generation, parent)
                if self.tracker.in_band(task.id) or generation == 0:
                    result.trajectories.extend(trajs)  # seed tasks are always written, with their band flag
                else:
                    for t in trajs:
                        result.reject(t, "curriculum_band", f"out of band: mean reward {self.tracker.mean(task.id):.2f}")
                result.counts["curriculum_in_band" if self.tracker.in_band(task.id) else "curriculum_out_of_band"] += 1
                if not self.tracker.in_band(task.id) or generation == self.config.generations:
                    continue
                for direction in ("easier", "harder"):
                    evolved = await self.evolve(task, direction)
                    result.counts[f"evolved_{direction}" if evolved else "evolve_failed"] += 1
                    if evolved is not None:
                        next_frontier.append((evolved, task.id))
            frontier = next_frontier
        return result
