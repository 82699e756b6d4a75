"""LLM step verification: a judge labels each agent step good / bad (STEVE) and a verifier names
the first wrong step of a failed path (Agent-R).

The judge sees the rules the agent follows (the environment's policy, where there is one), the
task, the step (thought + action) and what the agent saw before and after it, and answers
`{label: good|bad, reason}`. On web trajectories "before" is the page the agent acted on and
"after" the page the action led to: URL, accessibility tree (else the HTML), capped at
`page_chars`, and the screenshot's path; the screenshots themselves go to a judge that takes
images (`filters.vision.PageImages`). The verifier walks a whole path once and answers per
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
from filters.vision import PageImages
from schemas.models import ImageRef, Step, Trajectory, WebObservation, is_system_step
from schemas.models import task_text as schema_task_text

ACTION_KINDS = ("api", "code", "message")
PAGE_CHARS = 6000  # of a page's text before and after a judged step
PATH_PAGE_CHARS = 1500  # of each page in a whole path shown to the verifier

JUDGE_SYSTEM = (
    "You verify the steps of an AI agent acting in an environment (calling tools, browsing web pages, or "
    "talking with a user). Given the rules the agent must follow (if any), the task, what the agent saw "
    "before a step, the step (its thought and action) and what it saw after, decide whether the step is "
    "good (correct, useful progress toward the task, within the rules) or bad (an error, a wrong or harmful "
    "action, a wasted or repeated action). On web pages, compare the page before with the page after to see "
    "what the action did. Reply with JSON: {\"label\": \"good\"|\"bad\", \"reason\": \"...\"}."
)
JUDGE_USER = "{rules}Task:\n{task}\n\nBefore the step:\n{before}\n\nThe step:\n{step}\n\nAfter the step:\n{after}"
JUDGE_RULES = "Rules the agent must follow:\n{policy}\n\n"
VERIFY_SYSTEM = (
    "You review a failed attempt of an AI agent at a task. For every numbered agent step, say whether it "
    "was Good, Bad or Uncertain, with a short reason. The first Bad step is where the attempt went wrong. "
    "Reply with JSON: {\"steps\": [{\"index\": <number>, \"verdict\": \"Good\"|\"Bad\"|\"Uncertain\", \"reason\": \"...\"}]}."
)
VERIFY_USER = "Task:\n{task}\n\nThe attempt (agent steps are numbered):\n{path}"
TEMPLATES = (JUDGE_SYSTEM, JUDGE_USER, JUDGE_RULES, VERIFY_SYSTEM, VERIFY_USER)


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
    """The task as the agent got it: the user's first request (after any system turn, named so or not: converted
    data keeps its system prompt as environment text); without one, the text before the first action that is
    not the system prompt (a world whose task comes from the environment, as ALFWorld's)."""
    request = schema_task_text(steps)
    if request is not None:
        return request
    texts = [s for s in steps[: next((i for i, s in enumerate(steps) if s.kind in ACTION_KINDS), len(steps))]
             if s.kind == "text" and s.source != "agent" and not is_system_step(s)]
    return texts[-1].content if texts else ""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}\n[... {len(text) - limit} more characters]"


def describe_page(page: WebObservation, page_chars: int = PAGE_CHARS) -> str:
    """A web page for a judge: its URL, its screenshot's path, and its accessibility tree (else its HTML), capped."""
    lines = [f"page {page.url or '(no url)'}"]
    if page.screenshot is not None:
        lines.append(f"screenshot: {page.screenshot.path}")
    body = page.axtree or page.html or ""
    lines.append(_cut(body, page_chars) if body else "(no page text recorded)")
    return "\n".join(lines)


def describe(step: Step, page_chars: int = PAGE_CHARS) -> str:
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
    if step.kind == "web":
        return describe_page(step, page_chars)
    if step.kind == "image":
        return f"image: {step.image.path}"
    return step.kind


def before_step(steps: Sequence[Step], i: int, page_chars: int = PAGE_CHARS) -> tuple[str, ImageRef | None]:
    """What the agent saw before step `i`: the observation just before it and, on web trajectories, the page
    it acted on (the last page seen, when a text such as an error came after it); that page's screenshot."""
    parts: list[str] = []
    prev = steps[i - 1] if i > 0 and steps[i - 1].kind not in ACTION_KINDS else None
    page = next((s for s in reversed(steps[:i]) if isinstance(s, WebObservation)), None)
    if prev is not None and prev is not page:
        parts.append(describe(prev, page_chars))
    if page is not None:
        parts.append(("The page:\n" if parts else "") + describe_page(page, page_chars))
    return ("\n\n".join(parts) or "(nothing)"), page.screenshot if page is not None else None


def after_step(steps: Sequence[Step], i: int, page_chars: int = PAGE_CHARS) -> tuple[str, ImageRef | None]:
    """What step `i` led to (its observation), and the screenshot of the page it shows."""
    nxt = steps[i + 1] if i + 1 < len(steps) and steps[i + 1].kind not in ACTION_KINDS else None
    if nxt is None:
        return "(nothing)", None
    return describe(nxt, page_chars), nxt.screenshot if isinstance(nxt, WebObservation) else None


async def judge_step(llm: LLM, task: str, steps: Sequence[Step], i: int, *, policy: str | None = None,
                     images: PageImages | None = None, counts: Counter[str] | None = None,
                     page_chars: int = PAGE_CHARS) -> StepJudgement | None:
    """The judge's label for agent step `i` of `steps` (None when the model never answered validly).

    `policy`: the rules the agent follows; `images`: shows the screenshots before and after the step to a
    judge that takes images (fallbacks counted in `counts`)."""
    before, shot_before = before_step(steps, i, page_chars)
    after, shot_after = after_step(steps, i, page_chars)
    rules = JUDGE_RULES.format(policy=policy.strip()) if policy and policy.strip() else ""
    text = JUDGE_USER.format(rules=rules, task=task, before=before, step=describe(steps[i]), after=after)
    if images is not None:
        return await images.ask(llm, JUDGE_SYSTEM, text, [shot_before, shot_after], StepJudgement,
                                counts if counts is not None else Counter(), temperature=0.0)
    msgs = [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": text}]
    return await llm.structured(msgs, StepJudgement, temperature=0.0)


async def judge_trajectory(llm: LLM, steps: Sequence[Step], indices: Sequence[int] | None = None, *,
                           policy: str | None = None, images: PageImages | None = None,
                           counts: Counter[str] | None = None,
                           page_chars: int = PAGE_CHARS) -> dict[int, StepJudgement | None]:
    """Judge every agent step (or `indices`) concurrently: step index -> judgement."""
    task = task_text(steps)
    indices = list(action_indices(steps) if indices is None else indices)
    answers = await asyncio.gather(*(judge_step(llm, task, steps, i, policy=policy, images=images, counts=counts,
                                                page_chars=page_chars) for i in indices))
    return dict(zip(indices, answers))


def numbered_path(steps: Sequence[Step], page_chars: int = PATH_PAGE_CHARS) -> str:
    """The steps as numbered lines; the agent's system prompt is left out (indices stay the steps')."""
    lines = []
    for i, s in enumerate(steps):
        if is_system_step(s):
            continue
        tag = f"[{i}] AGENT" if s.kind in ACTION_KINDS else "    SEEN"
        lines.append(f"{tag}: {describe(s, page_chars)}")
    return "\n".join(lines)


def screenshots(steps: Sequence[Step], limit: int) -> list[ImageRef]:
    """The pages' screenshots in order, at most `limit`: the first page's and the last ones' (where a trajectory
    ends is what decides it)."""
    shots = [s.screenshot for s in steps if isinstance(s, WebObservation) and s.screenshot is not None]
    if len(shots) <= limit:
        return shots
    return (shots[:1] + shots[len(shots) - limit + 1:]) if limit > 1 else shots[-limit:]


def cut_head(text: str, limit: int) -> str:
    """`text`'s end, at most `limit` characters (a long trajectory's end is what decides it)."""
    return text if len(text) <= limit else "[...]\n" + text[-limit:]


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
