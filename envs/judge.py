"""LLM judges over an episode's conversation: natural-language assertions (tau2's NL_ASSERTION), and
the outcome of a task that states no checkable criteria.

Both see the conversation as a transcript (the user's turns, the agent's messages and its tool
calls with their results, long results cut), the task's request and the environment's policy,
and answer in a JSON schema; their calls go through the LLM cache like any other.
"""

from __future__ import annotations

import json
from typing import Sequence

from pydantic import BaseModel

from backends.base import LLM
from envs.base import Task, is_revision
from schemas.models import Step

MAX_RESULT_CHARS = 600

ASSERTIONS_SYSTEM = """You grade a conversation between a customer-service agent and a customer against a \
list of expected outcomes. Grade each expected outcome on its own, from what the conversation shows; an \
outcome the conversation does not show is not met.{policy}

Answer with a JSON object: {{"results": [{{"assertion": "<the expected outcome, verbatim>", \
"reasoning": "<one or two sentences>", "met": true or false}}, ...]}} with one result per expected outcome, \
in the order given."""

OUTCOME_SYSTEM = """You judge whether an agent accomplished what the user asked, following the rules it \
was given. Judge from the transcript only: tool results show what really happened.{policy}

Answer with a JSON object: {{"reasoning": "<two or three sentences>", "reward": <a number from 0 to 1: \
1 when the request was fully and correctly served within the rules, 0 when not at all>}}."""


class AssertionResult(BaseModel):
    assertion: str
    reasoning: str
    met: bool


class AssertionVerdicts(BaseModel):
    results: list[AssertionResult]


class OutcomeVerdict(BaseModel):
    reasoning: str
    reward: float


class JudgeError(RuntimeError):
    """The judge model gave no usable answer (see the LLM ledger)."""


def transcript(history: Sequence[Step]) -> str:
    """The conversation as lines a judge reads."""
    lines: list[str] = []
    for step in history:
        if step.kind == "message" and not is_revision(step):
            lines.append(f"agent: {step.content}")
        elif step.kind == "api":
            lines.append(f"agent calls {step.function}({json.dumps(step.arguments, ensure_ascii=False)})")
        elif step.kind == "text":
            text = step.content if step.source == "user" else step.content[:MAX_RESULT_CHARS]
            cut = "" if len(text) == len(step.content) else " [...]"
            lines.append(f"{'user' if step.source == 'user' else 'tool result'}: {text}{cut}")
    return "\n".join(lines)


def _policy_block(policy: str | None) -> str:
    return f"\n\nThe agent's rules:\n<policy>\n{policy}\n</policy>" if policy else ""


async def check_assertions(llm: LLM, history: Sequence[Step], assertions: Sequence[str],
                           policy: str | None = None) -> list[AssertionResult]:
    """One verdict per assertion, in order (an assertion the judge skipped counts as not met)."""
    listed = "\n".join(f"- {a}" for a in assertions)
    messages = [{"role": "system", "content": ASSERTIONS_SYSTEM.format(policy=_policy_block(policy))},
                {"role": "user", "content": f"CONVERSATION\n{transcript(history)}\n\nEXPECTED OUTCOMES\n{listed}"}]
    answer = await llm.structured(messages, AssertionVerdicts, temperature=0.0)
    if answer is None:
        raise JudgeError("no valid verdicts from the judge model (invalid output or a failed request)")
    by_text = {r.assertion.strip(): r for r in answer.results}
    out = []
    for i, assertion in enumerate(assertions):
        found = by_text.get(assertion.strip())
        if found is None and i < len(answer.results) and len(answer.results) == len(assertions):
            found = answer.results[i]
        out.append(AssertionResult(assertion=assertion, reasoning=found.reasoning if found else "not graded by the judge",
                                   met=bool(found and found.met)))
    return out


async def judge_outcome(llm: LLM, task: Task, history: Sequence[Step], policy: str | None = None) -> OutcomeVerdict:
    """A reward in [0, 1] for how well the episode served the task's request."""
    messages = [{"role": "system", "content": OUTCOME_SYSTEM.format(policy=_policy_block(policy))},
                {"role": "user", "content": f"THE USER'S REQUEST\n{task.instruction}\n\nTRANSCRIPT\n{transcript(history)}"}]
    answer = await llm.structured(messages, OutcomeVerdict, temperature=0.0)
    if answer is None:
        raise JudgeError("no valid verdict from the judge model (invalid output or a failed request)")
    return OutcomeVerdict(reasoning=answer.reasoning, reward=min(1.0, max(0.0, answer.reward)))
