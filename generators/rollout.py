"""Rollout: an agent model acts in an environment, one ReAct step (thought + action) at a time.

Works in any registered environment: the built-in `retail` (tools + rule-based user) and `web`
shop, `simulated` (an LLM plays the tools and the user from a tool list and a policy given in
`env_config`), `mcp` (any MCP server's real tools), or any other. Tasks come from the config's
task source (`tasks:` — the environment's generator, a JSONL file, tau2-bench's tasks.json).

One method task per (env task, sample): id `<task id>#<k>` for k < `samples_per_task`.
Every sample gets the same prompt: nothing in it says which sample it is, since the trained agent
will not be told either. With several samples sample k is draw k (sampling seed `seed + k`; a
simulator sees a `sample` task param), so every sample's calls are distinct cache entries,
deterministic, independent at a temperature above 0, and a resumed run repeats none; raising
`samples_per_task` later reuses the samples already made.

Each trajectory carries the environment's evaluation (`reward`, `success`, and in `details` its
reason and each criterion's verdict), the env's tools, every step (the user's first message,
actions, observations, follow-up user turns, failed steps) and provenance (task id, seed = the
task's seed, model). An LLM request failure quarantines the task (stage "llm"); a simulator or
user model without a usable answer quarantines it (stage "simulator" / "user"); a world that
breaks (a server that dies, a browser that crashes) quarantines it (stage "env") and the run goes
on. Unsuccessful episodes are kept (`keep_failed`, default) or filtered by "outcome".
"""

from __future__ import annotations

from typing import Any, Iterable, Literal

from pydantic import Field

from envs.base import Task
from generators._episode import Episode, play_episode
from generators.agent import SYSTEM as AGENT_SYSTEM
from generators.agent import TEXT_FORMAT
from generators.base import TaskResult, TaskSpec
from generators.env_method import EnvMethod, EnvMethodConfig
from generators.failures import episode_failure
from generators.registry import register_method


class RolloutConfig(EnvMethodConfig):
    method: Literal["rollout"] = "rollout"
    samples_per_task: int = Field(1, ge=1, description="rollouts per task")
    keep_failed: bool = Field(True, description="keep unsuccessful rollouts (else filtered by 'outcome')")


@register_method
class Rollout(EnvMethod):
    """An agent acts in an environment for each task; trajectories carry the env's evaluation."""

    name = "rollout"
    Config = RolloutConfig
    templates = (AGENT_SYSTEM, TEXT_FORMAT)
    config: RolloutConfig

    def tasks(self) -> Iterable[TaskSpec]:
        return [TaskSpec(id=f"{task.id}#{k}", instruction=task.instruction, payload={"task": task.id, "sample": k})
                for task in self.env_tasks().values() for k in range(self.config.samples_per_task)]

    async def run_task(self, spec: TaskSpec) -> TaskResult:
        task = self.env_tasks()[spec.payload["task"]]
        k = int(spec.payload["sample"])
        result = TaskResult()
        if k > 0:
            # A simulated world or user sees the sample index too, so its answers are their own cache entries.
            task = task.model_copy(update={"params": {**task.params, "sample": k}})
        try:
            async with self.make_env() as env:
                # Rejection sampling: sample k is independent draw k (its own sampling seed) at the temperature.
                policy = self.policy(draw=k if self.config.samples_per_task > 1 else None)
                episode = await play_episode(env, policy, task, max_steps=self.config.max_steps,
                                             max_parse_failures=self.config.max_parse_failures)
        except Exception as exc:  # noqa: BLE001 - classified and quarantined; the run goes on
            stage, error = episode_failure(exc)
            result.fail(spec.id, stage, error, {"task": task.id, "sample": k})
            return result
        trajectory = self._trajectory(task, k, episode)
        episode.count(result.counts)
        if trajectory.success or self.config.keep_failed:
            result.trajectories.append(trajectory)
        elif episode.stop_reason == "max_parse_failures":
            result.reject(trajectory, "outcome", f"max_parse_failures: {episode.parse_failures} unusable answers")
        else:
            assert episode.evaluation is not None
            result.reject(trajectory, "outcome", f"unsuccessful: reward {episode.reward:g} ({episode.evaluation.reason})")
        return result

    def _trajectory(self, task: Task, k: int, episode: Episode) -> Any:
        return self.trajectory(task, f"#{k}", episode.steps, episode.evaluation, sample=k, **episode.details())
