"""Curriculum and task evolution (DreamGym / AgentGen Bi-Evol): new tasks, harder and easier, kept only if verifiable.

The run goes in rounds. Round 0 attempts every seed task (from any task source): `rollouts`
independent rollouts, rollout k being draw k of the agent (every step sampled at `temperature`
with the seed `seed + k`, so no rollout is answered from another's cache entry), and the rewards
are tracked per task (`RewardTracker`). As in
DreamGym, the next round starts from the tasks the agent is least sure about: tasks neither
always nor never solved (mean strictly inside `band`) ranked by reward variance; the `select`
highest are evolved in both directions (AgentGen's Bi-Evol):

- **evolve** — the model sees the seed task, its checkable specification, how it is solved (the
  reference solution replayed in the environment, with what the tools returned: real ids to
  build on), the rules and the tools, and writes ONE new task, easier (a simpler goal: fewer
  conditions, fewer steps, a goal nearer the start) or harder (more conditions or constraints,
  more steps, a related second request), with what makes it checkable.
- **check** (the evolution check) — the new task is kept only if the environment can verify it,
  in the way `verify` names (`auto`: criteria when the seed has reference actions, else a code
  check where the world exposes a state, else the environment's own reward):
  - `criteria`: tau2-style criteria the model writes (`actions`, `communicate_info`) in the task's
    goal; the environment evaluates them and its reference solution must pass;
  - `code`: a Python `verify(state)` the model writes, run in the sandbox on the world's state
    (self-challenging's Code-as-Task machinery), with the model's solution;
  - `reward`: a goal in the environment's own format (a page or goal check) and the model's solution.
  In every mode the solution must succeed (its calls accepted by the world), a do-nothing
  episode must fail, and each of the model's wrong solutions must fail. Failing variants are
  filtered by "evolution_check" with the reason and every check's verdict.
  The writer's solution replayed proves its calls are accepted, not that the instruction asks for
  what the check checks (in `criteria` mode the solution *is* the criteria's actions). So, with
  `solved_by: agent` (the default, DreamGym's "verified by the world"), a variant also needs the
  acting agent, given only the instruction, to be judged solved by the world's check in at least
  one of its attempts (check case "agent attempts"), else its rollouts are filtered by
  "evolution_check"; `solved_by: writer` keeps the replay alone (trajforge's earlier check). Each
  variant's record says which ran (`details.evolution.solved_by`).
- **attempt** — a kept variant is attempted like a seed (rewards from the environment's
  evaluation, or from the sandboxed verifier on each rollout's final state); its rollouts are
  kept only if its mean reward lands in the band again (then it competes for the following
  round, up to `generations` rounds), else rejected with the reason.

Seed rollouts are always written. Every rollout carries `details["curriculum"]` (task,
generation, parent, mean reward, variance, in band); a variant's also `details["evolution"]`
(mode, checks with their reasons). Each round is an ordinary run over method tasks (`<seed id>`
in round 0, `<parent>/<direction>` later), so a killed run resumes by task id; the tracker is
rebuilt from what the output already holds, so a resumed run selects the same tasks.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

from pydantic import BaseModel, Field, model_validator

from envs.base import Environment, Evaluation, Task
from envs.criteria import CRITERIA_KEYS
from filters import step_judge
from generators._episode import Episode, act, play_episode
from generators.base import Role, RoleModel, RunSummary, TaskResult, TaskSpec
from generators.env_method import EnvMethod, EnvMethodConfig
from generators.registry import register_method
from generators.self_challenging import SandboxLimits, ToolCall, _state_shape, env_state, run_verifier
from generators.transcript import tools_block
from schemas.models import Action, ApiAction, MessageAction, Step, TextObservation, Trajectory
from schemas.store import Dataset

Mode = Literal["criteria", "code", "reward"]
# Goals a world checks as tau2-style criteria: reference actions, what to tell the user (tau2's
# communicate_info, the retail world's outputs), a precomputed state digest. A goal with other keys
# (a site's evaluation checks, a page's own task) is checked the world's own way.
TAU2_STYLE = frozenset({*CRITERIA_KEYS, "outputs", "state_hash"})

EVOLVE_SYSTEM = (
    "You evolve tasks for training an AI agent, in both directions: easier and harder. You get a seed task of "
    "an environment, what makes it checkable, how it is solved (with what the tools returned) and how often the "
    "agent solves it now. Write ONE new task for the same environment and the same user that is {rule} "
    "The new task must be a different request, feasible with the tools and with data that exists (use ids and "
    "values you have seen), stated by the user in the first person with the details the agent needs, and "
    "checkable: {check}\n\n# Rules the agent follows\n{policy}\n\n# Tools (JSON, one per line)\n{tools}"
)
DIRECTIONS = {
    "easier": "EASIER than the seed: simplify its goal: fewer conditions to satisfy, fewer steps, a goal nearer "
              "the starting state (for example one part of the seed on its own).",
    "harder": "HARDER than the seed: add conditions or constraints the agent must satisfy, more steps or more "
              "information to gather, or a related second request to handle in the same conversation.",
}
CHECKS = {
    "criteria": "write its criteria as tau2-bench does: \"actions\", the tool calls that do it, in order, and "
                "\"communicate_info\", the facts the agent must tell the user (may be empty); and "
                "\"wrong_solutions\": one to three plausible lists of tool calls that must NOT satisfy it.",
    "code": "write \"verifier\", Python source defining `def verify(state) -> bool` (standard library only) that "
            "returns True exactly when the task is done, `state` being the environment state after the episode, "
            "shaped as shown; \"solution\", the tool calls that do it; \"final_answer\", what the agent tells the "
            "user at the end (may be empty); and \"wrong_solutions\": one to three plausible lists of tool calls "
            "that must NOT satisfy it.",
    "reward": "write \"goal\", the environment's own success check for it, in the same format as the seed's goal; "
              "\"solution\", the tool calls that do it; \"final_answer\", what the agent tells the user at the "
              "end (may be empty); and \"wrong_solutions\": one to three plausible lists of tool calls that must "
              "NOT satisfy it.",
}
EVOLVE_USER = (
    "EVOLVE TASK ({direction})\nSeed task: {instruction}\nThe agent solves it {rate:.0%} of the time.\n\n"
    "{spec}\n\nHow the seed is solved (agent steps numbered, with what came back):\n{solution}"
)


class _Variant(BaseModel):
    instruction: str = Field(min_length=1)
    wrong_solutions: list[list[ToolCall]] = Field(min_length=1, max_length=3)


class CriteriaVariant(_Variant):
    actions: list[ToolCall] = Field(min_length=1)
    communicate_info: list[str] = Field(default_factory=list)


class CodeVariant(_Variant):
    verifier: str = Field(min_length=1)
    solution: list[ToolCall] = Field(min_length=1)
    final_answer: str = ""


class GoalVariant(_Variant):
    goal: dict[str, Any]
    solution: list[ToolCall] = Field(min_length=1)
    final_answer: str = ""


SCHEMAS: dict[str, type[_Variant]] = {"criteria": CriteriaVariant, "code": CodeVariant, "reward": GoalVariant}


class CurriculumConfig(EnvMethodConfig):
    method: Literal["curriculum"] = "curriculum"
    verify: Literal["auto", "criteria", "code", "reward"] = Field(
        "auto", description="how an evolved task proves checkable: auto (criteria when the seed has reference "
                            "actions, else code where the world has a state, else the world's reward)")
    rollouts: int = Field(4, ge=2, description="independent attempts per task, whose rewards' variance selects tasks")
    band: tuple[float, float] = Field((0.0, 1.0), description="keep tasks whose mean reward is strictly inside")
    generations: int = Field(1, ge=0, description="evolution rounds after the seed round")
    select: int = Field(2, ge=1, description="tasks evolved per round: the in-band ones with the highest reward variance")
    temperature: float = Field(1.0, description="sampling temperature of the attempts (every step)")
    evolve_temperature: float = Field(0.7, ge=0, description="sampling temperature of the task writer")
    teacher: RoleModel = Field(default_factory=RoleModel,
                               description="the model that writes the evolved tasks; default: the judge model")
    max_solution_chars: int = Field(4000, ge=200, description="the seed's solved transcript shown to the writer")
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits, description="limits of a code check's verifier")
    solved_by: Literal["agent", "writer"] = Field(
        "agent", description="agent: a variant is kept only if an attempt of the acting agent, given the instruction, "
                             "meets its check (DreamGym); writer: the writer's own solution replayed is enough")

    @model_validator(mode="after")
    def _code_needs_a_state(self) -> CurriculumConfig:
        from envs.registry import env_class

        if self.verify == "code" and "state" not in env_class(self.env).offers(self.env_config):
            raise ValueError(f"curriculum with verify: code needs a state a verifier can read (state()); "
                             f"environment {self.env!r} does not offer it")
        return self


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


@dataclass
class Check:
    """One case of an evolution check: the steps it took, whether the task counted it solved, and why."""

    case: str
    steps: list[Step]
    passed: bool
    reason: str
    refused: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"case": self.case, "passed": self.passed, "reason": self.reason,
                **({"refused": self.refused} if self.refused else {})}


def _actions(calls: Iterable[ToolCall], final_answer: str = "") -> list[Action]:
    out: list[Action] = [ApiAction(function=c.name, arguments=c.arguments) for c in calls]
    if final_answer.strip():
        out.append(MessageAction(content=final_answer.strip()))
    return out


def _criteria(goal: dict[str, Any]) -> dict[str, Any]:
    """A seed's reference actions and what the user must hear, in tau2's shape."""
    actions = [{"name": a.get("function") or a.get("name"), "arguments": a.get("arguments") or {}}
               for a in goal.get("actions") or []]
    return {"actions": actions, "communicate_info": [str(x) for x in goal.get("communicate_info") or
                                                     goal.get("outputs") or []]}


def _checked(goal: dict[str, Any]) -> Any:
    """What a goal checks, comparable across the retail world's and tau2's spelling of criteria."""
    return _criteria(goal) if set(goal) <= TAU2_STYLE else goal


def _scenario(seed: dict[str, Any], request: str) -> dict[str, Any]:
    """A simulated user's brief (tau2's `user_scenario`) for the new request: the same person, knowing what they
    knew (`known_info`), now calling about the new task; the seed's other instructions belong to the seed."""
    instructions = seed.get("instructions")
    known = instructions.get("known_info") if isinstance(instructions, dict) else None
    brief = {"reason_for_call": request, "task_instructions": request, **({"known_info": known} if known else {})}
    if isinstance(instructions, dict) and instructions.get("domain"):
        brief["domain"] = instructions["domain"]
    return {**seed, "instructions": brief}


@register_method
class Curriculum(EnvMethod):
    """DreamGym / AgentGen: roll out tasks, evolve the highest-variance ones easier / harder, keep those checkable and in band."""

    name = "curriculum"
    Config = CurriculumConfig
    uses_reference_solutions = True  # the writer is shown each seed's reference solution, replayed
    templates = (EVOLVE_SYSTEM, *DIRECTIONS.values(), *CHECKS.values(), EVOLVE_USER)
    config: CurriculumConfig
    roles = (Role("task writer", "evolves the selected tasks easier and harder", ("teacher", "judge")),)

    def __init__(self, config: CurriculumConfig, llm: Any):
        super().__init__(config, llm)
        self.tracker = RewardTracker(config.band)

    def seed_tasks(self) -> dict[str, Task]:
        return self.env_tasks()

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
            if not chosen:
                low, high = self.config.band
                summary.report[f"generation {generation}"] = (
                    f"nothing evolved: none of the {len(specs)} task(s) of the last round had a mean reward strictly "
                    f"inside the band ({low:g}, {high:g}): each was solved in every rollout or in none (more rollouts, "
                    "a wider band, or a model that solves some tasks)")
            specs = [TaskSpec(id=f"{parent}/{direction}", instruction=known[parent].instruction,
                              payload={"parent": parent, "task": known[parent].model_dump(mode="json"),
                                       "direction": direction, "generation": generation,
                                       "parent_mean": self.tracker.mean(parent)})
                     for parent in chosen for direction in ("easier", "harder")]
            if not specs:
                break
            summary = summary.merge(await super().run(specs, output, progress=progress))
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

    # ---- rollouts -------------------------------------------------------------------------------
    async def attempt(self, task: Task, key: str, generation: int, parent: str | None,
                      **details: Any) -> list[Trajectory]:
        """`rollouts` independent attempts at `task`, tagged with the method task id `key` and the task's statistics.

        Attempt k is draw k of the agent: every step sampled at `temperature` with the seed `seed + k`, so no
        attempt is answered from another's cache entry or in-flight call (a sampled first action continued
        greedily would repeat the other attempts wherever the first actions agree, and show no variance)."""
        episodes = await asyncio.gather(*(self._rollout(task, k) for k in range(self.config.rollouts)))
        rewards = [ev.reward if ev is not None else 0.0 for _, ev in episodes]
        stats = RewardTracker.of(self.config.band, key, rewards)
        seeds = [self.config.seed + k for k in range(self.config.rollouts)]
        info = {"task_id": key, "generation": generation, "parent": parent, "mean_reward": stats.mean(key),
                "variance": stats.variance(key), "in_band": stats.in_band(key),
                "samples": [{"seed": s, "reward": r} for s, r in zip(seeds, rewards)]}
        out = []
        for i, (episode, evaluation) in enumerate(episodes):
            traj = self.trajectory(task, "", episode.steps, evaluation, parents=[parent] if parent else [],
                                   curriculum=info, sample=i, **episode.details(), **details)
            out.append(traj.model_copy(update={"id": f"{self.name}/{key}/g{generation}/r{i}"}))
        return out

    async def _rollout(self, task: Task, k: int) -> tuple[Episode, Evaluation | None]:
        """Draw k: one episode of `task` and its outcome."""
        if k > 0:  # a simulated world or user sees the draw too, so its answers are its own as well
            task = task.model_copy(update={"params": {**task.params, "sample": k}})
        async with self.make_env() as env:
            episode = await play_episode(env, self.policy(self.config.temperature, draw=k), task,
                                         max_steps=self.config.max_steps,
                                         max_parse_failures=self.config.max_parse_failures, evaluate=False)
            return episode, await self.outcome(env, task)

    async def outcome(self, env: Environment, task: Task) -> Evaluation:
        """The episode's outcome: the task's sandboxed verifier on the world's state, else the world's evaluation."""
        code = task.goal.get("verifier")
        if code is None:
            return await env.evaluate()
        verdict = await asyncio.to_thread(run_verifier, code, env_state(env), self.config.sandbox)
        reason = verdict.error or f"verify(state) returned {verdict.value}"
        return Evaluation(1.0 if verdict.passed else 0.0, verdict.passed, reason, {"verifier": verdict.model_dump()})

    # ---- evolution ------------------------------------------------------------------------------
    def mode(self, seed: Task) -> Mode:
        if self.config.verify != "auto":
            return self.config.verify
        if isinstance(seed.goal.get("actions"), list) and set(seed.goal) <= TAU2_STYLE:
            return "criteria"
        return "code" if "state" in self.envs.cls.offers(self.config.env_config) else "reward"

    async def _solved_transcript(self, seed: Task) -> tuple[str, Any]:
        """The seed's reference solution replayed in the world (text for the writer), and the world's state before it."""
        async with self.make_env() as env:
            # First: a world may find its reference by solving an episode of its own (a browser's solver).
            actions = await env.reference_solution(seed)
            await env.reset(seed)
            state = env_state(env) if callable(getattr(env, "state", None)) else None
            if not actions:
                return "(no reference solution is known)", state
            steps = list(env.history)
            for action in actions:
                if env.done:
                    break
                a, obs, _ = await act(env, action, len(steps))
                steps += [a, obs]
        text = step_judge.numbered_path(steps)
        limit = self.config.max_solution_chars
        return (text if len(text) <= limit else text[:limit] + " [...]"), state

    async def evolve(self, seed: Task, direction: str, rate: float, mode: Mode) -> _Variant | None:
        solution, state = await self._solved_transcript(seed)
        if mode == "criteria":
            spec = f"Seed criteria (tau2-style):\n{json.dumps(_criteria(seed.goal))}"
        elif mode == "code":
            spec = f"State shape:\n{_state_shape(state)}"
        else:
            spec = f"Seed goal (the environment's own check):\n{json.dumps(seed.goal, default=str)}"
        system = EVOLVE_SYSTEM.format(rule=DIRECTIONS[direction], check=CHECKS[mode],
                                      policy=self._policy_text or "(no rules given)", tools=tools_block(self.tools))
        user = EVOLVE_USER.format(direction=direction, instruction=seed.instruction, rate=rate, spec=spec,
                                  solution=solution)
        writer = self.model_for("task writer")
        return await writer.structured([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                       SCHEMAS[mode], temperature=self.config.evolve_temperature)

    def variant_task(self, seed: Task, spec: TaskSpec, answer: _Variant, mode: Mode) -> tuple[Task, list[Action] | None]:
        """The new task (its goal per mode) and the solution to check it with (None: the env's reference solution)."""
        solution: list[Action] | None = None
        if isinstance(answer, CriteriaVariant):
            goal: dict[str, Any] = {"actions": [c.model_dump() for c in answer.actions],
                                    "communicate_info": answer.communicate_info}
        elif isinstance(answer, CodeVariant):
            goal = {"verifier": answer.verifier}
            solution = _actions(answer.solution, answer.final_answer)
        else:
            assert isinstance(answer, GoalVariant)
            goal = answer.goal
            solution = _actions(answer.solution, answer.final_answer)
        metadata = {**seed.metadata, "evolved_from": seed.id, "direction": spec.payload["direction"],
                    "generation": spec.payload["generation"], "verify": mode}
        if isinstance(seed.metadata.get("user_scenario"), dict):
            metadata["user_scenario"] = _scenario(seed.metadata["user_scenario"], answer.instruction.strip())
        if solution is not None:
            metadata["solution"] = [s.model_dump(mode="json", exclude_defaults=True) for s in solution]
        task = seed.model_copy(update={"id": spec.id, "instruction": answer.instruction.strip(), "goal": goal,
                                       "metadata": metadata})
        return task, solution

    async def run_check(self, task: Task, case: str, actions: list[Action]) -> Check:
        """Run `actions` in a fresh episode of `task`; whether the outcome counts as solved, and why."""
        async with self.make_env() as env:
            steps = list(await env.reset(task))
            refused = []
            for n, action in enumerate(actions, 1):
                if env.done:
                    break
                a, obs, result = await act(env, action, len(steps))
                steps += [a, obs]
                if result.info.get("error"):
                    refused.append(f"action {n} ({getattr(action, 'function', 'message')}): {result.info['error']}")
            outcome = await self.outcome(env, task)
        return Check(case, steps, outcome.success, outcome.reason, refused)

    async def check(self, task: Task, seed: Task, solution: list[Action] | None,
                    answer: _Variant) -> tuple[str | None, list[Check]]:
        """(why the variant is not verifiable, or None; the checks run). It must check something else than the
        seed, its solution must pass, doing nothing and every wrong solution must fail."""
        if _checked(task.goal) == _checked(seed.goal):
            return "the new task checks exactly what the seed checks: it is not a new task", []
        if solution is None:
            async with self.make_env() as env:
                solution = await env.reference_solution(task)
            if not solution:
                return "the environment knows no reference solution for the task", []
        checks = [await self.run_check(task, "solution", solution)]
        if checks[0].refused:
            return f"solution {checks[0].refused[0]} was refused", checks
        if not checks[0].passed:
            return f"the solution does not pass: {checks[0].reason}", checks
        checks.append(await self.run_check(task, "do-nothing", []))
        if checks[-1].passed:
            return f"a do-nothing agent passes: {checks[-1].reason}", checks
        for k, wrong in enumerate(answer.wrong_solutions, 1):
            checks.append(await self.run_check(task, f"wrong solution {k}", _actions(wrong)))
            if checks[-1].passed:
                return f"wrong solution {k} passes: {checks[-1].reason}", checks
        return None, checks

    # ---- one method task --------------------------------------------------------------------------
    async def run_task(self, spec: TaskSpec) -> TaskResult:
        result = TaskResult()
        p = spec.payload
        if "parent" not in p:  # a seed: its rollouts are always written, with their band flag
            trajs = await self.attempt(self.seed_tasks()[spec.id], spec.id, 0, None)
            result.counts["curriculum_in_band" if trajs and trajs[0].details["curriculum"]["in_band"]
                          else "curriculum_out_of_band"] += 1
            result.trajectories.extend(trajs)
            return result
        seed = Task.model_validate(p["task"])
        mode = self.mode(seed)
        answer = await self.evolve(seed, p["direction"], p["parent_mean"], mode)
        if answer is None:
            result.counts["evolve_failed"] += 1
            result.reject(self._stub(seed, spec, [], {"mode": mode, "checks": []}), "evolution_check",
                          "no valid evolved task from the model")
            return result
        task, solution = self.variant_task(seed, spec, answer, mode)
        why, checks = await self.check(task, seed, solution, answer)
        evolution = {"mode": mode, "solved_by": self.config.solved_by, "checks": [c.as_dict() for c in checks],
                     "reason": why or "; ".join(f"{c.case}: {'passes' if c.passed else 'fails'} ({c.reason})"
                                                for c in checks)}
        if why is not None:
            result.counts[f"evolve_rejected_{p['direction']}"] += 1
            result.reject(self._stub(task, spec, checks[0].steps if checks else [], evolution), "evolution_check", why)
            return result
        result.counts[f"evolved_{p['direction']}"] += 1
        trajs = await self.attempt(task, spec.id, p["generation"], p["parent"], evolution=evolution)
        if self.config.solved_by == "agent":
            solved = [t.details["sample"] for t in trajs if t.success]
            agent_check = {"case": "agent attempts", "passed": bool(solved),
                           "reason": f"{len(solved)} of {len(trajs)} attempt(s) of the agent met the task's check"}
            for t in trajs:
                t.details["evolution"] = {**evolution, "checks": [*evolution["checks"], agent_check]}
            if not solved:
                result.counts[f"evolve_unsolved_{p['direction']}"] += 1
                for t in trajs:
                    result.reject(t, "evolution_check", "no attempt of the agent met the task's check: the instruction "
                                                        "is not shown to ask for what the check checks")
                return result
        in_band = bool(trajs) and trajs[0].details["curriculum"]["in_band"]
        result.counts["curriculum_in_band" if in_band else "curriculum_out_of_band"] += 1
        if in_band:
            result.trajectories.extend(trajs)
        else:
            for t in trajs:
                result.reject(t, "curriculum_band", f"out of band: mean reward {t.details['curriculum']['mean_reward']:.2f}")
        return result

    def _stub(self, task: Task, spec: TaskSpec, steps: list[Step], evolution: dict[str, Any]) -> Trajectory:
        """The record of a variant that was not kept: its task, the solution's steps and the checks' verdicts."""
        shown = steps or [TextObservation(content=task.instruction, source="user")]
        traj = self.trajectory(task, "", shown, None, parents=[spec.payload["parent"]], evolution=evolution,
                               **self.scripted(shown, "the evolved task's solution, run by the evolution check"))
        return traj.model_copy(update={"id": f"{self.name}/{spec.id}/g{spec.payload['generation']}/check"})

