"""Can a chat template show what a row trains? Every trainable turn must render its text and tool calls,
and a row's tools must render where it has them.

Not every template does: TRL 1.16's bundled `llama3_training` renders neither `tools` nor
`tool_calls`, so an assistant turn that only calls a tool trains as an empty turn (and a DPO row
whose sides are two such turns compares nothing).

Two checks, one rule (`turn_problem`, `tools_problem`):
- a template the export renders with (`tokenized`): each row is rendered anyway, so each trainable
  turn's rendered span is looked at (`row_problem`);
- the dataset card's table for TRL's bundled training templates (`CARD_TEMPLATES`): each template
  is rendered once on a probe conversation to learn what it shows (content, tool calls, tools;
  these templates render by the message's structure, not its text), and each written row is then
  judged by what its trainable turns hold (`RowFeatures`), vectorized over the batch.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# TRL's bundled training templates the card judges every export against (the model families
# TRL swaps them in for when `assistant_only_loss=True`).
CARD_TEMPLATES = ("qwen2_5_training", "qwen3_training", "qwen3_6_training", "llama3_training", "deepseekv3_training",
                  "gptoss_training", "glm4moe_training", "lfm2_training", "gemma3_training", "phi3_training")
EMPTY_TURN = "a trainable assistant turn renders empty"
CALLS_DROPPED = "a trainable assistant turn's tool calls are not rendered"
TOOLS_DROPPED = "the row's tools are not rendered"
PROBLEMS = (EMPTY_TURN, CALLS_DROPPED, TOOLS_DROPPED)
_SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
_PROBE_TOOL = "probe_lookup_fn"
_PROBE_ANSWER = "PROBEANSWERTEXT"


class TemplateUnavailable(Exception):
    """The template cannot be loaded or rendered; the message is one line."""


def _visible(content: str) -> str | None:
    """A piece of a message's text that any faithful rendering contains (its first line, trimmed)."""
    for line in content.strip().splitlines():
        if line.strip():
            return line.strip()[:40]
    return None


def turn_problem(message: dict[str, Any], span: str) -> str | None:
    """What a rendered assistant turn (`span`: its generation span) lost, or None."""
    text = _visible(message.get("content") or "")
    names = [c["function"]["name"] for c in message.get("tool_calls") or ()]
    shows_text = text is not None and text in span
    shows_calls = all(name in span for name in names)
    if not shows_text and not (names and shows_calls):
        return EMPTY_TURN
    if not shows_calls:
        return CALLS_DROPPED
    return None


def tools_problem(with_tools: str, without_tools: str) -> str | None:
    """Whether a row's tools rendered: the conversation renders differently with them than without."""
    return TOOLS_DROPPED if with_tools == without_tools else None


def row_problem(text: str, spans: list[tuple[int, int]], messages: list[dict[str, Any]], trainable: list[bool],
                without_tools: str | None) -> str | None:
    """The first problem of a rendered row: `spans` are the character spans of its assistant messages
    in order, `without_tools` its rendering without tools (None: the row has none)."""
    assistant = [m for m in messages if m["role"] == "assistant"]
    for message, (start, end), train in zip(assistant, spans, trainable):
        if train and (problem := turn_problem(message, text[start:end])) is not None:
            return problem
    return tools_problem(text, without_tools) if without_tools is not None else None


# ---- TRL's bundled templates ---------------------------------------------------------------------


def trl_template(name: str) -> str:
    """The source of TRL's bundled template `name` (e.g. "qwen3_training"), read without importing TRL."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise TemplateUnavailable("TRL is not installed (pip install trajforge[train])")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "chat_templates" / f"{name}.jinja"
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise TemplateUnavailable(f"the installed TRL ships no chat template {name!r}")


def render(template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
           special: dict[str, str] | None = None) -> tuple[str, list[tuple[int, int]]]:
    """(text, character spans of the `{% generation %}` blocks) of a conversation."""
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:
        raise TemplateUnavailable("checking chat templates needs transformers (pip install trajforge[train])") from None
    clean = [{k: v for k, v in m.items() if v is not None} for m in messages]
    rendered, spans = render_jinja_template(conversations=[clean], tools=tools, chat_template=template,
                                            return_assistant_tokens_mask=True, **(special or _SPECIAL))
    return rendered[0], [tuple(s) for s in spans[0]] if spans else []  # type: ignore[misc]


@dataclass(frozen=True)
class Abilities:
    """What a template shows of an assistant turn and of a row's tools (probed once), or why it could not be probed."""

    name: str
    content: bool = False
    tool_calls: bool = False
    tools: bool = False
    error: str | None = None


@lru_cache(maxsize=None)
def probe(name: str) -> Abilities:
    """Render TRL's template `name` on a probe conversation: one turn that only calls a tool, one that
    only answers, and one tool declared."""
    call = {"id": "call_0", "type": "function", "function": {"name": _PROBE_TOOL, "arguments": {"q": "x"}}}
    messages = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Look it up."},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_0", "content": "found"},
                {"role": "assistant", "content": _PROBE_ANSWER}]
    tools = [{"type": "function", "function": {"name": _PROBE_TOOL, "description": "Look up.",
                                               "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
    try:
        text, spans = render(trl_template(name), messages, tools)
        bare, _ = render(trl_template(name), messages, None)
    except TemplateUnavailable as exc:
        return Abilities(name, error=str(exc))
    except Exception as exc:  # noqa: BLE001 - a template that raises on agent turns is reported, not fatal
        return Abilities(name, error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200])
    if len(spans) != 2:
        return Abilities(name, error=f"marks {len(spans)} generation spans for 2 assistant turns")
    return Abilities(name, content=_PROBE_ANSWER in text[slice(*spans[1])],
                     tool_calls=_PROBE_TOOL in text[slice(*spans[0])], tools=text != bare)


# ---- judging written rows by their trainable turns -----------------------------------------------


@dataclass
class RowFeatures:
    """Per row: trainable assistant turns that only call tools, that have text and calls, that have text
    only, that have neither; and whether the row has tools."""

    calls_only: np.ndarray
    text_and_calls: np.ndarray
    text_only: np.ndarray
    empty: np.ndarray
    has_tools: np.ndarray

    @classmethod
    def of(cls, table: pa.RecordBatch | pa.Table, columns: list[str], train_flag: bool = False) -> "RowFeatures":
        """Features of `table`'s rows from the assistant messages of `columns` (with `train_flag`: only those
        whose `train` is not false)."""
        n = table.num_rows
        counts = {k: np.zeros(n, dtype=np.int64) for k in ("calls_only", "text_and_calls", "text_only", "empty")}
        for name in columns:
            conv = table.column(name)
            if isinstance(conv, pa.ChunkedArray):
                conv = conv.combine_chunks()
            owner = pc.list_parent_indices(conv).to_numpy(zero_copy_only=False)
            msgs = pc.list_flatten(conv)
            keep = pc.equal(msgs.field("role"), "assistant")
            if train_flag and msgs.type.get_field_index("train") >= 0:
                keep = pc.and_(keep, pc.fill_null(msgs.field("train"), True))
            keep = pc.fill_null(keep, False).to_numpy(zero_copy_only=False)
            text = pc.fill_null(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(msgs.field("content"))), 0), False)
            text = text.to_numpy(zero_copy_only=False)
            calls = pc.fill_null(pc.list_value_length(msgs.field("tool_calls")), 0).to_numpy(zero_copy_only=False) > 0
            for key, mask in (("calls_only", calls & ~text), ("text_and_calls", calls & text),
                              ("text_only", text & ~calls), ("empty", ~text & ~calls)):
                counts[key] += np.bincount(owner[keep & mask], minlength=n)
        has_tools = pc.fill_null(pc.greater(pc.utf8_length(table.column("tools")), 2), False)
        return cls(**counts, has_tools=np.asarray(has_tools.to_numpy(zero_copy_only=False), dtype=bool))

    def problems(self, a: Abilities) -> dict[str, np.ndarray]:
        """Per problem, which rows have it under a template with abilities `a`."""
        empty = self.empty > 0
        if not a.tool_calls:
            empty |= self.calls_only > 0
        if not a.content:
            empty |= (self.text_only > 0) | ((self.text_and_calls > 0) & (not a.tool_calls))
        return {EMPTY_TURN: empty,
                CALLS_DROPPED: (self.text_and_calls > 0) & (not a.tool_calls) & a.content,
                TOOLS_DROPPED: self.has_tools & (not a.tools)}


@dataclass
class TemplateReport:
    """Per template of `CARD_TEMPLATES`: rows checked, rows rendered whole, rows per problem."""

    rows: int = 0
    checked: Counter[str] = field(default_factory=Counter)
    whole: Counter[str] = field(default_factory=Counter)
    problems: dict[str, Counter[str]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def add(self, features: RowFeatures) -> None:
        n = len(features.has_tools)
        self.rows += n
        for name in CARD_TEMPLATES:
            a = probe(name)
            if a.error is not None:
                self.errors[name] = a.error
                continue
            found = features.problems(a)
            bad = np.zeros(n, dtype=bool)
            for problem, rows in found.items():
                bad |= rows
                self.problems.setdefault(name, Counter())[problem] += int(rows.sum())
            self.checked[name] += n
            self.whole[name] += int((~bad).sum())

    def as_card(self) -> list[dict[str, Any]]:
        out = []
        for name in CARD_TEMPLATES:
            if name in self.errors:
                out.append({"template": name, "error": self.errors[name]})
            elif name in self.checked:
                out.append({"template": name, "rows": self.checked[name], "whole": self.whole[name],
                            **{p: self.problems.get(name, Counter())[p] for p in PROBLEMS}})
        return out
