"""Reflection with masked errors (STeP / AgentRefine): repair a failed trajectory after its first error.

For each failed input trajectory (success false, with its environment task in `details["task"]`)
the first error is located from its step labels (`locator: labels`, falling back to the rules),
the retail/tool rules (`rules`) or the LLM verifier (`llm`). The corrected trajectory is: the
steps before the error (trained), the erroneous action and its observation (train = false: kept
as context, never trained), a reflection step (an assistant thought, a `MessageAction` tagged
`extra["kind"] = "revision"`), and a new continuation: a fresh environment of the same task
replays the trained actions before the error (so the state is the one before it), and the greedy
agent continues with the reflection in its history. Kept only if the continuation succeeds;
otherwise rejected with the reason.
"""

from __future__ import annotations

from typing import Any, Iterable, Literal

from pydantic import Field

from envs.base import ACTION_KINDS
from filters import step_judge, step_rules
from generators._episode import continue_episode, renumber_calls
from generators.base import TaskResult, TaskSpec
from generators.env_method import EnvMethod, EnvMethodConfig
from generators.registry import register_method
from schemas.models import MessageAction, Trajectory
from schemas.store import Dataset

REFLECTION = "I made a mistake in my last step: {reason} Let me reconsider and correct it."


class ReflectionConfig(EnvMethodConfig):
    method: Literal["reflection"] = "reflection"
    input: str = Field(description="dataset directory with failed trajectories (details.task set)")
    locator: Literal["labels", "rules", "llm"] = "labels"
    reflection_template: str = REFLECTION


@register_method
class Reflection(EnvMethod):
    """STeP / AgentRefine: failed trajectory -> masked error + reflection + corrected continuation."""

    name = "reflection"
    Config = ReflectionConfig
    templates = (REFLECTION, *step_judge.TEMPLATES)
    config: ReflectionConfig
    uses_task_source = False

    def __init__(self, config: ReflectionConfig, llm: Any):
        super().__init__(config, llm)
        self._input: dict[str, Trajectory] | None = None

    def inputs(self) -> dict[str, Trajectory]:
        if self._input is None:
            self._input = {t.id: t for t in Dataset.open(self.config.input).iter_records()
                           if not t.success and (task := step_rules.task_of(t)) is not None
                           and task.env == self.config.env}
        return self._input

    def tasks(self) -> Iterable[TaskSpec]:
        for tid in sorted(self.inputs()):
            yield TaskSpec(id=tid)

    async def first_error(self, traj: Trajectory) -> tuple[int | None, str]:
        if self.config.locator == "labels":
            bad = next((i for i, s in enumerate(traj.steps) if s.kind in ACTION_KINDS and s.train and s.label == "bad"), None)
            if bad is not None:
                return bad, str(traj.steps[bad].extra.get("judge_reason", "the step was judged bad"))
        if self.config.locator == "llm":
            return await step_judge.locate_first_error(self.judge_llm, traj.steps)
        labels = await step_rules.rule_labels(traj)
        index = step_rules.first_bad(labels)
        return index, labels[index].reason if index is not None else "no rule flags a step"

    async def run_task(self, task: TaskSpec) -> TaskResult:
        traj = self.inputs()[task.id]
        env_task = step_rules.task_of(traj)
        assert env_task is not None
        result = TaskResult()
        error, reason = await self.first_error(traj)
        if error is None:
            result.reject(traj, "first_error", f"not located: {reason}")
            return result
        end = error + 1 if error + 1 < len(traj.steps) and traj.steps[error + 1].kind not in ACTION_KINDS else error
        prefix = list(traj.steps[:error])
        masked = [s.model_copy(update={"train": False}) for s in traj.steps[error:end + 1]]
        reason = reason.strip().rstrip(".") + "."
        thought = MessageAction(content=self.config.reflection_template.format(reason=reason), extra={"kind": "revision"})
        history = prefix + masked + [thought]
        async with self.make_env() as env:
            await env.replay(env_task, prefix)  # back to the state before the error
            episode = await continue_episode(env, self.policy(0.0), history, max_steps=self.config.max_steps,
                                             actions_taken=sum(1 for s in prefix if s.kind in ACTION_KINDS) + 1,
                                             max_parse_failures=self.config.max_parse_failures)
            result.counts["replays"] += env.replays
        steps, outcome = episode.steps[len(history):], episode.reward
        tools = self.tools
        fixed = Trajectory(
            id=f"{self.name}/{traj.id}", source=self.name, steps=renumber_calls(history + steps), tools=tools,
            reward=outcome, success=outcome >= 1.0, provenance=self.provenance(task.id, parents=[traj.id], seed=env_task.seed),
            details={"role": "reflection", "task": env_task.model_dump(mode="json"), "env": env_task.env,
                     "env_config": step_rules.env_config_of(traj),
                     "reflection": {"first_error": error, "reason": reason, "masked": list(range(error, end + 1)),
                                    "reflection_index": end + 1}},
        )
        if outcome < 1.0:
            result.reject(fixed, "outcome", f"still failed: the corrected continuation got reward {outcome}")
            return result
        result.trajectories.append(fixed)
        return result
