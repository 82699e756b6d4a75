"""Recorded token truth in exports: the ids each model call was fed and produced (`usage.tokens`).

Training on text means tokenizing it again, and a re-tokenization need not give the tokens the model
produced (a token boundary chosen differently, a template that renders a tool call other than the model
wrote it). Where a backend recorded the ids (`llm.token_ids`), exports train those:

- `tokenized`: a generated record's row for a model call (its request, then its answer) is the call's
  recorded `prompt_ids + completion_ids`, loss on the completion (`--tokens recorded`, the default), or
  the chosen template's render (`--tokens rendered`). Either way the row is compared with a fresh render,
  and the card counts the rows whose render differs from the recorded ids, with the position of the first
  difference. Ids of another tokenizer than the export's (`same_vocabulary`) are never used: such rows
  are rendered and counted apart.
- `rl`: per trajectory, the model's turns as an RL trainer's rollout holds them (`rl_rows`).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from converters.export.options import FormatOptions
from converters.export.records import Record
from converters.export.render import Unrenderable

TOKEN_SOURCES = ("recorded", "rendered")
NO_TOKENS = "no recorded token ids (generated without llm.token_ids, or by a backend that gives none)"
# How many rows whose render differs from the recorded ids the card names.
DRIFT_EXAMPLES = 10


def message_tokens(record: Record, steps: range) -> dict[str, Any] | None:
    """The recorded token truth of the model call behind a message (its steps), or None."""
    for j in steps:
        if (tokens := record.tokens(j)) is not None:
            return tokens
    return None


def same_vocabulary(tokenizer: Any, prompt_ids: list[int], messages: list[dict[str, Any]]) -> bool:
    """Whether recorded prompt ids are ids of `tokenizer`: decoded with it, they hold every system, user and tool
    message's text verbatim, as any chat template renders it. Another model's ids (a teacher's, a served model's
    other tokenizer) decode to other text: training on them would teach nonsense."""
    try:
        text = tokenizer.decode(prompt_ids, clean_up_tokenization_spaces=False)
    except (IndexError, OverflowError, TypeError, ValueError):
        return False
    return all(m["content"] in text for m in messages
               if m["role"] in ("system", "user", "tool") and isinstance(m.get("content"), str) and m["content"])


def first_difference(recorded: list[int], rendered: list[int]) -> int | None:
    """The first position where a fresh render departs from the recorded ids, None where it begins with all
    of them (a template may render more after the model's end token: nobody trained those)."""
    for i, (a, b) in enumerate(zip(recorded, rendered)):
        if a != b:
            return i
    return None if len(rendered) >= len(recorded) else len(rendered)


def drift(record_id: str, step: int, position: int, recorded: list[int], rendered: list[int],
          decode: Any) -> dict[str, Any]:
    """Where a row's render first departs from its recorded ids, for the card."""
    def at(ids: list[int]) -> str:
        return decode(ids[position:position + 1]) if position < len(ids) else "(end)"
    return {"id": record_id, "step": step, "position": position, "recorded": at(recorded), "rendered": at(rendered)}


# ---- --format rl ---------------------------------------------------------------------------------------


def rl_schema(opts: FormatOptions) -> pa.Schema:
    return pa.schema([
        ("id", pa.string()), ("source", pa.string()), ("segment", pa.int32()), ("steps", pa.list_(pa.int32())),
        ("prompt_ids", pa.list_(pa.int32())), ("completion_ids", pa.list_(pa.int32())),
        ("completion_mask", pa.list_(pa.int8())), ("completion_logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()), ("step_rewards", pa.list_(pa.float64())),
        ("tokenizer", pa.string()), ("chat_template", pa.string()),
    ])


def _calls(record: Record) -> list[tuple[int, dict[str, Any]]]:
    """(step, token truth) of each model call, in order; a call that made several steps counts once."""
    calls: list[tuple[int, dict[str, Any]]] = []
    for j in range(len(record)):
        tokens = record.tokens(j)
        if tokens is not None and not (calls and calls[-1][1] == tokens):
            calls.append((j, tokens))
    return calls


def rl_rows(record: Record, opts: FormatOptions) -> list[dict[str, Any]]:
    """The record's model turns as rollouts: one row per run of calls whose prompts extend each other.

    A call whose prompt begins with everything before it (the previous prompt, the model's completion) joins
    the row: the tokens between (tool results, user turns, the template's headers) go into `completion_ids`
    with mask 0 and logprob 0, the model's own with mask 1 (0 on a step that is loss-masked or rewritten).
    A call whose prompt does not (a history window that dropped turns, a re-rendered request) starts a row.
    """
    calls = _calls(record)
    if not calls:
        raise Unrenderable(NO_TOKENS)
    rewritten = record.rewritten()
    rows: list[dict[str, Any]] = []
    row: dict[str, Any] | None = None
    sequence: list[int] = []
    for step, t in calls:
        prompt, completion = t["prompt_ids"], t["completion_ids"]
        trained = record.step("train", step) is not False and step not in rewritten
        logprobs = t["logprobs"]
        if row is None or prompt[:len(sequence)] != sequence:
            row = {"id": record.id, "source": record.source, "segment": len(rows), "steps": [],
                   "prompt_ids": list(prompt), "completion_ids": [], "completion_mask": [], "completion_logprobs": [],
                   "reward": record.reward, "step_rewards": [], "tokenizer": t["tokenizer"],
                   "chat_template": t["chat_template"]}
            rows.append(row)
            sequence = list(prompt)
        between = prompt[len(sequence):]
        row["steps"].append(step)
        row["step_rewards"].append(record.step("reward", step))
        row["completion_ids"] += [*between, *completion]
        row["completion_mask"] += [0] * len(between) + [int(trained)] * len(completion)
        if row["completion_logprobs"] is not None:
            row["completion_logprobs"] = None if logprobs is None else \
                row["completion_logprobs"] + [0.0] * len(between) + list(logprobs)
        sequence = [*prompt, *completion]
    return rows
