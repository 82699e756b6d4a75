"""Reflection with masked errors (STeP / AgentRefine): a teacher corrects a failed trajectory step by step.

STeP has a teacher watch the agent act: at each step the teacher judges the agent's action;
when it is wrong, the teacher writes a reflection and the corrected action, and the episode goes
on from the corrected state; in training, the wrong steps stay as context with their loss masked
(partial masking). Here, for each failed input trajectory (success false, with its environment
task in `details["task"]`):

1. **walk** — a fresh episode of the task replays the recorded actions one by one; the teacher
   (`teacher.llm`, default the judge model) reviews each action with what the world answered.
2. **correct** — at the first action the teacher calls wrong, the trajectory records the wrong action
   (train = false, label bad, the teacher's reason in `extra["teacher_reason"]`) and what the world answered,
   as STeP keeps it (`wrong_steps: carried_out`, the default): the real observation, the world going on from
   the state the wrong action left (the action marked `extra["masked"] = "context"`: replays take it). Where the
   wrong action ended the episode (the user left, a terminal tool) nothing can follow it, so the world is put back
   to the state before it (snapshot restore, or a replay of the history) and it is answered by a neutral
   observation (`NEUTRAL`, `extra["undone"]`), counted (`undone_ended_episode`); `wrong_steps: undone` does this
   for every wrong step. Either way the context holds no verdict: the agent never hears at inference that a
   step was wrong. The real observation of an undone action is kept for audit in the correction's
   `undone_observation` only. Then the teacher's reflection (an assistant thought, a `MessageAction`
   tagged `extra["kind"] = "revision"`), and the teacher's corrected action, taken in the world.
3. **continue** — the greedy agent goes on from there, still under review: each later wrong step
   is corrected the same way, up to `max_corrections`; after that the agent continues alone.

The teacher sees what the conversation has revealed, as the agent does: the user's request as the user made it
(never the task's hidden instruction, such as a simulated user's script), the rules, the tools and the history.

The corrected trajectory opens with the failed one's system step (the prompt its replayed actions
answered; the agent continues under it) and declares in `details["rewrites"]` what the agent's
requests did not produce as recorded: the teacher's reflections and corrected actions (written),
and any replayed action whose history differs from the one it answered (context).

The corrected trajectory is kept only if the environment's evaluation at its end is a success;
otherwise it is filtered with the reason ("still failed ...", "the teacher found no wrong step
...", "the teacher's correction ... was refused ..."). Every teacher verdict (correct or wrong)
is recorded with its reason in `details["reflection"]["verdicts"]`.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any, Iterable, Literal

from pydantic import BaseModel, Field, model_validator

from backends.base import LLM
from converters.export.request import request_for
from envs.base import (ACTION_KINDS, MASKED_CONTEXT, Checkpoint, Environment, Task, is_revision, restore, transitions,
                       undone)
from filters import step_judge, step_rules
from generators._episode import Correction, act, continue_episode, renumber_calls
from generators.agent import AgentPolicy, Proposal
from generators.base import Role, RoleModel, TaskResult, TaskSpec
from generators.env_method import EnvMethod, EnvMethodConfig
from generators.registry import register_method
from generators.transcript import tools_block
from schemas.models import (Action, ApiAction, MessageAction, RenderSettings, Rewrite, Step, TextObservation,
                            Trajectory, is_system_step)
from schemas.store import Dataset

REVIEW_SYSTEM = (
    "You are a teacher supervising an AI agent that serves a user with tools. You see the rules the agent "
    "must follow, its tools, the conversation so far and the agent's latest step with what it produced. "
    "Decide whether that step is correct. A step is wrong when it breaks a rule, calls the wrong tool or "
    "uses wrong arguments, acts on facts it has not checked, repeats itself without progress, or ends the "
    "conversation before the user's request is done.\n"
    "If the step is wrong, write (1) a reflection in the agent's own voice (first person, one or two "
    "sentences) that notices the mistake and says what to do instead, and (2) the corrected action: the "
    "single step the agent should take instead, either a tool call {\"tool\": name, \"arguments\": {...}} or "
    "a message to the user {\"message\": text}.\n"
    "Answer with JSON: {\"verdict\": \"correct\" | \"wrong\", \"reason\": str, \"reflection\": str, "
    "\"action\": {...} | null}; for a correct step leave the reflection empty and the action null."
    "\n\n# Rules\n{policy}\n\n# Tools (JSON, one per line)\n{tools}"
)
REVIEW_USER = (
    "REVIEW THE AGENT'S STEP\nTask: {task}\n\nConversation so far (agent steps are numbered):\n{history}\n\n"
    "The step to review:\n{step}\n\nWhat it produced:\n{observation}"
)


# What answers an undone wrong action in the record: nothing of it holds, and no verdict is said.
NEUTRAL = "(no answer)"


def undone_observation(observation: Step) -> TextObservation:
    """The neutral observation that replaces an undone action's (same speaker and call id)."""
    source = getattr(observation, "source", "environment")
    return TextObservation(content=NEUTRAL, source=source if source in ("user", "environment") else "environment",
                           name=getattr(observation, "name", None), tool_call_id=observation.tool_call_id,
                           train=False, extra={"undone": True})


class CorrectedAction(BaseModel):
    """The one step the agent should take instead: a tool call, or a message to the user."""

    tool: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    message: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> CorrectedAction:
        if (self.tool is None) == (self.message is None):
            raise ValueError("give either a tool call (tool, arguments) or a message, not both or neither")
        return self

    def action(self) -> Action:
        if self.tool is not None:
            return ApiAction(function=self.tool, arguments=self.arguments)
        return MessageAction(content=str(self.message))


class TeacherVerdict(BaseModel):
    """The teacher's review of one step."""

    verdict: Literal["correct", "wrong"]
    reason: str = Field(min_length=1)
    reflection: str = ""
    action: CorrectedAction | None = None

    @model_validator(mode="after")
    def _wrong_needs_a_fix(self) -> TeacherVerdict:
        if self.verdict == "wrong" and (not self.reflection.strip() or self.action is None):
            raise ValueError("a wrong step needs a reflection and the corrected action")
        return self


class ReflectionConfig(EnvMethodConfig):
    method: Literal["reflection"] = "reflection"
    input: str = Field(description="dataset directory with failed trajectories (details.task set)")
    teacher: RoleModel = Field(default_factory=RoleModel,
                               description="the model that reviews and corrects; default: the judge model")
    max_corrections: int = Field(3, ge=1, description="wrong steps corrected per trajectory; after that the agent "
                                                      "continues unreviewed")
    max_history_chars: int = Field(12_000, ge=500, description="conversation shown to the teacher (head and tail)")
    wrong_steps: Literal["carried_out", "undone"] = Field(
        "carried_out", description="carried_out (STeP): a wrong step keeps its real observation and the world goes on "
                                   "from it (undone where it ended the episode); undone: the world is put back before "
                                   "it and a neutral observation answers it")


class ReplayThenAgent:
    """Proposes the recorded actions in order; after the first correction, or when they run out, the agent acts.

    Histories open with the recorded trajectory's system step where it has one (the prompt its
    actions answered), else the agent's; `replayed` pairs each replayed action's step index with
    its index in the recording."""

    def __init__(self, recording: Trajectory, agent: AgentPolicy) -> None:
        steps = recording.steps
        self.recorded = deque(i for i, s in enumerate(steps) if s.kind in ACTION_KINDS and not undone(s)
                              and not is_revision(s))  # the moves `transitions` replays
        self.steps = steps
        self.opening = steps[0] if steps and is_system_step(steps[0]) else None
        self.agent = agent
        self.deviated = False
        self.source = "recorded"
        self.replayed: list[tuple[int, int]] = []

    def system_step(self, guidance: str | None = None) -> TextObservation:
        if self.opening is not None and guidance is None:
            return self.opening  # type: ignore[return-value]
        return self.agent.system_step(guidance)

    async def propose(self, history: list[Step], *, n: int = 1) -> list[Proposal]:
        if self.recorded and not self.deviated:
            self.source = "recorded"
            index = self.recorded.popleft()
            self.replayed.append((len(history), index))
            action = self.steps[index]
            return [Proposal(action.model_copy(update={"tool_call_id": None, "label": "unknown"}), "")]
        self.source = "agent"
        return await self.agent.propose(history, n=n)


class TeacherReview:
    """The reviewer of one episode: asks the teacher about every step, corrects wrong ones up to a cap."""

    def __init__(self, method: Reflection, task: Task, proposer: ReplayThenAgent) -> None:
        self.method = method
        self.task = task
        self.proposer = proposer
        self.verdicts: list[dict[str, Any]] = []
        self.corrections: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()

    async def __call__(self, env: Environment, before: Checkpoint, history: list[Step], action: Action,
                       observation: Step) -> Correction | None:
        if len(self.corrections) >= self.method.config.max_corrections:
            return None
        index = len(history)
        verdict = await self.method.review(self.task, history, action, observation)
        self.counts["teacher_reviews"] += 1
        if verdict is None:
            self.counts["teacher_no_answer"] += 1
            self.verdicts.append({"step": index, "verdict": None, "reason": "the teacher gave no valid answer"})
            return None
        self.verdicts.append({"step": index, "verdict": verdict.verdict, "reason": verdict.reason,
                              "source": self.proposer.source})
        if verdict.verdict == "correct":
            return None
        assert verdict.action is not None
        self.counts["corrections"] += 1
        self.proposer.deviated = True
        marked = {**action.extra, "teacher_reason": verdict.reason}
        carried = self.method.config.wrong_steps == "carried_out" and not env.done
        if carried:  # STeP: the wrong step and what the world answered stay, masked; the world goes on from it
            wrong = [action.model_copy(update={"train": False, "label": "bad",
                                               "extra": {**marked, "masked": MASKED_CONTEXT}}), observation]
        else:  # the corrected action is taken where the wrong one was
            if self.method.config.wrong_steps == "carried_out":
                self.counts["undone_ended_episode"] += 1
            await restore(env, before)
            wrong = [action.model_copy(update={"train": False, "label": "bad", "extra": marked}),
                     undone_observation(observation)]
        reflection = MessageAction(content=verdict.reflection.strip(), extra={"kind": "revision"})
        fixed, fixed_observation, result = await act(env, verdict.action.action(), index + 3)
        self.corrections.append({"wrong_step": index, "reason": verdict.reason, "source": self.proposer.source,
                                 "reflection_step": index + 2, "corrected_step": index + 3,
                                 "wrong_step_kept": "carried_out" if carried else "undone",
                                 **({} if carried else {"undone_observation": step_judge.describe(observation)}),
                                 **({"refused": str(result.info["error"])} if result.info.get("error") else {})})
        return Correction([*wrong, reflection, fixed, fixed_observation], result)


@register_method
class Reflection(EnvMethod):
    """STeP / AgentRefine: a teacher reviews a failed trajectory's steps; wrong ones are masked, reflected on and corrected."""

    name = "reflection"
    Config = ReflectionConfig
    templates = (REVIEW_SYSTEM, REVIEW_USER)
    config: ReflectionConfig
    uses_task_source = False

    roles = (Role("teacher", "reviews each step and corrects the wrong ones", ("teacher", "judge")),)

    def __init__(self, config: ReflectionConfig, llm: Any):
        super().__init__(config, llm)
        self._input: dict[str, Trajectory] | None = None

    @property
    def teacher(self) -> LLM:
        """The teacher: its own model, else the judge model (the acting model itself, warned, when neither is set)."""
        return self.model_for("teacher")

    def teacher_name(self) -> str:
        return self.model_name_for("teacher")

    def inputs(self) -> dict[str, Trajectory]:
        if self._input is None:
            self._input = {t.id: t for t in Dataset.open(self.config.input).iter_records()
                           if not t.success and (task := step_rules.task_of(t)) is not None
                           and task.env == self.config.env}
        return self._input

    def tasks(self) -> Iterable[TaskSpec]:
        for tid in sorted(self.inputs()):
            yield TaskSpec(id=tid)

    # ---- the teacher ----------------------------------------------------------------------------

    async def review(self, task: Task, history: list[Step], action: Action, observation: Step) -> TeacherVerdict | None:
        shown = step_judge.numbered_path(history)
        limit = self.config.max_history_chars
        if len(shown) > limit:
            shown = f"{shown[: limit // 4]}\n[...]\n{shown[-(limit - limit // 4):]}"
        system = REVIEW_SYSTEM.replace("{policy}", self._policy_text or "(no rules given)").replace(
            "{tools}", tools_block(self.tools))
        # The request as the conversation made it, never the task's hidden instruction (a simulated user's script).
        user = REVIEW_USER.format(task=step_judge.task_text(history) or "(no request yet)", history=shown,
                                  step=f"[{len(history)}] AGENT: {step_judge.describe(action)}",
                                  observation=f"    SEEN: {step_judge.describe(observation)}")
        return await self.teacher.structured([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                             TeacherVerdict, temperature=0.0)

    # ---- one failed trajectory --------------------------------------------------------------------

    def _rewrites(self, recording: Trajectory, steps: list[Step], proposer: ReplayThenAgent,
                  reviewer: TeacherReview) -> list[dict[str, Any]]:
        """What no request of the agent produced as recorded: the teacher's reflections and corrected actions
        (written), and replayed actions whose history here differs from the one they answered (context)."""
        out = []
        written = [i for c in reviewer.corrections for i in (c["reflection_step"], c["corrected_step"])]
        if written:
            out.append(Rewrite(steps=written, kind="written", reason="the teacher's reflection and corrected "
                                                                     "action").model_dump())
        ours, theirs = self.render_settings(), RenderSettings.of(recording.details) or self.render_settings()
        moved = [new for new, old in proposer.replayed
                 if steps[new].train and request_for(steps[:new], ours) != request_for(recording.steps[:old], theirs)]
        if moved:
            out.append(Rewrite(steps=moved, kind="context",
                               reason=f"replayed from {recording.id}, whose history before them differs").model_dump())
        return out

    async def run_task(self, spec: TaskSpec) -> TaskResult:
        traj = self.inputs()[spec.id]
        task = step_rules.task_of(traj)
        assert task is not None
        result = TaskResult()
        proposer = ReplayThenAgent(traj, self.policy(0.0))
        reviewer = TeacherReview(self, task, proposer)
        async with self.make_env() as env:
            await env.reset(task)
            episode = await continue_episode(env, proposer, env.history, max_steps=self.config.max_steps,
                                             max_parse_failures=self.config.max_parse_failures, reviewer=reviewer)
            result.counts["replays"] += env.replays
        result.counts.update(reviewer.counts)
        steps = renumber_calls(episode.steps)
        rewritten = self._rewrites(traj, steps, proposer, reviewer)
        masked = [i for i, s in enumerate(steps) if not s.train and "parse_error" not in s.extra
                  and not (s.kind == "text" and s.name == "parse_error") and not is_system_step(s)]
        info = {"teacher": self.teacher_name(), "corrections": reviewer.corrections, "masked": masked,
                "verdicts": reviewer.verdicts, "recorded_actions": len(transitions(traj.steps))}
        if reviewer.corrections:  # the first error at the top level too, as the viewer shows it
            first = reviewer.corrections[0]
            info.update(first_error=first["wrong_step"], reflection_index=first["reflection_step"],
                        reason=first["reason"])
        fixed = self.trajectory(task, "", steps, episode.evaluation, parents=[traj.id], role="reflection",
                                reflection=info, rewrites=rewritten, **episode.details())
        fixed = fixed.model_copy(update={"id": f"{self.name}/{traj.id}"})
        refused = next((c for c in reviewer.corrections if "refused" in c), None)
        evaluation = episode.evaluation
        assert evaluation is not None
        if not reviewer.corrections:
            last = reviewer.verdicts[-1]["reason"] if reviewer.verdicts else "no step was reviewed"
            result.reject(fixed, "teacher", f"the teacher found no wrong step (last verdict: {last}); "
                                            f"outcome: {evaluation.reason}")
        elif refused is not None:
            result.reject(fixed, "teacher", f"the teacher's correction at step {refused['corrected_step']} was refused: "
                                            f"{refused['refused']}")
        elif not evaluation.success:
            result.reject(fixed, "outcome", f"still failed after {len(reviewer.corrections)} correction(s): "
                                            f"reward {evaluation.reward}: {evaluation.reason}")
        else:
            result.trajectories.append(fixed)
        result.counts["kept" if result.trajectories else "rejected"] += 1
        return result

