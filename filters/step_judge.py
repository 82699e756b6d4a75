"""LLM step verification: a judge labels each agent step good / bad (STEVE) and a verifier names
the first wrong step of a failed path (Agent-R).

The judge sees the task, the step (thought + action) and the observations before and after it,
and answers `{label: good|bad, reason}`; the verifier walks a whole path once and answers per
step Good / Bad / Uncertain. Both go through `llm.structured`, so answers are schema-checked,
retried with the error, cached, and None (ledgered) when the model never complies.
Agreement with reference labels (`filters.step_rules`: replay labels, reference actions) is measured as
accuracy, Cohen's kappa and the precision / recall of "bad".
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, Literal, Sequence

import orjson
from pydantic import BaseModel, Field

from backends.base import LLM
from schemas.models import Step, Trajectory

ACTION_KINDS = ("api", "code", "message")

JUDGE_SYSTEM = (
    "You verify the steps of a customer-service / tool-using AI agent. Given the task, what the agent "
    "saw before a step, the step (its thought and action) and what it saw after, decide whether the step "
    "is good (correct, useful progress toward the task, following the rules) or bad (an error, a wrong "
    "or harmful action, a wasted or repeated call). Reply with JSON: {\"label\": \"good\"|\"bad\", \"reason\": \"...\"}."
)
JUDGE_USER = "Task:\n{task}\n\nBefore the step:\n{before}\n\nThe step:\n{step}\n\nAfter the step:\n{after}"
VERIFY_SYSTEM = (
    "You review a failed attempt of an AI agent at a task. For every numbered agent step, say whether it "
    "was Good, Bad or Uncertain, with a short reason. The first Bad step is where the attempt went wrong. "
    "Reply with JSON: {\"steps\": [{\"index\": <number>, \"verdict\": \"Good\"|\"Bad\"|\"Uncertain\", \"reason\": \"...\"}]}."
)
VERIFY_USER = "Task:\n{task}\n\nThe attempt (agent steps are numbered):\n{path}"
TEMPLATES = (JUDGE_SYSTEM, JUDGE_USER, VERIFY_SYSTEM, VERIFY_USER)


class StepJudgement(BaseModel):
    """The judge's answer for one step."""

    label: Literal["good", "bad"]
    reason: str = ""


class StepVerdict(BaseModel):
    index: int
    verdict: Literal["Good", "Bad", "Uncertain"]
    reason: str = ""


class PathVerdict(BaseModel):
    """The verifier's answer for a whole path: one verdict per numbered agent step."""

    steps: list[StepVerdict] = Field(default_factory=list)


def action_indices(steps: Sequence[Step]) -> list[int]:
    return [i for i, s in enumerate(steps) if s.kind in ACTION_KINDS]


def task_text(steps: Sequence[Step]) -> str:
    """The task as the agent got it: the first observation that is not the agent's."""
    for s in steps:
        if s.kind == "text" and s.source != "agent":
            return s.content
        if s.kind in ACTION_KINDS:
            break
    return ""


def describe(step: Step) -> str:
    """One step as plain text for a judge prompt."""
    if step.kind == "api":
        call = f"call {step.function}({orjson.dumps(step.arguments, option=orjson.OPT_SORT_KEYS).decode()})"
        return f"{step.thought}\n{call}" if step.thought else call
    if step.kind == "code":
        return f"{step.thought or ''}\n```{step.language}\n{step.content}\n```".strip()
    if step.kind == "message":
        text = f"say to the user: {step.content}"
        return f"{step.thought}\n{text}" if step.thought else text
    if step.kind == "text":
        return f"{step.source}: {step.content}"
    if step.kind == "json":
        return orjson.dumps(step.content).decode()
    return step.kind


def _near(steps: Sequence[Step], i: int, direction: int) -> str:
    j = i + direction
    if 0 <= j < len(steps) and steps[j].kind not in ACTION_KINDS:
        return describe(steps[j])
    return "(nothing)"


async def judge_step(llm: LLM, task: str, steps: Sequence[Step], i: int) -> StepJudgement | None:
    """The judge's label for agent step `i` of `steps` (None when the model never answered validly)."""
    msgs = [
        {"role": "system", "content": JUDGE_SYSTEM},
        {"role": "user", "content": JUDGE_USER.format(task=task, before=_near(steps, i, -1), step=describe(steps[i]),
                                                      after=_near(steps, i, +1))},
    ]
    return await llm.structured(msgs, StepJudgement, temperature=0.0)


async def judge_trajectory(llm: LLM, steps: Sequence[Step], indices: Sequence[int] | None = None) -> dict[int, StepJudgement | None]:
    """Judge every agent step (or `indices`) concurrently: step index -> judgement."""
    task = task_text(steps)
    indices = list(action_indices(steps) if indices is None else indices)
    answers = await asyncio.gather(*(judge_step(llm, task, steps, i) for i in indices))
    return dict(zip(indices, answers))


def numbered_path(steps: Sequence[Step]) -> str:
    lines = []
    for i, s in enumerate(steps):
        tag = f"[{i}] AGENT" if s.kind in ACTION_KINDS else "    SEEN"
        lines.append(f"{tag}: {describe(s)}")
    return "\n".join(lines)


async def locate_first_error(llm: LLM, steps: Sequence[Step], start: int = 0) -> tuple[int | None, str]:
    """The first agent step at or after `start` the verifier calls Bad, with its reason.

    (None, why) when the verifier found none there or gave no valid answer; callers fall back
    (e.g. to the divergence point). Verdicts before `start` are ignored: that prefix is shared
    with a path that succeeded.
    """
    msgs = [
        {"role": "system", "content": VERIFY_SYSTEM},
        {"role": "user", "content": VERIFY_USER.format(task=task_text(steps), path=numbered_path(steps))},
    ]
    verdict = await llm.structured(msgs, PathVerdict, temperature=0.0)
    if verdict is None:
        return None, "verifier gave no valid answer"
    actions = set(action_indices(steps))
    for v in sorted(verdict.steps, key=lambda v: v.index):
        if v.verdict == "Bad" and v.index >= start and v.index in actions:
            return v.index, v.reason
    return None, "verifier named no bad step after the shared prefix"


# ---- agreement between two labelers ---------------------------------------------------------------


def confusion(a: dict[int, str], b: dict[int, str]) -> Counter[str]:
    """Counts `<a label>_<b label>` over steps both labeled good/bad."""
    out: Counter[str] = Counter()
    for i, la in a.items():
        lb = b.get(i)
        if la in ("good", "bad") and lb in ("good", "bad"):
            out[f"{la}_{lb}"] += 1
    return out


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def agreement(cells: dict[str, int] | Counter[str]) -> dict[str, Any]:
    """How a judge agrees with a reference labeler, from confusion cells `<judge>_<reference>`
    (good_good / good_bad / bad_good / bad_bad): accuracy (the share of steps labeled alike), Cohen's kappa, and the
    precision and recall of the judge's "bad" (how many steps it calls bad are bad; how many bad
    steps it finds). A ratio with nothing to divide by is None."""
    gg, gb, bg, bb = (int(cells.get(k, 0)) for k in ("good_good", "good_bad", "bad_good", "bad_bad"))
    n = gg + gb + bg + bb
    if n == 0:
        return {"compared": 0, "accuracy": None, "kappa": None, "bad_precision": None, "bad_recall": None}
    po = (gg + bb) / n
    pe = ((gg + gb) * (gg + bg) + (bg + bb) * (gb + bb)) / (n * n)
    kappa = 1.0 if pe >= 1.0 else (po - pe) / (1 - pe)
    return {"compared": n, "accuracy": round(po, 4), "kappa": round(kappa, 4),
            "bad_precision": _ratio(bb, bb + bg), "bad_recall": _ratio(bb, bb + gb)}


def labels_of(traj: Trajectory) -> dict[int, str]:
    return {i: s.label for i, s in enumerate(traj.steps) if s.kind in ACTION_KINDS}
