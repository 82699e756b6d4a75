"""ADP-standardized trajectories <-> interlingua, lossless in both directions.

Raw format (one JSON object per trajectory, Agent Data Protocol):
- `id`: trajectory id.
- `content`: ordered list of steps, each tagged by `class_` (api_action, code_action,
  message_action, text_observation, image_observation, web_observation, json_observation).
- `details`: free-form metadata (str -> str in the first release, any JSON later).
- `schema_version` (newer releases): e.g. "1.3.0"; absent in the first release.
- `available_apis` / `available_custom_tools` (optional): names of the custom tools offered.
- `available_code_languages` (optional): languages the trajectory's code actions use.

Whatever has no field of its own (unknown keys, which optional keys were present) is kept
in step `extra` / trajectory `details["_adp"]`, so `to_adp(from_adp(x)) == x`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from converters.errors import ConversionError, summarize_validation
from converters.ids import plain_canonical_bytes, stable_id
from converters.registry import register
from schemas import rows
from schemas.models import ImageRef, Trajectory

_ADP_META = "_adp"  # key in details for trajectory-level layout facts
_KEYS = "_adp_keys"  # key in step extra: the exact key set of the source object
_FIRST_RELEASE = "adp-0"

# Keys each class always carries in the ADP layout; optional keys are written only when set.
_BASE_KEYS: dict[str, tuple[str, ...]] = {
    "api_action": ("class_", "function", "kwargs", "description"),
    "code_action": ("class_", "language", "content", "description"),
    "message_action": ("class_", "content", "description"),
    "text_observation": ("class_", "content", "source", "name"),
    "json_observation": ("class_", "content", "source", "name"),
    "image_observation": ("class_", "content", "source", "annotations"),
    "web_observation": ("class_", "html", "axtree", "url", "image_observation", "viewport_size"),
}
_OPTIONAL_KEYS = ("tool_call_id", "reasoning_content", "reward")
_KIND_OF_CLASS = {
    "api_action": "api",
    "code_action": "code",
    "message_action": "message",
    "text_observation": "text",
    "json_observation": "json",
    "image_observation": "image",
    "web_observation": "web",
}
_CLASS_OF_KIND = {v: k for k, v in _KIND_OF_CLASS.items()}
_TOP_KEYS = ("id", "content", "details")


def _image_from_adp(obj: dict[str, Any]) -> dict[str, Any]:
    return {"path": obj["content"], "source": obj.get("source") or "environment", "annotations": obj.get("annotations")}


def _image_to_adp(image: ImageRef) -> dict[str, Any]:
    annotations = None if image.annotations is None else [a.model_dump() for a in image.annotations]
    return {"class_": "image_observation", "content": image.path, "source": image.source, "annotations": annotations}


# Keys each class reads into fields of its own; the rest of a step object goes to `extra`.
_CONSUMED = {cls: frozenset({*keys, *_OPTIONAL_KEYS}) for cls, keys in _BASE_KEYS.items()}
_BASE_SETS = {cls: frozenset(keys) for cls, keys in _BASE_KEYS.items()}


def step_from_adp(obj: dict[str, Any]) -> dict[str, Any]:
    """One ADP step object -> the interlingua step's dict form."""
    if not isinstance(obj, dict):
        raise ConversionError(f"step is {type(obj).__name__}, expected an object")
    cls = obj.get("class_")
    if cls not in _KIND_OF_CLASS:
        raise ConversionError(f"unknown step class_ {cls!r}")
    kind = _KIND_OF_CLASS[cls]
    get = obj.get
    step: dict[str, Any] = {"kind": kind}
    if kind == "api":
        step["thought"] = get("description")
        step["reasoning"] = get("reasoning_content")
        step["function"] = get("function")
        kwargs = get("kwargs")
        step["arguments"] = kwargs if kwargs is not None else {}
    elif kind == "code":
        step["thought"] = get("description")
        step["reasoning"] = get("reasoning_content")
        step["language"] = get("language")
        step["content"] = get("content")
    elif kind == "message":
        step["thought"] = get("description")
        step["reasoning"] = get("reasoning_content")
        step["content"] = get("content")
    elif kind in ("text", "json"):
        step["content"] = get("content")
        step["source"] = get("source")
        step["name"] = get("name")
    elif kind == "image":
        step["image"] = _image_from_adp(obj)
    elif kind == "web":
        step["url"] = get("url")
        step["html"] = get("html")
        step["axtree"] = get("axtree")
        screenshot = get("image_observation")
        step["screenshot"] = _image_from_adp(screenshot) if screenshot else None
        viewport = get("viewport_size")
        step["viewport"] = tuple(viewport) if viewport is not None else None
    if obj.keys() == _BASE_SETS[cls]:
        return step  # the common case: exactly the class's keys, nothing optional or extra
    optional = [k for k in _OPTIONAL_KEYS if get(k) is not None]
    if get("tool_call_id") is not None:
        step["tool_call_id"] = obj["tool_call_id"]
    if get("reward") is not None:
        step["reward"] = obj["reward"]
    consumed = _CONSUMED[cls]
    extra = {k: v for k, v in obj.items() if k not in consumed}
    # The exact key set is kept when it differs from what `step_to_adp` would write.
    if obj.keys() & consumed != _BASE_SETS[cls].union(optional):
        extra[_KEYS] = list(obj)
    if extra:
        step["extra"] = extra
    return step


def step_to_adp(step: Any) -> dict[str, Any]:
    """One interlingua step -> the ADP step object."""
    kind = step.kind
    out: dict[str, Any] = {"class_": _CLASS_OF_KIND[kind]}
    if kind in ("api", "code", "message"):
        out["description"] = step.thought
        if step.reasoning is not None:
            out["reasoning_content"] = step.reasoning
    if kind == "api":
        out["function"] = step.function
        out["kwargs"] = step.arguments
    elif kind in ("code", "message"):
        out["content"] = step.content
        if kind == "code":
            out["language"] = step.language
    elif kind in ("text", "json"):
        out.update(content=step.content, source=step.source, name=step.name)
    elif kind == "image":
        out = _image_to_adp(step.image)
    elif kind == "web":
        out.update(
            url=step.url,
            html=step.html,
            axtree=step.axtree,
            image_observation=_image_to_adp(step.screenshot) if step.screenshot else None,
            viewport_size=list(step.viewport) if step.viewport is not None else None,
        )
    if step.tool_call_id is not None:
        out["tool_call_id"] = step.tool_call_id
    if step.reward is not None:
        out["reward"] = step.reward
    extra = dict(step.extra)
    keys = extra.pop(_KEYS, None)
    out.update(extra)
    if keys is not None:
        out = {k: out.get(k) for k in keys}
    return out


def _header(record: Any) -> tuple[str, list[Any], dict[str, Any], list[Any] | None, Any]:
    """(id, content, details with the layout facts, tool names, schema version) of an ADP record."""
    if not isinstance(record, dict):
        raise ConversionError(f"record is {type(record).__name__}, expected an object")
    record_id = record.get("id")
    if not isinstance(record_id, str) or not record_id:
        raise ConversionError("missing or empty string `id`")
    content = record.get("content")
    if not isinstance(content, list):
        raise ConversionError(f"record {record_id!r}: `content` must be a list")
    details = record.get("details", {})
    if not isinstance(details, dict):
        raise ConversionError(f"record {record_id!r}: `details` must be an object")
    details = dict(details)
    version = record.get("schema_version")
    meta: dict[str, Any] = {}
    tool_key = next((k for k in ("available_custom_tools", "available_apis") if k in record), None)
    tool_names = record.get(tool_key) if tool_key else None
    if tool_key:
        meta["tools_key"] = tool_key
        if tool_names is None:
            meta["tools_null"] = True
        elif not isinstance(tool_names, list):
            raise ConversionError(f"record {record_id!r}: `{tool_key}` must be a list of names")
    known = {*_TOP_KEYS, "schema_version", "available_custom_tools", "available_apis"}
    extra_top = {k: v for k, v in record.items() if k not in known}
    if extra_top:
        meta["extra"] = extra_top
    written = {*_TOP_KEYS, *extra_top, *([tool_key] if tool_key else []), *(["schema_version"] if version else [])}
    if set(record) != written:
        meta["keys"] = list(record)
    if meta:
        details[_ADP_META] = meta
    return record_id, content, details, tool_names, version


def _provenance(source: str, record_id: str, version: Any) -> dict[str, Any]:
    return {"source_dataset": source, "source_id": record_id,
            "source_format": f"adp-{version}" if version else _FIRST_RELEASE}


def adp_dict(record: Any, source: str = "adp") -> dict[str, Any]:
    """One ADP-standardized trajectory -> the interlingua record as a plain dict, not yet validated
    (`from_adp` validates it with the models). Raises ConversionError for what is not ADP's layout."""
    record_id, content, details, tool_names, version = _header(record)
    steps = []
    for index, obj in enumerate(content):
        try:
            steps.append(step_from_adp(obj))
        except ConversionError as exc:
            raise ConversionError(f"record {record_id!r}: step {index}: {exc}") from None
        except (TypeError, KeyError, AttributeError, ValueError) as exc:
            raise ConversionError(f"record {record_id!r}: step {index}: malformed ({type(exc).__name__}: {exc})") from None
    return {
        "id": stable_id(source, record_id, record),
        "source": source,
        "steps": steps,
        "tools": [{"name": name} for name in tool_names or []],
        "provenance": _provenance(source, record_id, version),
        "details": details,
    }


def _step_row(obj: Any) -> tuple[Any, ...]:
    """One ADP step object -> its row, as `step_from_adp` + the models would make it (`schemas.rows`)."""
    if type(obj) is not dict:
        raise rows.Unsure
    cls = obj.get("class_")
    base = _BASE_SETS.get(cls) if type(cls) is str else None
    if base is None or obj.keys() != base:  # optional or extra keys: through the step's dict
        return rows.step_row(step_from_adp(obj))
    # Exactly the class's keys: each is there.
    if cls == "api_action":
        kwargs = obj["kwargs"]
        return rows.api_step(obj["description"], None, obj["function"], kwargs if kwargs is not None else {})
    if cls == "code_action":
        return rows.code_step(obj["description"], None, obj["language"], obj["content"])
    if cls == "message_action":
        return rows.message_step(obj["description"], None, obj["content"])
    if cls == "text_observation":
        return rows.text_step(obj["content"], obj["source"], obj["name"])
    if cls == "json_observation":
        return rows.json_step(obj["content"], obj["source"], obj["name"])
    if cls == "image_observation":
        return rows.image_step(rows.image(_image_from_adp(obj)))
    screenshot = obj["image_observation"]
    return rows.web_step(obj["url"], obj["html"], obj["axtree"],
                         rows.image(_image_from_adp(screenshot)) if screenshot else None, obj["viewport_size"])


def adp_row(record: Any, source: str = "adp") -> tuple[Any, ...] | None:
    """The trajectory row `from_adp` + `pipelines.columns.BatchBuilder.add` give, built without models;
    None where the models must decide (any doubt, any error: `from_adp` then accepts or names it).

    A record plain JSON cannot hold (lone surrogates, which the models refuse in str fields; ints
    beyond 64 bits) is left to the models too: the canonical bytes of the id tell at no extra cost.
    """
    canonical = plain_canonical_bytes(record)
    if canonical is None:
        return None
    try:
        record_id, content, details, tool_names, version = _header(record)
        return rows.trajectory_row(
            stable_id(source, record_id, record, canonical), source, list(map(_step_row, content)),
            [{"name": name} for name in tool_names or []], None, None, _provenance(source, record_id, version), details,
        )
    except (rows.Unsure, ConversionError, TypeError, KeyError, AttributeError, ValueError, RecursionError):
        return None


def from_adp(record: Any, source: str = "adp") -> Trajectory:
    """Convert one ADP-standardized trajectory (first release or versioned) to the interlingua."""
    obj = adp_dict(record, source)
    try:
        return Trajectory.model_validate(obj)
    except ValidationError as exc:
        raise ConversionError(f"record {record['id']!r}: {_summarize(exc)}") from None


def to_adp(t: Trajectory) -> dict[str, Any]:
    """Write an interlingua trajectory as an ADP-standardized object (the layout it came from)."""
    details = dict(t.details)
    meta = details.pop(_ADP_META, {})
    out: dict[str, Any] = {}
    fmt = t.provenance.source_format or ""
    if fmt.startswith("adp-") and fmt != _FIRST_RELEASE:
        out["schema_version"] = fmt.removeprefix("adp-")
    out["id"] = t.provenance.source_id if t.provenance.source_id is not None else t.id
    out["content"] = [step_to_adp(s) for s in t.steps]
    out["details"] = details
    tool_key = meta.get("tools_key")
    if tool_key or t.tools:
        names = None if meta.get("tools_null") else [tool.name for tool in t.tools]
        out[tool_key or "available_custom_tools"] = names
    out.update(meta.get("extra", {}))
    keys = meta.get("keys")
    if keys is not None:
        out = {k: out.get(k) for k in keys}
    return out


def _summarize(exc: ValidationError) -> str:
    return summarize_validation(exc)


@register("adp", sources=["neulab/agent-data-protocol (standardized)"], to_row=adp_row)
def convert(record: Any) -> Trajectory:
    return from_adp(record)
