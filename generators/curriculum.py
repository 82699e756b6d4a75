"""Curriculum and task evolution (DreamGym / AgentGen Bi-Evol), kept verifiable.

The run goes in rounds. Round 0 attempts every seed task; each attempt is `rollouts` rollouts
(one MCTS expansion of the root: `rollouts` first actions sampled in one call, each continued
greedily), and the rewards are tracked per task (`RewardTracker`). The next round's tasks are
chosen by reward variance across those rollouts: tasks neither always nor never solved (mean
strictly inside `band`) are ranked by variance and the `select` highest are evolved easier and
harder. Evolution keeps tasks verifiable: the model writes a new instruction (structured
`EvolvedTask`), which is mapped to the most similar environment-generated task (word overlap)
among `candidates` with fewer (easier) or more (harder) reference actions. An evolved task is
attempted in the next round; its rollouts are kept only if its mean reward lands in the band
again (then it competes for the following round, up to `generations` rounds), else they are
rejected with the reason. Seed rollouts are always written. Every rollout carries
`details["curriculum"]` (task, generation, parent, mean reward, variance, in band).

Each round is an ordinary run over method tasks (`<seed id>` in round 0, `<parent>/<direction>`
later), so a killed run resumes by task id; the tracker is rebuilt from what the output already
holds (kept and rejected rollouts), so a resumed run selects the same tasks.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from typing import Any, ClassVar, Iterable, Literal

from pydantic import BaseModel, Field

from envs.base import Task
from generators.base import MAX_TASKS, RunSummary, TaskResult, TaskSpec
from generators.env_method import EnvMethod, EnvMethodConfig
from generators.mcts import MCTS, SearchConfig
from generators.registry import register_method
from schemas.models import Trajectory
from schemas.store import Dataset

EVOLVE = (
    "Here is a customer-service task an agent solves about {rate:.0%} of the time:\n{instruction}\n\n"
    "Write a new, {direction} task of the same kind for the same shop (more steps make it harder, fewer "
    "easier). Reply with JSON: {{\"instruction\": \"...\", \"direction\": \"{direction}\"}}."
)


class EvolvedTask(BaseModel):
    instruction: str
    direction: Literal["easier", "harder"]


class CurriculumConfig(EnvMethodConfig):
    method: Literal["curriculum"] = "curriculum"
    requires: ClassVar[frozenset[str]] = frozenset({"generator"})
    candidates: int = Field(32, ge=1, le=MAX_TASKS, description="environment tasks (another seed) evolution may map to")
    rollouts: int = Field(4, ge=2)
    band: tuple[float, float] = Field((0.0, 1.0), description="keep tasks whose mean reward is strictly inside")
    generations: int = Field(1, ge=0, description="evolution rounds after the seed round")
    select: int = Field(2, ge=1, description="tasks evolved per round: the in-band ones with the highest reward variance")
    temperature: float = 1.0


class RewardTracker:
    """Rewards per task over rollouts; selects tasks by reward variance."""

    def __init__(self, band: tuple[float, float]) -> None:
        self.band = band
        self.rewards: dict[str, list[float]] = defaultdict(list)

    def record(self, task_id: str, reward: float) -> None:
        self.rewards[task_id].append(reward)

    @classmethod
    def of(cls, band: tuple[float, float], task_id: str, rewards: Iterable[float]) -> RewardTracker:
        tracker = cls(band)
        for r in rewards:
            tracker.record(task_id, r)
        return tracker

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
class Curriculum(EnvMethod):
    """DreamGym / AgentGen: roll out tasks, evolve the highest-variance ones easier / harder, keep those in band."""

    name = "curriculum"
    Config = CurriculumConfig
    templates = (EVOLVE,)
    config: CurriculumConfig

    def __init__(self, config: CurriculumConfig, llm: Any):
        super().__init__(config, llm)
        self.tracker = RewardTracker(config.band)
        self._pool: list[Task] | None = None

    def seed_tasks(self) -> dict[str, Task]:
        return self.env_tasks()

    def pool(self) -> list[Task]:
        if self._pool is None:
            env = self.make_env()
            self._pool = env.generate_tasks(self.config.candidates, seed=self.config.tasks.seed + 1)
        return self._pool

    def tasks(self) -> Iterable[TaskSpec]:
        for t in self.seed_tasks().values():
            yield TaskSpec(id=t.id, instruction=t.instruction)

    # ---- rounds ---------------------------------------------------------------------------------
    async def run(self, tasks: Iterable[TaskSpec], output: Dataset, *, progress: Any = None) -> RunSummary:
        """Round 0 over `tasks`, then `generations` rounds over the evolutions of the selected tasks."""
        specs = list(tasks)
        summary = await super().run(specs, output, progress=progress)
        for generation in range(1, self.config.generations + 1):
            known = self.load_tracker(output)
            chosen = self.tracker.select([s.id for s in specs], self.config.select)
            specs = [TaskSpec(id=f"{parent}/{direction}", instruction=known[parent].instruction,
                              payload={"parent": parent, "task": known[parent].model_dump(mode="json"),
                                       "direction": direction, "generation": generation,
                                       "parent_mean": self.tracker.mean(parent)})
                     for parent in chosen for direction in ("easier", "harder")]
            if not specs:
                break
            summary = _merge(summary, await super().run(specs, output, progress=progress))
        return summary

    def load_tracker(self, output: Dataset) -> dict[str, Task]:
        """Rebuild the tracker from every rollout in `output` (kept and rejected); returns the tasks by id."""
        self.tracker = RewardTracker(self.config.band)
        known: dict[str, Task] = {}
        records = [*output.iter_records(), *(f.record for f in output.iter_records("filtered"))]
        for traj in sorted(records, key=lambda t: t.id):  # rollout order within a task: r0, r1, ...
            info = traj.details.get("curriculum")
            if info is None:
                continue
            self.tracker.record(info["task_id"], float(traj.reward or 0.0))
            known.setdefault(info["task_id"], Task.model_validate(traj.details["task"]))
        return known

    # ---- one method task --------------------------------------------------------------------------
    async def attempt(self, task: Task, key: str, generation: int, parent: str | None) -> list[Trajectory]:
        """`rollouts` attempts at `task`, tagged with the method task id `key` and the task's statistics."""
        policy = self.policy(self.config.temperature)
        greedy = self.policy(0.0)
        search = SearchConfig(iterations=1, generations=self.config.rollouts, max_depth=self.config.max_steps,
                              dedupe_children=False)
        tree = await MCTS(self.make_env, policy, search, rollout_policy=greedy).search(task)
        rewards = [float(child.outcome or 0.0) for child in tree.root.children]
        stats = RewardTracker.of(self.config.band, key, rewards)
        info = {"task_id": key, "generation": generation, "parent": parent, "mean_reward": stats.mean(key),
                "variance": stats.variance(key), "in_band": stats.in_band(key)}
        out = []
        for i, child in enumerate(tree.root.children):
            traj = self.trajectory(task, "", child.path_steps(), child.evaluation, parents=[parent] if parent else [],
                                   curriculum=info)
            out.append(traj.model_copy(update={"id": f"{self.name}/{key}/g{generation}/r{i}"}))
        return out

    async def evolve(self, task: Task, direction: str, rate: float) -> Task | None:
        prompt = EVOLVE.format(rate=rate, instruction=task.instruction, direction=direction)
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
        p = spec.payload
        seed = "parent" not in p
        if seed:
            trajs = await self.attempt(self.seed_tasks()[spec.id], spec.id, 0, None)
        else:
            evolved = await self.evolve(Task.model_validate(p["task"]), p["direction"], p["parent_mean"])
            result.counts[f"evolved_{p['direction']}" if evolved else "evolve_failed"] += 1
            if evolved is None:
                return result
            trajs = await self.attempt(evolved, spec.id, p["generation"], p["parent"])
        in_band = bool(trajs) and trajs[0].details["curriculum"]["in_band"]
        result.counts["curriculum_in_band" if in_band else "curriculum_out_of_band"] += 1
        if seed or in_band:  # seed rollouts are always written, with their band flag
            result.trajectories.extend(trajs)
        else:
            for t in trajs:
                result.reject(t, "curriculum_band", f"out of band: mean reward {t.details['curriculum']['mean_reward']:.2f}")
        return result


def _merge(a: RunSummary, b: RunSummary) -> RunSummary:
    """One summary for all rounds (the LLM stats are cumulative already)."""
    a.tasks += b.tasks
    a.skipped += b.skipped
    a.processed += b.processed
    a.counts.update(b.counts)
    a.reasons.update(b.reasons)
    a.llm = b.llm
    return a
