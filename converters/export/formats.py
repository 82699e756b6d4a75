"""The export formats: what each reads, its row function, its Arrow schema and file type.

Schemas are explicit (not inferred) so every shard of an export has the same columns and types,
including all-null ones, and `datasets` loads them as one table. Messages are structs with a
fixed set of keys (`role`, `content`, `tool_calls`, `tool_call_id`, `reasoning_content` when
reasoning is kept, `train` in the SFT messages layout); keys that do not apply are null, and
`apply_chat_template` drops null keys before a template sees them.

Tool-call `arguments` are stored as Arrow's canonical JSON extension type (`arrow.json`): the
bytes are JSON text, so the column holds any object whatever its keys (no map type, no struct
per distinct schema), and `datasets` >= 4 loads it as its `Json` feature, i.e. as the mapping chat
templates expect (`arguments | items`, `arguments | tojson`). DuckDB reads it as `JSON`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

import numpy as np
import pyarrow as pa

from converters.export.atif import atif_rows
from converters.export.dpo import dpo_rows
from converters.export.kto import kto_rows
from converters.export.openai_chat import openai_rows
from converters.export.options import FormatOptions
from converters.export.render import Conversation
from converters.export.sft import sft_batch
from converters.export.sharegpt import sharegpt_rows
from converters.export.tokenized import tokenized_rows
from converters.export.tokens import rl_rows, rl_schema

_S = pa.string()

TOOL_CALL_TYPE = pa.struct([
    pa.field("id", _S),
    pa.field("type", _S),
    pa.field("function", pa.struct([pa.field("name", _S), pa.field("arguments", pa.json_())])),
])


def message_type(reasoning: bool, train: bool = False) -> pa.StructType:
    fields = [
        pa.field("role", _S),
        pa.field("content", _S),
        pa.field("tool_calls", pa.list_(TOOL_CALL_TYPE)),
        pa.field("tool_call_id", _S),
    ]
    if reasoning:
        fields.append(pa.field("reasoning_content", _S))
    if train:
        fields.append(pa.field("train", pa.bool_()))
    return pa.struct(fields)


# The conversation columns of each format, measured for the card.
CONVERSATION_COLUMNS: dict[str, Callable[[FormatOptions], list[str]]] = {
    "trl-sft": lambda o: ["messages"] if o.sft_layout == "messages" else ["prompt", "completion"],
    "trl-dpo": lambda o: ["prompt", "chosen", "rejected"],
    "trl-kto": lambda o: ["prompt", "completion"],
    "sharegpt": lambda o: ["conversations"],
    "openai": lambda o: ["messages"],
    "tokenized": lambda o: ["input_ids"],
}


def is_conversation(data_type: pa.DataType) -> bool:
    """A column of rendered messages (filled from the message buffer, not from Python values)."""
    return pa.types.is_list(data_type) and pa.types.is_struct(data_type.value_type) \
        and data_type.value_type.get_field_index("role") >= 0


def _conv(opts: FormatOptions, train: bool = False) -> pa.DataType:
    return pa.list_(message_type(opts.render.reasoning, train))


def _sft_schema(opts: FormatOptions) -> pa.Schema:
    if opts.sft_layout == "messages":
        return pa.schema([("id", _S), ("source", _S), ("messages", _conv(opts, train=True)), ("tools", _S)])
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


def _tokenized_schema(opts: FormatOptions) -> pa.Schema:
    return pa.schema([("id", _S), ("source", _S), ("input_ids", pa.list_(pa.int32())),
                      ("assistant_masks", pa.list_(pa.int8())), ("dropped_turns", pa.int32()),
                      ("token_source", _S), ("drift_at", pa.int32())])


@dataclass(frozen=True)
class Format:
    name: str
    table: Literal["trajectories", "pairs"]
    file_type: Literal["parquet", "jsonl"]
    # Per record: (record, opts) -> rows, or (pair, chosen, rejected, opts) -> rows for pairs.
    rows: Callable[..., list[dict[str, Any]]] | None
    schema: Callable[[FormatOptions], pa.Schema] | None
    description: str
    # Reasoning is kept unless the format cannot carry it.
    keeps_reasoning: bool = True
    # Supervised formats train on every row: they leave out failed trajectories by default.
    supervised: bool = False
    # A whole batch at once: (batch, opts, schema, selected) -> (reasons, rows, row owners).
    batch: Callable[..., Any] | None = None
    # Trajectory columns the rows need beyond the exporter's default set (records.COLUMNS).
    columns: tuple[str, ...] = ()


FORMATS: dict[str, Format] = {
    f.name: f
    for f in [
        Format("trl-sft", "trajectories", "parquet", None, _sft_schema,
               "TRL SFTTrainer, conversational: `prompt`/`completion` (+ `tools`), one row per trainable segment, "
               "or `messages` (+ `tools`), whose trajectories have no masked step.", supervised=True,
               batch=sft_batch),
        Format("trl-dpo", "pairs", "parquet", dpo_rows, _dpo_schema,
               "TRL DPOTrainer, conversational: `prompt` (the shared history), `chosen`, `rejected` (+ `tools`)."),
        Format("trl-kto", "trajectories", "parquet", kto_rows, _kto_schema,
               "TRL KTOTrainer, conversational: `prompt`, `completion` (one assistant message), `label` (bool)."),
        Format("openai", "trajectories", "jsonl", openai_rows, None,
               "OpenAI chat fine-tuning JSONL: `messages` (assistant `weight` 0 on masked steps) and `tools`.",
               keeps_reasoning=False, supervised=True),
        Format("sharegpt", "trajectories", "parquet", sharegpt_rows, _sharegpt_schema,
               "ShareGPT / LLaMA-Factory: `conversations` of `{from, value}`, `system`, `tools` (JSON text).",
               supervised=True),
        Format("tokenized", "trajectories", "parquet", tokenized_rows, _tokenized_schema,
               "Token ids and an exact `assistant_masks` from your tokenizer's chat template (TRL SFTTrainer, "
               "pre-tokenized).", supervised=True),
        Format("rl", "trajectories", "parquet", rl_rows, rl_schema,
               "RL rollouts from the recorded token ids: per trajectory and run of model turns, `prompt_ids`, "
               "`completion_ids`, `completion_mask` (0 on environment and user tokens), `completion_logprobs`, "
               "`reward`, `step_rewards` (verifiers' RolloutOutput names; SkyRL's in the card)."),
        Format("atif", "trajectories", "jsonl", atif_rows, None,
               "Harbor's Agent Trajectory Interchange Format (ATIF-v1.4): one trajectory per line, for ATIF viewers "
               "and tools; `trajforge convert --source atif` reads it back.", columns=("details",)),
    ]
}


def _conversations(convs: list[Conversation], list_type: pa.ListType) -> pa.ListArray:
    """One list of messages per conversation, taken from the rendered batches they point into."""
    lengths = np.fromiter((len(c.idx) for c in convs), dtype=np.int64, count=len(convs))
    offsets = np.r_[0, np.cumsum(lengths)]
    parts = []
    batches: dict[int, tuple[Any, list[int]]] = {}
    for k, conv in enumerate(convs):
        batches.setdefault(id(conv.r), (conv.r, []))[1].append(k)
    if len(batches) == 1:
        rendered = convs[0].r
        indices = np.fromiter((m for c in convs for m in c.idx), dtype=np.int64, count=int(offsets[-1]))
        values = rendered.to_arrow(list_type.value_type, indices)
    else:  # pairs: prompt and chosen from one batch, rejected from another
        order = np.fromiter((k for _, ks in batches.values() for k in ks), dtype=np.int64, count=len(convs))
        for rendered, ks in batches.values():
            indices = np.fromiter((m for k in ks for m in convs[k].idx), dtype=np.int64)
            parts.append(rendered.to_arrow(list_type.value_type, indices))
        grouped = pa.concat_arrays(parts)
        starts = np.r_[0, np.cumsum(lengths[order])][:-1]
        position = np.empty(len(convs), dtype=np.int64)
        position[order] = starts
        values = grouped.take(pa.array(np.repeat(position - offsets[:-1], lengths) + np.arange(offsets[-1])))
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values, type=list_type)


def rows_to_batch(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.RecordBatch:
    """Rows -> one Arrow batch; conversation columns are taken from their rendered batches in one pass."""
    arrays = []
    for field in schema:
        values = [row[field.name] for row in rows]
        if not is_conversation(field.type):
            arrays.append(pa.array(values, field.type))
            continue
        arrays.append(_conversations(values, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
