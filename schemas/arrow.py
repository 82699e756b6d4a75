"""The Arrow schema of each table, derived from the models, and row <-> model conversion.

No map types (`datasets` rejects them): free-form values (tool arguments, JSON tool
output, parameters, extras, details) are JSON strings. A step is one struct whose
`kind` says which of its fields are set.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from schemas import jsonutil
from schemas.models import (
    FilterDecision,
    Filtered,
    ImageRef,
    Pair,
    Provenance,
    Quarantined,
    Trajectory,
)

_TIMESTAMP = pa.timestamp("us", tz="UTC")

IMAGE_TYPE = pa.struct(
    [
        pa.field("path", pa.string()),
        pa.field("source", pa.string()),
        pa.field("annotations", pa.string()),  # JSON list of annotations
    ]
)

# A step's model call (schemas.models.Usage); null on steps no model made. Added in 1.1 after the
# first datasets were written: shards without it read as null (see `readable_as`).
# The call's token truth (schemas.models.Tokens), added after 1.1's first datasets: null where absent.
TOKENS_TYPE = pa.struct(
    [
        pa.field("prompt_ids", pa.list_(pa.int32())),
        pa.field("completion_ids", pa.list_(pa.int32())),
        pa.field("logprobs", pa.list_(pa.float32())),
        pa.field("tokenizer", pa.string()),
        pa.field("chat_template", pa.string()),
    ]
)

USAGE_TYPE = pa.struct(
    [
        pa.field("model", pa.string()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("completion_tokens", pa.int64()),
        pa.field("latency_s", pa.float64()),
        pa.field("retries", pa.int64()),
        pa.field("cost_usd", pa.float64()),
        pa.field("cached", pa.bool_()),
        pa.field("tokens", TOKENS_TYPE),
    ]
)

STEP_TYPE = pa.struct(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("tool_call_id", pa.string()),
        pa.field("thought", pa.string()),
        pa.field("reasoning", pa.string()),
        pa.field("function", pa.string()),
        pa.field("arguments", pa.string()),  # JSON object
        pa.field("language", pa.string()),
        pa.field("content", pa.string()),  # JSON for kind == "json"
        pa.field("source", pa.string()),
        pa.field("name", pa.string()),
        pa.field("url", pa.string()),
        pa.field("html", pa.string()),
        pa.field("axtree", pa.string()),
        pa.field("image", IMAGE_TYPE),
        pa.field("viewport", pa.list_(pa.int32())),
        pa.field("reward", pa.float64()),
        pa.field("label", pa.string()),
        pa.field("train", pa.bool_()),
        pa.field("extra", pa.string()),  # JSON object
        pa.field("usage", USAGE_TYPE),
    ]
)

TOOL_TYPE = pa.struct(
    [
        pa.field("name", pa.string()),
        pa.field("description", pa.string()),
        pa.field("parameters", pa.string()),  # JSON Schema as JSON
    ]
)

PROVENANCE_TYPE = pa.struct(
    [
        pa.field("method", pa.string()),
        pa.field("source_dataset", pa.string()),
        pa.field("source_id", pa.string()),
        pa.field("source_format", pa.string()),
        pa.field("model", pa.string()),
        pa.field("prompt_template_hash", pa.string()),
        pa.field("seed", pa.int64()),
        pa.field("task_id", pa.string()),
        pa.field("parent_ids", pa.list_(pa.string())),
        pa.field("trajforge_version", pa.string()),
        pa.field("created_at", _TIMESTAMP),
        pa.field("schema_version", pa.string()),
        pa.field("task_split", pa.string()),
    ]
)

TRAJECTORY_FIELDS = [
    pa.field("id", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("steps", pa.list_(STEP_TYPE)),
    pa.field("tools", pa.list_(TOOL_TYPE)),
    pa.field("reward", pa.float64()),
    pa.field("success", pa.bool_()),
    pa.field("provenance", PROVENANCE_TYPE),
    pa.field("details", pa.string()),  # JSON object
]
TRAJECTORY_SCHEMA = pa.schema(TRAJECTORY_FIELDS)

PAIR_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("chosen_id", pa.string(), nullable=False),
        pa.field("rejected_id", pa.string(), nullable=False),
        pa.field("prefix_len", pa.int32(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("level", pa.string()),
        pa.field("chosen_reward", pa.float64()),
        pa.field("rejected_reward", pa.float64()),
        pa.field("provenance", PROVENANCE_TYPE),
        pa.field("details", pa.string()),
    ]
)

QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("error", pa.string(), nullable=False),
        pa.field("raw", pa.string()),
        pa.field("location", pa.string()),
        pa.field("created_at", _TIMESTAMP),
    ]
)

# A dropped trajectory keeps all its columns, plus the decision that dropped it.
FILTERED_SCHEMA = pa.schema(
    TRAJECTORY_FIELDS
    + [
        pa.field("filter", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("score", pa.float64()),
    ]
)


def readable_as(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Whether a column written as `actual` reads as `expected` with nothing lost.

    Equal types, or an older struct: every field it has is in `expected` (in the same order, of a
    readable type) and the fields it lacks are nullable, so a cast fills them with nulls (a step
    written before `usage` existed has none). Lists compare their items.
    """
    if actual.equals(expected):
        return True
    if pa.types.is_list(actual) and pa.types.is_list(expected):
        return readable_as(actual.value_type, expected.value_type)
    if not (pa.types.is_struct(actual) and pa.types.is_struct(expected)):
        return False
    names = [f.name for f in expected]
    at = -1
    for field in actual:
        if field.name not in names or names.index(field.name) <= at:
            return False
        at = names.index(field.name)
        if not readable_as(field.type, expected.field(field.name).type):
            return False
    have = {f.name for f in actual}
    return all(f.nullable for f in expected if f.name not in have)


def as_current(data: pa.RecordBatch | pa.Table, schema: pa.Schema) -> pa.RecordBatch | pa.Table:
    """`data` (columns of `schema`, some maybe of an older readable type) cast to `schema`'s types."""
    target = pa.schema([schema.field(name) for name in data.schema.names])
    return data if data.schema.equals(target) else data.cast(target)


def _json_or_none(value: Any) -> str | None:
    return jsonutil.dumps(value) if value else None


def _image_row(image: ImageRef | None) -> dict[str, Any] | None:
    if image is None:
        return None
    annotations = None
    if image.annotations is not None:
        annotations = jsonutil.dumps([a.model_dump() for a in image.annotations])
    return {"path": image.path, "source": image.source, "annotations": annotations}


def step_to_row(step: Any) -> dict[str, Any]:
    kind = step.kind
    row: dict[str, Any] = {
        "kind": kind,
        "tool_call_id": step.tool_call_id,
        "reward": step.reward,
        "label": step.label,
        "train": step.train,
        "extra": _json_or_none(step.extra),
        "usage": step.usage.model_dump() if step.usage is not None else None,
    }
    if kind in ("api", "code", "message"):
        row["thought"] = step.thought
        row["reasoning"] = step.reasoning
    if kind == "api":
        row["function"] = step.function
        row["arguments"] = jsonutil.dumps(step.arguments)
    elif kind == "code":
        row["language"] = step.language
        row["content"] = step.content
    elif kind == "message":
        row["content"] = step.content
    elif kind == "text":
        row["content"] = step.content
        row["source"] = step.source
        row["name"] = step.name
    elif kind == "json":
        row["content"] = jsonutil.dumps(step.content)
        row["source"] = step.source
        row["name"] = step.name
    elif kind == "image":
        row["image"] = _image_row(step.image)
    elif kind == "web":
        row["url"] = step.url
        row["html"] = step.html
        row["axtree"] = step.axtree
        row["image"] = _image_row(step.screenshot)
        row["viewport"] = list(step.viewport) if step.viewport is not None else None
    return row


def _image_from_row(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    annotations = row.get("annotations")
    return {
        "path": row["path"],
        "source": row.get("source") or "environment",
        "annotations": jsonutil.loads(annotations) if annotations is not None else None,
    }


def step_from_row(row: dict[str, Any]) -> dict[str, Any]:
    """Arrow step struct -> the model's dict form (validated by the caller)."""
    kind = row["kind"]
    out: dict[str, Any] = {"kind": kind}
    for key in ("tool_call_id", "reward"):
        if row.get(key) is not None:
            out[key] = row[key]
    if row.get("label") is not None:
        out["label"] = row["label"]
    if row.get("train") is not None:
        out["train"] = row["train"]
    if row.get("extra"):
        out["extra"] = jsonutil.loads(row["extra"])
    if row.get("usage") is not None:
        out["usage"] = row["usage"]
    if kind in ("api", "code", "message"):
        out["thought"] = row.get("thought")
        out["reasoning"] = row.get("reasoning")
    if kind == "api":
        out["function"] = row["function"]
        out["arguments"] = jsonutil.loads(row["arguments"]) if row.get("arguments") else {}
    elif kind in ("code", "message"):
        out["content"] = row["content"]
        if kind == "code":
            out["language"] = row["language"]
    elif kind in ("text", "json"):
        out["content"] = jsonutil.loads(row["content"]) if kind == "json" else row["content"]
        out["source"] = row["source"]
        out["name"] = row.get("name")
    elif kind == "image":
        out["image"] = _image_from_row(row.get("image"))
    elif kind == "web":
        out["url"] = row.get("url")
        out["html"] = row.get("html")
        out["axtree"] = row.get("axtree")
        out["screenshot"] = _image_from_row(row.get("image"))
        viewport = row.get("viewport")
        out["viewport"] = tuple(viewport) if viewport is not None else None
    return out


def provenance_to_row(p: Provenance) -> dict[str, Any]:
    return {
        "method": p.method,
        "source_dataset": p.source_dataset,
        "source_id": p.source_id,
        "source_format": p.source_format,
        "model": p.model,
        "prompt_template_hash": p.prompt_template_hash,
        "seed": p.seed,
        "task_id": p.task_id,
        "parent_ids": list(p.parent_ids),
        "trajforge_version": p.trajforge_version,
        "created_at": p.created_at,
        "schema_version": p.schema_version,
        "task_split": p.task_split,
    }


def _provenance_from_row(row: dict[str, Any] | None) -> dict[str, Any]:
    if not row:
        return {}
    out = {k: v for k, v in row.items() if v is not None}
    out["parent_ids"] = list(row.get("parent_ids") or [])
    return out


def trajectory_to_row(t: Trajectory) -> dict[str, Any]:
    return {
        "id": t.id,
        "source": t.source,
        "steps": [step_to_row(s) for s in t.steps],
        "tools": [
            {
                "name": tool.name,
                "description": tool.description,
                "parameters": jsonutil.dumps(tool.parameters) if tool.parameters is not None else None,
            }
            for tool in t.tools
        ],
        "reward": t.reward,
        "success": t.success,
        "provenance": provenance_to_row(t.provenance),
        "details": _json_or_none(t.details),
    }


def trajectory_dict_from_row(row: dict[str, Any]) -> dict[str, Any]:
    """Arrow trajectory row -> the model's dict form, ready for `Trajectory.model_validate`."""
    return {
        "id": row["id"],
        "source": row["source"],
        "steps": [step_from_row(s) for s in row.get("steps") or []],
        "tools": [
            {
                "name": tool["name"],
                "description": tool.get("description"),
                "parameters": jsonutil.loads(tool["parameters"]) if tool.get("parameters") is not None else None,
            }
            for tool in row.get("tools") or []
        ],
        "reward": row.get("reward"),
        "success": row.get("success"),
        "provenance": _provenance_from_row(row.get("provenance")),
        "details": jsonutil.loads(row["details"]) if row.get("details") else {},
    }


def trajectory_from_row(row: dict[str, Any]) -> Trajectory:
    return Trajectory.model_validate(trajectory_dict_from_row(row))


def pair_to_row(p: Pair) -> dict[str, Any]:
    row = p.model_dump(exclude={"provenance", "details"})
    row["provenance"] = provenance_to_row(p.provenance)
    row["details"] = _json_or_none(p.details)
    return row


def pair_from_row(row: dict[str, Any]) -> Pair:
    data = dict(row)
    data["provenance"] = _provenance_from_row(row.get("provenance"))
    data["details"] = jsonutil.loads(row["details"]) if row.get("details") else {}
    return Pair.model_validate({k: v for k, v in data.items() if v is not None})


def quarantined_to_row(q: Quarantined) -> dict[str, Any]:
    return q.model_dump()


def quarantined_from_row(row: dict[str, Any]) -> Quarantined:
    return Quarantined.model_validate(row)


def filtered_to_row(f: Filtered) -> dict[str, Any]:
    row = trajectory_to_row(f.record)
    row.update(filter=f.decision.filter, reason=f.decision.reason, score=f.decision.score)
    return row


def filtered_from_row(row: dict[str, Any]) -> Filtered:
    decision = FilterDecision(filter=row["filter"], reason=row["reason"], score=row.get("score"))
    return Filtered(record=trajectory_from_row(row), decision=decision)


TABLE_SCHEMAS: dict[str, pa.Schema] = {
    "trajectories": TRAJECTORY_SCHEMA,
    "pairs": PAIR_SCHEMA,
    "quarantine": QUARANTINE_SCHEMA,
    "filtered": FILTERED_SCHEMA,
}

TO_ROW = {
    "trajectories": trajectory_to_row,
    "pairs": pair_to_row,
    "quarantine": quarantined_to_row,
    "filtered": filtered_to_row,
}

FROM_ROW = {
    "trajectories": trajectory_from_row,
    "pairs": pair_from_row,
    "quarantine": quarantined_from_row,
    "filtered": filtered_from_row,
}
