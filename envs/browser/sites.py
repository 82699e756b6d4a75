"""Tasks on any site: a JSONL file of `{id, start_url, instruction, evaluation}`, and their checks.

    tasks: {source: sites, path: shop_tasks.jsonl}

    {"id": "buy-socks", "start_url": "/index.html", "instruction": "Buy the red socks.",
     "evaluation": [{"type": "url", "contains": "/thanks"}, {"type": "text", "text": "Order placed"}]}

`start_url` is absolute, or relative to the environment's `base_url` / `site_dir`. `evaluation`
is one check or a list of checks, all of which must pass (the reward is their mean):

- `{"type": "url", "equals" | "contains" | "regex": ...}`: the final page's URL.
- `{"type": "text", "text": ..., "selector": "body", "absent": false}`: text shown in the final
  page (in the element `selector`), whitespace and case folded; `absent` inverts it.
- `{"type": "js", "expression": ..., "threshold": 1.0}`: a JavaScript expression evaluated in the
  final page, returning a number (or a boolean); the reward is that number clipped to [0, 1], a
  success when it reaches `threshold`.
- `{"type": "answer", "contains": ...}`: the agent's final answer contains this text.
- `{"type": "judge", "criteria": ...}`: an LLM judge reads the task, the agent's actions and
  answer, and the final page (URL and accessibility tree) and decides; it needs a model (the
  method's own, or `env_config.llm`), the other checks need none.

A task may carry a reference solution, `"solution": [{"name": "click", "arguments": {...}}, ...]`,
which `envs check` replays.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import TYPE_CHECKING, Annotated, Any, Awaitable, Callable, Iterator, Literal, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from envs.base import EnvError, Evaluation, Task
from envs.tasks import TaskFileError, TaskSourceConfig, jsonl_tasks, register_task_source
from schemas.models import Step

if TYPE_CHECKING:
    from backends.base import LLM
    from envs.base import Environment

SOURCE = "sites"
JUDGE_PAGE_CHARS = 12_000
JUDGE_LOG_CHARS = 6_000


class _Check(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UrlCheck(_Check):
    type: Literal["url"]
    equals: str | None = None
    contains: str | None = None
    regex: str | None = None

    @model_validator(mode="after")
    def _one_rule(self) -> UrlCheck:
        given = [k for k in ("equals", "contains", "regex") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a url check needs exactly one of equals, contains, regex")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"bad regex {self.regex!r}: {exc}") from None
        return self


class TextCheck(_Check):
    type: Literal["text"]
    text: str = Field(min_length=1)
    selector: str = "body"
    absent: bool = False


class JsCheck(_Check):
    type: Literal["js"]
    expression: str = Field(min_length=1)
    threshold: float = Field(1.0, gt=0, le=1)


class AnswerCheck(_Check):
    type: Literal["answer"]
    contains: str = Field(min_length=1)


class JudgeCheck(_Check):
    type: Literal["judge"]
    criteria: str | None = None


Check = Annotated[Union[UrlCheck, TextCheck, JsCheck, AnswerCheck, JudgeCheck], Field(discriminator="type")]
_CHECKS = TypeAdapter(list[Check])


class SiteTaskLine(BaseModel):
    """One line of a sites JSONL file."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    start_url: str = Field(min_length=1)
    instruction: str = Field(min_length=1)
    evaluation: list[Check] = Field(min_length=1)
    solution: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _one_or_many(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("evaluation"), dict):
            data = {**data, "evaluation": [data["evaluation"]]}
        return data

    def task(self) -> Task:
        goal: dict[str, Any] = {"evaluation": [c.model_dump(exclude_none=True) for c in self.evaluation]}
        if self.solution is not None:
            goal["actions"] = self.solution
        return Task(id=self.id, env="browser", instruction=self.instruction, params={"start_url": self.start_url},
                    goal=goal, metadata={"source": SOURCE, **self.metadata})


@register_task_source(SOURCE)
def site_tasks(config: TaskSourceConfig, env_name: str, env: Environment | None) -> Iterator[Task]:
    if not config.path:
        raise TaskFileError("the sites task source needs a path (a JSONL file of tasks)")
    yield from jsonl_tasks(config.path, lambda n, row: SiteTaskLine.model_validate(row).task())


def checks_of(task: Task) -> list[Check]:
    try:
        checks = task.goal.get("evaluation") or []
        return _CHECKS.validate_python([checks] if isinstance(checks, dict) else checks)
    except ValidationError as exc:
        raise EnvError(f"task {task.id}: bad evaluation ({exc.errors()[0]['msg']})") from None


# ---- checking the final page --------------------------------------------------------------------


class Verdict(BaseModel):
    """The judge's answer."""

    reason: str = Field(description="one or two sentences on what the agent achieved, citing the page")
    success: bool = Field(description="true when the task was fully done")


JUDGE_SYSTEM = """You judge whether a web agent completed a task in a browser. You see the task, the agent's \
actions with the page's answers, its final answer, and the final page (URL and accessibility tree). Judge only \
by what the page and the log show. Reply with a JSON object: {"reason": "...", "success": true|false}."""

JUDGE_USER = """# Task
{instruction}
{criteria}
# Actions
{log}

# Final answer of the agent
{answer}

# Final page
URL: {url}
{axtree}"""


def _fold(text: str) -> str:
    return " ".join(text.split()).casefold()


async def run_check(check: Check, page: Any, answer: str | None) -> tuple[float, bool, str]:
    """(reward in [0, 1], passed, why) for one check (not the judge) against the final page."""
    if isinstance(check, UrlCheck):
        url = page.url
        if check.equals is not None:
            ok, verb, what = url == check.equals, "equal", repr(check.equals)
        elif check.contains is not None:
            ok, verb, what = check.contains in url, "contain", repr(check.contains)
        else:
            ok, verb, what = re.search(check.regex or "", url) is not None, "match", f"/{check.regex}/"
        return float(ok), ok, f"url {url} {verb + 's' if ok else 'does not ' + verb} {what}"
    if isinstance(check, TextCheck):
        texts = await page.locator(check.selector).all_inner_texts()
        present = _fold(check.text) in _fold("\n".join(texts))
        ok = present != check.absent
        return float(ok), ok, f"text {check.text!r} {'shown' if present else 'not shown'} in {check.selector}"
    if isinstance(check, JsCheck):
        try:
            value = await page.evaluate(check.expression)
        except Exception as exc:  # noqa: BLE001 - a check that throws scores 0, with its error
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return 0.0, False, f"check expression failed: {first}"
        if isinstance(value, (bool, int, float)) and not math.isnan(value):
            score = max(0.0, min(1.0, float(value)))
            return score, score >= check.threshold, f"check expression gave {value!r}"
        return 0.0, False, f"check expression gave {value!r}, not a number"
    if isinstance(check, AnswerCheck):
        ok = answer is not None and _fold(check.contains) in _fold(answer)
        return float(ok), ok, f"answer {'contains' if ok else 'does not contain'} {check.contains!r}"
    raise TypeError(f"not a page check: {check.type}")


async def _judge(check: JudgeCheck, url: str, page_text: str, task: Task, history: Sequence[Step], answer: str | None,
                 judge: LLM | None) -> tuple[float, bool, str]:
    """The judge model's verdict on the episode, from the task, the action log and the final page's text."""
    if judge is None:
        raise EnvError(f"task {task.id} is judged by an LLM: give it a judge model "
                       "(the method's judge.llm, or env_config.judge.llm)")
    prompt = JUDGE_USER.format(
        instruction=task.instruction, criteria=f"\nSuccess criteria: {check.criteria}\n" if check.criteria else "",
        log=action_log(history)[-JUDGE_LOG_CHARS:] or "(no action)", answer=answer or "(none)", url=url,
        axtree=page_text[:JUDGE_PAGE_CHARS])
    verdict = await judge.structured([{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": prompt}],
                                     Verdict)
    if verdict is None:
        raise EnvError("no valid verdict from the judge model (invalid output or failed request)")
    return float(verdict.success), verdict.success, f"judge: {verdict.reason}"


def action_log(history: Sequence[Step]) -> str:
    """The agent's moves and the page's short answers, one line each."""
    lines = []
    for step in history:
        if step.kind == "api":
            lines.append(f"- {step.function}({json.dumps(step.arguments, ensure_ascii=False)})")
        elif step.kind == "message":
            lines.append(f"- answer: {step.content}")
        elif step.kind == "web":
            lines.append(f"  -> {step.url}")
        elif step.kind == "text" and step.source == "environment":
            lines.append(f"  -> {step.content[:200]}")
    return "\n".join(lines)


async def evaluate_site(task: Task, page: Any, history: Sequence[Step], answer: str | None, judge: LLM | None,
                        axtree: Callable[[], Awaitable[str]], timeout_s: float) -> Evaluation:
    """All the task's checks on the final page; reading the page is bounded by `timeout_s` (the judge model is not)."""
    results = []
    for check in checks_of(task):
        if isinstance(check, JudgeCheck):
            async with asyncio.timeout(timeout_s):
                url, page_text = page.url, await axtree()
            reward, passed, why = await _judge(check, url, page_text, task, history, answer, judge)
        else:
            async with asyncio.timeout(timeout_s):
                reward, passed, why = await run_check(check, page, answer)
        results.append({"type": check.type, "reward": reward, "passed": passed, "reason": why})
    if not results:
        return Evaluation(0.0, False, f"task {task.id} has no evaluation")
    reward = sum(r["reward"] for r in results) / len(results)
    success = all(r["passed"] for r in results)
    return Evaluation(reward, success, "; ".join(r["reason"] for r in results), {"checks": results})
