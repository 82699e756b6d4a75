"""Rollout: an agent model acts in an environment, one ReAct step (thought + action) at a time.

Works in any registered environment: the built-in `retail` (tools + rule-based user) and `web`
shop, or `simulated` (an LLM plays the tools and the user from a tool list and a policy given
in `env_config`). Tasks come from the environment's task generator (`n_tasks`, `task_seed`)
or from a JSONL file of tasks (`tasks_file`).

One method task per (env task, sample): id `<task id>#<k>` for k < `samples_per_task`.
Sample 0 prompts the agent plainly; sample k > 0 adds "(Attempt k+1.)" to the agent's system
prompt (and, in the simulated env, a `sample` task param the simulator sees), so every
sample's calls are distinct cache entries, deterministic, and a resumed run repeats none;
raising `samples_per_task` later reuses the samples already made.

Each trajectory carries the env's reward (`success = reward >= 1`), the env's tools, every
step (the user's first message, actions, observations, follow-up user turns, failed steps)
and provenance (task id, seed = the task's seed, model); `details` holds the env and its
config, the sample index, the stop reason, action errors and parse-failure count.
Unparseable answers are failed steps (see `generators._episode`); after
`max_parse_failures` the episode ends failed. An LLM request failure quarantines the task
(stage "llm"); a simulator without a usable answer quarantines it (stage "simulator").
Failed episodes are kept (`keep_failed`, default) or filtered by "outcome" with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import Field, model_validator

from backends.errors import LLMRequestError
from envs.base import Task
from envs.simulated.env import SimulationError
from generators._episode import EnvMaker, Episode, close_env, load_tasks_file, play_episode
from generators.agent import SYSTEM as AGENT_SYSTEM
from generators.agent import TEXT_FORMAT, TRUNCATED, AgentPolicy
from generators.base import MAX_TASKS, GenerationMethod, MethodConfig, RunSummary, TaskResult, TaskSpec
from generators.registry import register_method
from schemas.models import Trajectory
from schemas.store import Dataset

ATTEMPT = "(Attempt {n}.)"


class RolloutConfig(MethodConfig):
    method: Literal["rollout"] = "rollout"
    env: str = Field("retail", description="environment name (retail, web, simulated, or any registered)")
    env_config: dict[str, Any] = Field(default_factory=dict,
                                       description="keyword arguments of the environment (simulated: tools, policy, ...)")
    tasks_file: str | None = Field(None, description="JSONL of tasks; else the env's task generator is used")
    n_tasks: int = Field(8, ge=1, le=MAX_TASKS, description="tasks from the env's generator")
    task_seed: int = Field(0, description="seed of the env's task generator")
    samples_per_task: int = Field(1, ge=1, description="rollouts per task")
    max_steps: int = Field(20, ge=1, description="agent actions per episode")
    max_parse_failures: int = Field(3, ge=1, description="unreadable answers before the episode ends failed")
    agent_mode: Literal["tools", "text"] = "tools"
    agent_temperature: float | None = None
    keep_failed: bool = Field(True, description="keep unsuccessful rollouts (else filtered by 'outcome')")

    @model_validator(mode="after")
    def _simulated_needs_tools(self) -> RolloutConfig:
        if self.env == "simulated" and not self.env_config.get("tools") and self.env_config.get("mode", "tool") == "tool":
            raise ValueError("env 'simulated' needs env_config.tools (the tool list to simulate)")
        return self


@register_method
class Rollout(GenerationMethod):
    """An agent acts in an environment for each task; trajectories carry the env reward."""

    name = "rollout"
    Config = RolloutConfig
    templates = (AGENT_SYSTEM, TEXT_FORMAT, ATTEMPT)
    config: RolloutConfig

    def __init__(self, config: RolloutConfig, llm: Any):
        super().__init__(config, llm)
        self.make_env = EnvMaker(config.env, config.env_config, llm)

    # ---- tasks --------------------------------------------------------------------------------

    def env_tasks(self) -> list[Task]:
        if self.config.tasks_file:
            return load_tasks_file(self.config.tasks_file, self.config.env)
        with self.make_env() as env:
            return env.generate_tasks(self.config.n_tasks, seed=self.config.task_seed)

    def tasks(self) -> Iterable[TaskSpec]:
        for task in self.env_tasks():
            for k in range(self.config.samples_per_task):
                yield TaskSpec(id=f"{task.id}#{k}", instruction=task.instruction,
                               payload={"task": task.model_dump(mode="json"), "sample": k})

    def prepare(self, output: Dataset) -> None:
        self.make_env.output = Path(output.path)

    async def run(self, tasks: Iterable[TaskSpec], output: Dataset, *, progress: Any = None) -> RunSummary:
        try:
            return await super().run(tasks, output, progress=progress)
        finally:
            await self.make_env.aclose()

    # ---- one rollout --------------------------------------------------------------------------

    async def run_task(self, spec: TaskSpec) -> TaskResult:
        task = Task.model_validate(spec.payload["task"])
        k = int(spec.payload["sample"])
        result = TaskResult()
        if k > 0 and self.config.env == "simulated":
            # The simulator sees the sample index too, so its answers are their own cache entries.
            task = task.model_copy(update={"params": {**task.params, "sample": k}})
        env = self.make_env()
        try:
            policy = AgentPolicy(self.llm, env.tools(), mode=self.config.agent_mode,
                                 temperature=self.config.agent_temperature)
            guidance = ATTEMPT.format(n=k + 1) if k > 0 else None
            episode = await play_episode(env, policy, task, max_steps=self.config.max_steps,
                                         max_parse_failures=self.config.max_parse_failures, guidance=guidance)
            judgement = getattr(env, "judgement", None)
            tools = env.tools()
        except LLMRequestError as exc:
            result.fail(spec.id, "llm", str(exc), {"task": task.id, "sample": k})
            return result
        except SimulationError as exc:
            result.fail(spec.id, "simulator", f"SimulationError: {exc}", {"task": task.id, "sample": k})
            return result
        finally:
            await close_env(env)
        trajectory = self._trajectory(task, k, episode, tools, judgement)
        self._count(result, episode)
        if trajectory.success or self.config.keep_failed:
            result.trajectories.append(trajectory)
        elif episode.failed:
            result.reject(trajectory, "outcome", f"max_parse_failures: {episode.parse_failures} unreadable answers")
        else:
            result.reject(trajectory, "outcome", f"unsuccessful: reward {episode.reward} ({episode.stop_reason})")
        return result

    def _trajectory(self, task: Task, k: int, episode: Episode, tools: list[Any],
                    judgement: dict[str, Any] | None) -> Trajectory:
        reward = float(episode.reward or 0.0)
        details: dict[str, Any] = {
            "env": self.make_env.describe(),
            "task": {"id": task.id, "instruction": task.instruction, "kind": task.metadata.get("kind")},
            "sample": k,
            "stop_reason": episode.stop_reason,
            "actions": episode.actions,
            "parse_failures": episode.parse_failures,
            "action_errors": episode.action_errors,
            **({"truncated": True} if episode.info.get("truncated") else {}),
            **({"judge": judgement} if judgement else {}),
        }
        return Trajectory(
            id=f"{self.name}/{task.id}#{k}",
            source=self.name,
            steps=episode.steps,
            tools=tools,
            reward=reward,
            success=reward >= 1.0,
            provenance=self.provenance(task.id, seed=task.seed).model_copy(update={"source_id": task.id}),
            details=details,
        )

    @staticmethod
    def _count(result: TaskResult, episode: Episode) -> None:
        result.counts["episodes"] += 1
        result.counts["successes"] += int((episode.reward or 0.0) >= 1.0)
        result.counts["parse_failures"] += episode.parse_failures
        for step in episode.steps:  # failed steps by reason: a truncated answer, an unreadable one
            if step.kind == "text" and (error := (step.extra or {}).get("parse_error")):
                result.counts["failed_step:" + ("truncated" if error.startswith(TRUNCATED) else "unreadable")] += 1
        result.counts["action_errors"] += len(episode.action_errors)
        result.counts[f"stop:{episode.stop_reason}"] += 1

