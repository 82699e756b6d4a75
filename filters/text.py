"""Text views of trajectory steps and a cheap token counter, shared by rule filters and judges."""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Callable

from schemas.models import (
    ApiAction,
    CodeAction,
    ImageObservation,
    JsonObservation,
    MessageAction,
    TextObservation,
    WebObservation,
)

# Word pieces: runs of letters/digits, or single punctuation marks. Close to BPE counts on
# English prose and code (within ~30%), and needs no model download.
_PIECE = re.compile(r"\w+|[^\w\s]")


def approx_tokens(text: str) -> int:
    return len(_PIECE.findall(text))


@functools.lru_cache(maxsize=4)
def _hf_tokenizer(spec: str) -> Any:
    from tokenizers import Tokenizer  # optional; only when configured

    return Tokenizer.from_file(spec) if spec.endswith(".json") else Tokenizer.from_pretrained(spec)


def token_counter(tokenizer: str | None = None) -> Callable[[str], int]:
    """The approximate counter, or a `tokenizers` tokenizer (a tokenizer.json path or hub name)."""
    if not tokenizer or tokenizer == "approx":
        return approx_tokens
    tok = _hf_tokenizer(tokenizer)
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def arguments_text(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True)


def step_text(step: Any) -> str:
    """All the text a step carries (what a model reads or writes for it)."""
    parts: list[str] = []
    if isinstance(step, (ApiAction, CodeAction, MessageAction)):
        parts += [step.reasoning or "", step.thought or ""]
    if isinstance(step, ApiAction):
        parts += [step.function, arguments_text(step.arguments)]
    elif isinstance(step, (CodeAction, MessageAction, TextObservation)):
        parts.append(step.content)
    elif isinstance(step, JsonObservation):
        parts.append(step.content if isinstance(step.content, str) else json.dumps(step.content, ensure_ascii=False))
    elif isinstance(step, WebObservation):
        parts += [step.url or "", step.axtree or step.html or ""]
    elif isinstance(step, ImageObservation):
        parts.append(step.image.path)
    return " ".join(p for p in parts if p)


def step_payload(step: Any) -> str | None:
    """The step's main content (not its thought); None for kinds with nothing to be empty."""
    if isinstance(step, ApiAction):
        return step.function
    if isinstance(step, (CodeAction, MessageAction, TextObservation)):
        return step.content
    if isinstance(step, JsonObservation):
        return None if step.content is None else json.dumps(step.content)
    if isinstance(step, WebObservation):
        return (step.url or "") + (step.html or "") + (step.axtree or "") + (step.screenshot.path if step.screenshot else "")
    if isinstance(step, ImageObservation):
        return step.image.path
    return None


def render(record: Any, max_chars: int = 12_000) -> str:
    """A compact transcript for judges: one line per step, long steps cut in the middle."""
    lines = []
    per_step = max(200, max_chars // max(1, len(record.steps)))
    for i, step in enumerate(record.steps):
        who = "AGENT" if step.kind in ("api", "code", "message") else getattr(step, "source", "environment").upper()
        text = step_text(step)
        if len(text) > per_step:
            text = text[: per_step // 2] + " … " + text[-per_step // 2 :]
        lines.append(f"[{i}] {who} {step.kind}: {text}")
    out = "\n".join(lines)
    return out if len(out) <= max_chars else out[: max_chars // 2] + "\n…\n" + out[-max_chars // 2 :]


def task_text(record: Any) -> str:
    """The task: the first user text observation, if any."""
    for step in record.steps:
        if isinstance(step, TextObservation) and step.source == "user":
            return step.content
    return ""
