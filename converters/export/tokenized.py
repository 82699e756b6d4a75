"""`tokenized`: `input_ids` + an exact `assistant_masks`, built with the user's tokenizer and chat template.

The one export whose loss mask does not depend on the trainer's flags: TRL's SFTTrainer takes a
dataset with `input_ids` as already processed and turns `assistant_masks` into labels (-100
where 0) whatever `assistant_only_loss` / `completion_only_loss` say. A token is 1 exactly when
it belongs to a trainable assistant message (`train = true`); tool results, user and system
turns, the template's role headers and masked steps are 0.

How a message's tokens are found, in this order:
1. the tokenizer's chat template has `{% generation %}` markers: each marked span is one
   assistant message, tokens as `apply_chat_template(return_assistant_tokens_mask=True)` gives
   them (same rendering, same `char_to_token` rule), then the spans of masked messages are zeroed;
2. it has none but TRL knows its model family: TRL's bundled training template with markers for
   it (`trl.chat_template_utils.get_training_chat_template`), as SFTTrainer itself swaps in with
   `assistant_only_loss=True`;
3. otherwise each assistant message's span is found by rendering the conversation up to it (with
   the generation prompt) and through it; a template that renders earlier messages differently
   depending on what follows cannot be used this way and the export stops with one line.

`--max-length N` truncates by turns: a conversation longer than N tokens keeps its messages up to
the last assistant message that still fits and is rendered again from those (never cut inside a
message or a token, never without the context before the kept turns); `dropped_turns` says how
many messages were dropped. A conversation whose first trainable assistant message does not fit
is skipped. Messages after the last assistant message are left out, as everywhere.

Every row is checked against the template it is rendered with (`templates.row_problem`): each
trainable assistant message must render its text and tool calls, and the row's tools must render
where it has them. A template that cannot (TRL's `llama3_training` renders neither tool calls nor
tools) stops the export with one line naming the record, or, with `--skip-unfit-rows`, the row is
skipped with the reason; so the masks of every exported row are exact.

Rows of model calls that recorded their token ids take those ids (`--tokens recorded`, the default;
see `converters.export.tokens`): `token_source` says which each row holds, `drift_at` where the fresh
render first departs from the recorded ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converters.export.options import FormatOptions
from converters.export.records import Record
from converters.export.render import Unrenderable
from converters.export.templates import row_problem
from converters.export.tokens import drift, first_difference, message_tokens, same_vocabulary

_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


class TokenizerError(Exception):
    """The tokenizer cannot be used for exact masks; the message is one line."""


@dataclass
class Encoded:
    input_ids: list[int]
    mask: list[int]  # 1 on the tokens of trainable assistant messages
    spans: list[tuple[int, int]]  # token [start, end) of each assistant message, in order
    text: str = ""  # the rendered conversation
    char_spans: list[tuple[int, int]] | None = None  # character [start, end) of each assistant message


def has_generation_markers(template: str) -> bool:
    return _MARKER.search(template) is not None


class ChatTokenizer:
    """A tokenizer and the chat template that gives exact per-message token spans."""

    def __init__(self, tokenizer: Any, max_length: int | None = None, name: str | None = None) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise TokenizerError("the tokenizer is not a fast (Rust) tokenizer; exact masks need character offsets")
        if not tokenizer.chat_template:
            raise TokenizerError("the tokenizer has no chat template")
        if max_length is not None and max_length < 1:
            raise TokenizerError(f"--max-length must be >= 1, got {max_length}")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.name = name or getattr(tokenizer, "name_or_path", "") or "tokenizer"
        own = tokenizer.get_chat_template()
        self.template: str | None = None  # None: the tokenizer's own
        self.uses_markers = True
        if has_generation_markers(own):
            self.method = "the tokenizer's chat template (generation markers)"
        elif (trained := _trl_training_template(tokenizer)) is not None:
            self.template, self.method = trained
        else:
            self.uses_markers = False
            self.method = "the tokenizer's chat template (message spans by prefix rendering)"

    @classmethod
    def load(cls, spec: str | Path, max_length: int | None = None) -> "ChatTokenizer":
        """A tokenizer from a local directory (or a hub name where the hub is reachable)."""
        try:
            from transformers import AutoTokenizer
        except ImportError:  # pragma: no cover - transformers comes with the train extra
            raise TokenizerError("--format tokenized needs transformers (pip install trajforge[train])") from None
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(spec))
        except (OSError, ValueError) as exc:
            raise TokenizerError(f"cannot load tokenizer {spec}: {str(exc).splitlines()[0]}") from None
        return cls(tokenizer, max_length, name=str(spec))

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                add_generation_prompt: bool = False) -> tuple[str, list[tuple[int, int]]]:
        from transformers.utils.chat_template_utils import render_jinja_template

        template = self.template or self.tokenizer.get_chat_template(None, tools)
        clean = [{k: v for k, v in m.items() if v is not None} for m in messages]
        rendered, indices = render_jinja_template(
            conversations=[clean], tools=tools, chat_template=template, return_assistant_tokens_mask=self.uses_markers,
            add_generation_prompt=add_generation_prompt, **self.tokenizer.special_tokens_map)
        return rendered[0], list(indices[0]) if indices else []

    def _char_spans(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    assistant: list[int]) -> tuple[str, list[tuple[int, int]]]:
        text, spans = self._render(messages, tools)
        if self.uses_markers:
            if len(spans) != len(assistant):
                raise TokenizerError(f"the chat template marks {len(spans)} generation spans for {len(assistant)} "
                                     "assistant messages; it must wrap each assistant message once")
            return text, spans
        spans = []
        for k in assistant:
            before, _ = self._render(messages[:k], tools, add_generation_prompt=True)
            through, _ = self._render(messages[: k + 1], tools)
            if not (through.startswith(before) and text.startswith(through)):
                raise TokenizerError("the chat template has no {% generation %} markers and renders earlier messages "
                                     "differently depending on what follows; add generation markers to it")
            spans.append((len(before), len(through)))
        return text, spans

    def encode(self, messages: list[dict[str, Any]], trainable: list[bool],
               tools: list[dict[str, Any]] | None = None) -> Encoded:
        """Token ids of the conversation and the mask of its trainable assistant messages.

        `trainable[j]` belongs to the j-th assistant message. Arguments must be mappings."""
        assistant = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        text, char_spans = self._char_spans(messages, tools, assistant)
        enc = self.tokenizer(text, add_special_tokens=False)
        ids = list(enc["input_ids"])
        mask = [0] * len(ids)
        spans = []
        # The rule of transformers' apply_chat_template(return_assistant_tokens_mask=True).
        for (start_char, end_char), train in zip(char_spans, trainable):
            start = enc.char_to_token(start_char) if start_char < len(text) else None
            end = enc.char_to_token(end_char - 1) if end_char > start_char else None
            if start is None:
                spans.append((len(ids), len(ids)))
                continue
            stop = end + 1 if end else len(ids)
            spans.append((start, stop))
            if train:
                mask[start:stop] = [1] * (stop - start)
        return Encoded(ids, mask, spans, text, list(char_spans))

    def text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The conversation as the chat template renders it."""
        return self._render(messages, tools)[0]

    def tokenize(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                 add_generation_prompt: bool = False) -> list[int]:
        text, _ = self._render(messages, tools, add_generation_prompt)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def token_strings(self, ids: list[int]) -> list[str]:
        """Each token decoded on its own (what a viewer shows)."""
        return [self.tokenizer.decode([i]) for i in ids]


def _trl_training_template(tokenizer: Any) -> tuple[str, str] | None:
    try:
        from trl.chat_template_utils import get_training_chat_template
    except ImportError:
        return None
    try:
        template = get_training_chat_template(tokenizer)
    except ValueError:  # a template TRL does not know
        return None
    if template is None:
        return None
    import trl

    folder = Path(trl.__file__).parent / "chat_templates"
    name = next((p.stem for p in sorted(folder.glob("*_training.jinja")) if p.read_text(encoding="utf-8") == template),
                "training template")
    return template, f"TRL {trl.__version__}'s `{name}` (generation markers), as SFTTrainer swaps in"


def request_rows(record: Record, opts: FormatOptions, tok: ChatTokenizer) -> list[dict[str, Any]]:
    """One row per trainable assistant message: its request (as sent), then it, trained alone. Where the model
    call recorded its ids (`converters.export.tokens`), `--tokens recorded` takes them (loss on the completion),
    and the row says where the fresh render departs from them (`drift_at`, null where it does not)."""
    from converters.export.sft import trained_requests

    settings = record.settings
    assert settings is not None
    sent = record.render_request()
    answered = record.render(opts.render)  # the same messages; the answer's reasoning as the export keeps it
    tools = record.openai_tools() or None
    rows, too_long = [], 0
    for prompt, k in trained_requests(sent, settings):
        if not prompt:
            continue
        messages = sent[prompt].messages(object_arguments=True) + answered[k:k + 1].messages(object_arguments=True)
        trainable = [False] * (sum(1 for m in messages if m["role"] == "assistant") - 1) + [True]
        enc = tok.encode(messages, trainable, tools)
        row = {"id": record.id, "source": record.source, "input_ids": enc.input_ids, "assistant_masks": enc.mask,
               "dropped_turns": 0, "token_source": "rendered", "drift_at": None}
        # A rewritten step's ids are of another request than the record's (or another writer's): never used.
        recorded = None if set(sent.steps(k)) & record.rewritten() else message_tokens(record, sent.steps(k))
        if recorded is not None:
            template = recorded["chat_template"]
            row["_recorded_by"] = f"{recorded['tokenizer']}, " + (f"chat template {template}" if template else
                                                                  "the server's chat template")
            if not same_vocabulary(tok.tokenizer, recorded["prompt_ids"], messages[:-1]):
                row["_foreign"] = True
                recorded = None
        if recorded is not None:
            ids = recorded["prompt_ids"] + recorded["completion_ids"]
            row["drift_at"] = first_difference(ids, enc.input_ids)
            if row["drift_at"] is not None:
                row["_drift"] = drift(record.id, sent.first_step(k), row["drift_at"], ids, enc.input_ids,
                                      tok.tokenizer.decode)
            if opts.tokens == "recorded":
                row.update(input_ids=ids, token_source="recorded",
                           assistant_masks=[0] * len(recorded["prompt_ids"]) + [1] * len(recorded["completion_ids"]))
        if tok.max_length is not None and len(row["input_ids"]) > tok.max_length:
            too_long += 1
            continue
        rows.append(row)
    if not rows:
        raise Unrenderable("no request fits in --max-length" if too_long else "no trainable assistant turn")
    return rows


def tokenized_rows(record: Record, opts: FormatOptions) -> list[dict[str, Any]]:
    tok = opts.tokenizer
    assert tok is not None, "the driver loads the tokenizer for --format tokenized"
    if record.settings is not None and opts.history == "request":
        return request_rows(record, opts, tok)
    conv = record.render(opts.render).through_last_assistant()
    positions = conv.assistant_positions()
    trainable = [conv.train(k) for k in positions]
    if not any(trainable):
        raise Unrenderable("no trainable assistant turn")
    messages = conv.messages(object_arguments=True)
    tools = record.openai_tools() or None
    enc = tok.encode(messages, trainable, tools)
    dropped = 0
    if tok.max_length is not None and len(enc.input_ids) > tok.max_length:
        enc, dropped = _truncate(tok, messages, positions, trainable, tools, enc)
    kept = messages[: len(messages) - dropped]
    assert enc.char_spans is not None
    problem = row_problem(enc.text, enc.char_spans, kept, trainable, tok.text(kept, None) if tools else None)
    if problem is not None:
        if opts.skip_unfit:
            raise Unrenderable(f"{problem} with the chat template")
        raise TokenizerError(f"record {record.id}: {problem} with {tok.method}; use a chat template that renders tool "
                             "calls and tools (e.g. TRL's qwen3_training), or --skip-unfit-rows to leave such rows out")
    return [{"id": record.id, "source": record.source, "input_ids": enc.input_ids, "assistant_masks": enc.mask,
             "dropped_turns": dropped, "token_source": "rendered", "drift_at": None}]


def _truncate(tok: ChatTokenizer, messages: list[dict[str, Any]], positions: list[int], trainable: list[bool],
              tools: list[dict[str, Any]] | None, enc: Encoded) -> tuple[Encoded, int]:
    """Keep messages through the last assistant message that fits (see module docstring)."""
    assert tok.max_length is not None
    first_trainable = trainable.index(True)
    for j in range(len(positions) - 1, first_trainable - 1, -1):
        if enc.spans[j][1] > tok.max_length:
            continue
        kept = messages[: positions[j] + 1]
        shorter = tok.encode(kept, trainable[: j + 1], tools)
        if len(shorter.input_ids) <= tok.max_length:
            return shorter, len(messages) - len(kept)
    raise Unrenderable("first trainable assistant turn does not fit in --max-length")
