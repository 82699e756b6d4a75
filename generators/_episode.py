"""The one episode loop: an agent policy acts in an environment until the episode ends.

Every method acts through it: rollout, tutorial replay, self-challenging rollouts, reflection
continuations, MCTS rollouts, curriculum attempts. `play_episode` starts a fresh episode;
`continue_episode` goes on from wherever the environment is (a restored checkpoint), with the
history that led there. A trajectory always starts with the policy's system step (the system
prompt the model receives, `guidance` included: `opened`), then the user's request. The
environment never sees the system step: it is the agent's, not the world's.

Tool call ids are positional (`call_<step index>`): equal paths have equal content, and a
re-run sends the model byte-identical prompts (cache hits) whatever ids a server invented.

An answer the policy cannot use (unparseable, cut off at the token limit, or a tool call the
server refused) is a *failed step*: the environment never sees it; the trajectory records the
raw answer (an agent text step) and an error observation, both with `train=False` and `label="bad"`, counted by reason,
and the agent tries again with that feedback in its history (which also makes the retry a new
cache entry). After `max_parse_failures` such steps the episode ends. Whatever ended it (done,
the step cap, failures, the user leaving), the environment evaluates the episode the same way.
Every step a model call made carries its usage (tokens, latency, retries, cost). LLM request
errors (`LLMRequestError`: the server unreachable or failing after the retries, never an answer
it gave) and simulator errors propagate: callers quarantine the task, which a re-run retries.

A `reviewer` (a teacher supervising the agent, STeP-style) sees every action the world has just
answered, with a checkpoint of the state before it; it may replace the step with a correction
(the wrong step kept masked, a reflection, the corrected action it took from the restored state),
and the episode goes on from there.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from envs.base import ACTION_KINDS, Checkpoint, Environment, Evaluation, StepResult, Task, checkpoint
from backends.errors import REFUSED
from generators.agent import TRUNCATED, Proposal
from schemas.models import Action, Step, TextObservation, is_system_step

PARSE_ERROR = (
    "Error: your last answer could not be read as an action ({error}). Reply with one short thought and "
    "exactly one tool call, or with your final answer to the user."
)


class Proposer(Protocol):
    """What acts: an agent policy, or anything that proposes next actions the same way."""

    def system_step(self, guidance: str | None = None) -> TextObservation: ...

    async def propose(self, history: list[Step], *, n: int = 1) -> list[Proposal]: ...


def opened(policy: Proposer, history: Sequence[Step], guidance: str | None = None) -> list[Step]:
    """`history` opening with the policy's system step (added when it has none)."""
    steps = list(history)
    if not steps or not is_system_step(steps[0]):
        steps.insert(0, policy.system_step(guidance))
    return steps


@dataclass
class Correction:
    """A reviewer's replacement for a step: the steps to record instead, and the result of the action it took."""

    steps: list[Step]
    result: StepResult


class Reviewer(Protocol):
    """Looks at `action` (step `len(history)`) and its `observation`; returns a Correction or None.

    `before` is a checkpoint of the world before the action: a correction restores it first.
    """

    async def __call__(self, env: Environment, before: Checkpoint, history: list[Step], action: Action,
                       observation: Step) -> Correction | None: ...


@dataclass
class Episode:
    """What one episode produced; `evaluation` is None when the caller asked for none."""

    steps: list[Step]
    evaluation: Evaluation | None
    stop_reason: str  # "done" | "max_steps" | "max_parse_failures" | "ended" (the policy stopped acting)
    actions: int = 0
    parse_failures: int = 0
    failure_reasons: Counter[str] = field(default_factory=Counter)
    action_errors: list[str] = field(default_factory=list)
    truncated: bool = False  # the environment's own step cap ended it

    @property
    def done(self) -> bool:
        return self.stop_reason == "done"

    @property
    def reward(self) -> float:
        return self.evaluation.reward if self.evaluation is not None else 0.0

    @property
    def success(self) -> bool:
        return self.evaluation.success if self.evaluation is not None else False

    def details(self) -> dict[str, Any]:
        """The episode's facts for a trajectory's `details`."""
        out: dict[str, Any] = {"stop_reason": self.stop_reason, "actions": self.actions,
                               "parse_failures": self.parse_failures, "action_errors": self.action_errors}
        if self.failure_reasons:
            out["failed_steps"] = dict(self.failure_reasons)
        if self.truncated:
            out["truncated"] = True
        return out

    def count(self, counts: Counter[str]) -> None:
        """Add this episode to a task's counts."""
        counts["episodes"] += 1
        counts["successes"] += int(self.success)
        counts["parse_failures"] += self.parse_failures
        counts["action_errors"] += len(self.action_errors)
        counts[f"stop:{self.stop_reason}"] += 1
        for reason, n in self.failure_reasons.items():
            counts[f"failed_step:{reason}"] += n
        # Criteria of the basis nothing checked (NL assertions without a judge): the summary says so.
        for criterion in (self.evaluation.details.get("unchecked") or []) if self.evaluation is not None else []:
            counts[f"unchecked:{criterion}"] += 1


def positional(step: Step, index: int, call_id: str | None = None) -> Step:
    """`step` with the tool call id its position gives: `call_<index>` on an api action, `call_id` on its answer."""
    if step.kind == "api":
        return step.model_copy(update={"tool_call_id": f"call_{index}"})
    if step.kind not in ACTION_KINDS and step.tool_call_id is not None:
        return step.model_copy(update={"tool_call_id": call_id})
    return step


def renumber_calls(steps: Sequence[Step]) -> list[Step]:
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


async def act(env: Environment, action: Action, index: int) -> tuple[Action, Step, Any]:
    """Take `action` as step `index` of a history: (the action and its observation, positional ids; the result)."""
    action = positional(action, index)  # type: ignore[assignment]
    result = await env.step(action)
    observation = positional(result.observation, index + 1, action.tool_call_id)
    return action, observation, result


async def play_episode(
    env: Environment,
    policy: Proposer,
    task: Task,
    *,
    max_steps: int,
    max_parse_failures: int = 3,
    guidance: str | None = None,
    evaluate: bool = True,
    reviewer: Reviewer | None = None,
) -> Episode:
    """A fresh episode of `task` in which `policy` takes up to `max_steps` actions."""
    opening = await env.reset(task)
    return await continue_episode(env, policy, opened(policy, opening, guidance), max_steps=max_steps,
                                  max_parse_failures=max_parse_failures, evaluate=evaluate, reviewer=reviewer)


async def continue_episode(
    env: Environment,
    policy: Proposer,
    history: Sequence[Step],
    *,
    max_steps: int,
    actions_taken: int = 0,
    max_parse_failures: int = 3,
    evaluate: bool = True,
    reviewer: Reviewer | None = None,
) -> Episode:
    """`policy` acts from the env's current state, which `history` led to, until `max_steps` actions in all, or
    until a proposer that plays a script says it has played all of it (`finished`).

    A history without a system step gets the policy's."""
    steps = opened(policy, history)
    episode = Episode(steps=steps, evaluation=None, stop_reason="max_steps", actions=actions_taken)
    if env.done:
        episode.stop_reason = "done"
    while not episode.done and episode.actions < max_steps and not getattr(policy, "finished", False):
        proposal = (await policy.propose(steps))[0]
        if proposal.end:
            episode.stop_reason = "ended"
            break
        if proposal.action is None:
            episode.parse_failures += 1
            error = proposal.error or "no action"
            episode.failure_reasons[failure_class(error)] += 1
            steps.append(TextObservation(content=proposal.raw or "", source="agent", train=False, label="bad",
                                         extra={"parse_error": error}, usage=proposal.usage))
            steps.append(TextObservation(content=PARSE_ERROR.format(error=error), source="environment",
                                         name="parse_error", train=False))
            if episode.parse_failures >= max_parse_failures:
                episode.stop_reason = "max_parse_failures"
                break
            continue
        episode.actions += 1
        before = checkpoint(env, steps) if reviewer is not None else None
        action, observation, result = await act(env, proposal.action, len(steps))
        correction = await reviewer(env, before, steps, action, observation) if reviewer and before else None
        if correction is not None:
            steps += correction.steps
            result = correction.result
        else:
            steps += [action, observation]
        if result.info.get("error"):
            episode.action_errors.append(str(result.info["error"]))
        if result.info.get("truncated"):
            episode.truncated = True
        if result.done:
            episode.stop_reason = "done"
    if evaluate:
        episode.evaluation = await env.evaluate()
    return episode


def failure_class(error: str) -> str:
    """The class of a failed step's reason, for counts: an answer cut off at the token limit, one refused
    (by the server or the model), or one not readable."""
    if error.startswith(TRUNCATED):
        return "truncated"
    return "refused" if error.startswith(REFUSED) else "unreadable"
