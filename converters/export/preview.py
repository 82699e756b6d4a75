"""One trajectory (or pair) in one export format, as the trainer loads it: for viewers and checks.

    from converters.export import preview
    p = preview(trajectory, "trl-sft", tokenizer="path/to/tokenizer")
    p.rows           # the rows the export writes for it (conversations as message dicts)
    p.skipped        # or the reason the export leaves it out
    p.tokens[0][0]   # TokenView: input_ids, mask (1 = the token carries loss), tokens (decoded strings)

It runs the export's own code (the same records, renderer and row functions), so what it shows
is what `trajforge export` writes; messages drop their null keys and tool-call arguments are
mappings in the Parquet formats (as `datasets` loads them), JSON text in `openai`. With a
tokenizer, each row also comes as tokens with the positions that carry loss under the settings
the card gives (`guide`):
- `tokenized`: the row itself (`input_ids`, `assistant_masks`);
- `trl-sft`: prompt-completion rows train the assistant messages of the completion; messages rows
  train every assistant message (TRL does not read the per-message `train` flag);
- `trl-dpo` / `trl-kto`: everything after the prompt (`prompt + chosen`, `prompt + rejected`,
  `prompt + completion`), as TRL's collators mark it;
- `openai`: assistant messages of weight 1;
- `sharegpt`: no tokens (LLaMA-Factory renders with its own templates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from converters.export.formats import FORMATS, Format, rows_to_batch
from converters.export.options import FormatOptions
from converters.export.records import PAIR_MEMBER, SPOILED, Record, pair_of, trains_records
from converters.export.render import RenderOptions, Unrenderable
from converters.export.tokenized import ChatTokenizer

FAILED = "success = false (--include-failed keeps it)"
_CONVERSATIONS = ("messages", "prompt", "completion", "chosen", "rejected")


@dataclass
class TokenView:
    """One tokenized sequence of a row: `column` names what it is (e.g. "prompt+chosen")."""

    column: str
    input_ids: list[int]
    mask: list[int]
    tokens: list[str]


@dataclass
class Preview:
    format: str
    rows: list[dict[str, Any]]
    skipped: str | None = None
    tokens: list[list[TokenView]] | None = None


def preview(trajectory: Any, fmt: str, *, tokenizer: Any = None, max_length: int | None = None,
            pair: Any = None, rejected: Any = None, sft_layout: str = "prompt-completion", kto_mode: str = "auto",
            dpo_level: str = "step", reasoning: bool | None = None, web_max_chars: int = 20_000,
            include_failed: bool = False, history: str = "request") -> Preview:
    """`trajectory` (a `schemas.models.Trajectory`) exported as `fmt`; for `trl-dpo` it is the chosen
    trajectory and `pair` / `rejected` the pair and its other side. `tokenizer`: a path, a
    transformers tokenizer or a `ChatTokenizer` (required for `tokenized`). Options as the CLI's."""
    spec = FORMATS[fmt]
    chat = _chat_tokenizer(tokenizer, max_length)
    record = Record.of(trajectory)
    opts = FormatOptions(RenderOptions(spec.keeps_reasoning if reasoning is None else reasoning, web_max_chars),
                         sft_layout, kto_mode, dpo_level, chat, history=history)  # type: ignore[arg-type]
    sides = [record, *([Record.of(rejected)] if rejected is not None else [])]
    if any(side.batch.spoiled_by_user[side.index] for side in sides):
        return Preview(fmt, [], SPOILED)
    if spec.table == "trajectories" and trains_records(spec) and record.batch.pair_only[record.index]:
        return Preview(fmt, [], PAIR_MEMBER)
    if spec.supervised and record.success is False and not include_failed:
        return Preview(fmt, [], FAILED)
    if fmt == "tokenized" and chat is None:
        return Preview(fmt, [], "tokenized needs a tokenizer")
    try:
        rows = _rows(spec, opts, record, pair, rejected)
    except Unrenderable as exc:
        return Preview(fmt, [], str(exc))
    out = Preview(fmt, rows)
    if chat is not None and fmt != "sharegpt":
        tools = record.openai_tools() or None
        out.tokens = [_token_views(row, spec, opts, chat, tools) for row in rows]
    return out


def _rows(spec: Format, opts: FormatOptions, record: Record, pair: Any, rejected: Any) -> list[dict[str, Any]]:
    """The rows as written, read back the way a trainer loads them."""
    if spec.batch is not None:
        assert spec.schema is not None
        reasons, table, _ = spec.batch(record.batch, opts, spec.schema(opts), np.array([True]))
        if reasons[0] is not None:
            raise Unrenderable(reasons[0])
        return [_loaded(row) for row in table.to_pylist()]
    assert spec.rows is not None
    if spec.table == "pairs":
        if pair is None or rejected is None:
            raise ValueError("trl-dpo needs pair= and rejected=")
        made = spec.rows(pair_of(pair), record, Record.of(rejected), opts)
    else:
        made = spec.rows(record, opts)
    if spec.file_type == "jsonl" or spec.schema is None:
        return made
    return [_loaded(row) for row in rows_to_batch(made, spec.schema(opts)).to_pylist()]


def _loaded(row: dict[str, Any]) -> dict[str, Any]:
    """Messages without their null keys, arguments as mappings (what `datasets` + a template see)."""
    out = dict(row)
    for column in _CONVERSATIONS:
        if column in out:
            out[column] = [_message(m) for m in out[column]]
    return out


def _message(message: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in message.items() if v is not None}
    for call in out.get("tool_calls") or ():
        args = call["function"]["arguments"]
        call["function"]["arguments"] = orjson.loads(args) if isinstance(args, str) else args
    return out


def _chat_tokenizer(tokenizer: Any, max_length: int | None) -> ChatTokenizer | None:
    if tokenizer is None or isinstance(tokenizer, ChatTokenizer):
        return tokenizer
    if isinstance(tokenizer, str) or hasattr(tokenizer, "__fspath__"):
        return ChatTokenizer.load(tokenizer, max_length)
    return ChatTokenizer(tokenizer, max_length)


def _after_prompt(chat: ChatTokenizer, prompt: list[dict[str, Any]], full: list[dict[str, Any]],
                  tools: list[dict[str, Any]] | None, column: str) -> TokenView:
    """TRL's DPO/KTO rule: the completion starts where the tokens of prompt (with the generation
    prompt) and of prompt + completion diverge."""
    prompt_ids = chat.tokenize(prompt, tools, add_generation_prompt=True)
    ids = chat.tokenize(full, tools)
    start = next((i for i, (a, b) in enumerate(zip(prompt_ids, ids)) if a != b), min(len(prompt_ids), len(ids)))
    return TokenView(column, ids, [0] * start + [1] * (len(ids) - start), chat.token_strings(ids))


def _assistant_view(chat: ChatTokenizer, messages: list[dict[str, Any]], trainable: list[bool],
                    tools: list[dict[str, Any]] | None, column: str) -> TokenView:
    enc = chat.encode(messages, trainable, tools)
    return TokenView(column, enc.input_ids, enc.mask, chat.token_strings(enc.input_ids))


def _token_views(row: dict[str, Any], spec: Format, opts: FormatOptions, chat: ChatTokenizer,
                 tools: list[dict[str, Any]] | None) -> list[TokenView]:
    if spec.name == "tokenized":
        return [TokenView("input_ids", row["input_ids"], row["assistant_masks"], chat.token_strings(row["input_ids"]))]
    if spec.name in ("trl-dpo", "trl-kto"):
        sides = ("chosen", "rejected") if spec.name == "trl-dpo" else ("completion",)
        return [_after_prompt(chat, row["prompt"], row["prompt"] + row[side], tools, f"prompt+{side}") for side in sides]
    if spec.name == "trl-sft" and opts.sft_layout == "prompt-completion":
        messages = row["prompt"] + row["completion"]
        trained = [k >= len(row["prompt"]) for k, m in enumerate(messages) if m["role"] == "assistant"]
        return [_assistant_view(chat, messages, trained, tools, "prompt+completion")]
    messages = row["messages"]
    if spec.name == "openai":
        trained = [m["weight"] == 1 for m in messages if m["role"] == "assistant"]
        messages = [_message({**{k: v for k, v in m.items() if k != "weight"},
                              "tool_calls": [dict(c, function=dict(c["function"])) for c in m.get("tool_calls") or ()]
                              or None}) for m in messages]
    else:
        trained = [True for m in messages if m["role"] == "assistant"]
    return [_assistant_view(chat, messages, trained, tools, "messages")]

