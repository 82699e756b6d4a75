"""The export formats: what each reads, its row function, its Arrow schema and file type.

Schemas are explicit (not inferred) so every shard of an export has the same columns and types,
including all-null ones, and `datasets` loads them as one table. Messages are structs with a
fixed set of keys (`role`, `content`, `tool_calls`, `tool_call_id`, and `reasoning_content` when
reasoning is kept); keys that do not apply are null.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

import pyarrow as pa

from converters.export.dpo import dpo_rows
from converters.export.kto import kto_rows
from converters.export.openai_chat import openai_rows
from converters.export.options import FormatOptions
from converters.export.sft import sft_rows
from converters.export.sharegpt import sharegpt_rows

_S = pa.string()

TOOL_CALL_TYPE = pa.struct([
    pa.field("id", _S),
    pa.field("type", _S),
    pa.field("function", pa.struct([pa.field("name", _S), pa.field("arguments", _S)])),
])


def message_type(reasoning: bool) -> pa.DataType:
    fields = [
        pa.field("role", _S),
        pa.field("content", _S),
        pa.field("tool_calls", pa.list_(TOOL_CALL_TYPE)),
        pa.field("tool_call_id", _S),
    ]
    if reasoning:
        fields.append(pa.field("reasoning_content", _S))
    return pa.struct(fields)


def _conv(opts: FormatOptions) -> pa.DataType:
    return pa.list_(message_type(opts.render.reasoning))


def _sft_schema(opts: FormatOptions) -> pa.Schema:
    if opts.sft_layout == "messages":
        return pa.schema([("id", _S), ("source", _S), ("messages", _conv(opts)), ("tools", _S)])
    return pa.schema([("id", _S), ("source", _S), ("segment", pa.int32()), ("prompt", _conv(opts)),
                      ("completion", _conv(opts)), ("tools", _S)])


def _dpo_schema(opts: FormatOptions) -> pa.Schema:
    return pa.schema([("id", _S), ("source", _S), ("level", _S), ("chosen_id", _S), ("rejected_id", _S),
                      ("prompt", _conv(opts)), ("chosen", _conv(opts)), ("rejected", _conv(opts)), ("tools", _S)])


def _kto_schema(opts: FormatOptions) -> pa.Schema:
    return pa.schema([("id", _S), ("source", _S), ("step", pa.int32()), ("prompt", _conv(opts)),
                      ("completion", _conv(opts)), ("label", pa.bool_()), ("tools", _S)])


def _sharegpt_schema(opts: FormatOptions) -> pa.Schema:
    turn = pa.struct([pa.field("from", _S), pa.field("value", _S)])
    return pa.schema([("id", _S), ("source", _S), ("conversations", pa.list_(turn)), ("system", _S), ("tools", _S)])


@dataclass(frozen=True)
class Format:
    name: str
    table: Literal["trajectories", "pairs"]
    file_type: Literal["parquet", "jsonl"]
    rows: Callable[..., list[dict[str, Any]]]
    schema: Callable[[FormatOptions], pa.Schema] | None
    description: str
    # Reasoning is kept unless the format cannot carry it.
    keeps_reasoning: bool = True


FORMATS: dict[str, Format] = {
    f.name: f
    for f in [
        Format("trl-sft", "trajectories", "parquet", sft_rows, _sft_schema,
               "TRL SFTTrainer, conversational: `messages` (+ `tools`), or `prompt`/`completion` when the "
               "input has loss-masked steps (loss on the completion only)."),
        Format("trl-dpo", "pairs", "parquet", dpo_rows, _dpo_schema,
               "TRL DPOTrainer, conversational: `prompt` (the shared prefix), `chosen`, `rejected` (+ `tools`)."),
        Format("trl-kto", "trajectories", "parquet", kto_rows, _kto_schema,
               "TRL KTOTrainer, conversational: `prompt`, `completion`, `label` (bool) per labeled step "
               "or per trajectory (success)."),
        Format("openai", "trajectories", "jsonl", openai_rows, None,
               "OpenAI chat fine-tuning JSONL: `messages` (assistant `weight` 0 on masked steps) and `tools`.",
               keeps_reasoning=False),
        Format("sharegpt", "trajectories", "parquet", sharegpt_rows, _sharegpt_schema,
               "ShareGPT / LLaMA-Factory: `conversations` of `{from, value}`, `system`, `tools` (JSON string)."),
    ]
}
