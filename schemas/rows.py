"""Trajectory rows in Arrow-ready form, built from plain values without constructing models.

A row is the nested tuple `pipelines.columns.BatchBuilder` makes of a validated `Trajectory`:
fields in `TRAJECTORY_SCHEMA` order, steps in `STEP_TYPE` order, free-form values as JSON
strings. The functions here check plain values against the models' rules and build the same
tuple, at a fraction of the cost of validating models. They accept only what they can check
exactly (str, int, float, bool, list and dict values, as JSON input has them) and raise `Unsure`
for anything else: the caller then takes the models' path, which accepts the record or rejects
it naming the problem. A differential test over the fuzz corpus and every shipped sample holds
both paths to the same rows and the same rejections.
"""

from __future__ import annotations

from typing import Any

import orjson

from schemas import jsonutil
from schemas.models import SCHEMA_VERSION

_dumps = jsonutil.dumps
_plain = orjson.dumps
ORIGINS = frozenset({"user", "agent", "environment"})
_LABELS = frozenset({"good", "bad", "unknown"})
_COMMON = frozenset({"kind", "tool_call_id", "reward", "label", "train", "extra", "usage"})
_ACTION = _COMMON | {"thought", "reasoning"}
_STEP_KEYS = {
    "api": _ACTION | {"function", "arguments"},
    "code": _ACTION | {"language", "content"},
    "message": _ACTION | {"content"},
    "text": _COMMON | {"content", "source", "name"},
    "json": _COMMON | {"content", "source", "name"},
    "image": _COMMON | {"image"},
    "web": _COMMON | {"url", "html", "axtree", "screenshot", "viewport"},
}
_PROVENANCE = ("method", "source_dataset", "source_id", "source_format", "model", "prompt_template_hash", "seed",
               "task_id", "parent_ids", "trajforge_version", "created_at", "schema_version", "task_split")
_PROVENANCE_KEYS = frozenset(_PROVENANCE)
_TRAJECTORY_KEYS = frozenset({"id", "source", "steps", "tools", "reward", "success", "provenance", "details"})
_TOOL_KEYS = frozenset({"name", "description", "parameters"})
_IMAGE_KEYS = frozenset({"path", "source", "annotations"})
_ANNOTATION_KEYS = frozenset({"text", "element_type", "bounding_box"})
_BOX = ("x", "y", "width", "height")
_BOX_KEYS = frozenset(_BOX)


class Unsure(Exception):
    """A value these checks do not decide themselves: the models must."""


def opt_str(value: Any) -> str | None:
    if value is None or type(value) is str:
        return value
    raise Unsure


def text(value: Any) -> str:
    if type(value) is not str:
        raise Unsure
    return value


def opt_float(value: Any) -> float | None:
    t = type(value)
    if value is None or t is float:
        return value
    if t is int:
        return float(value)
    raise Unsure


def mapping_json(value: Any) -> str:
    """A `dict[str, Any]` field's value as its JSON text (what `jsonutil.dumps` gives). Plain
    JSON encoding vouches for the keys being str (orjson refuses any other key); a value it
    cannot encode (non-str keys, big ints, lone surrogates) is left to the models."""
    if type(value) is not dict:
        raise Unsure
    try:
        return _plain(value).decode()
    except TypeError:
        raise Unsure from None


def mapping_json_or_none(value: Any) -> str | None:
    text = mapping_json(value)
    return None if text == "{}" else text


def origin(value: Any) -> str:
    if type(value) is not str or value not in ORIGINS:
        raise Unsure
    return value


def image(value: Any) -> dict[str, Any] | None:
    """An `ImageRef` dict -> its row (path, source, annotations as JSON)."""
    if value is None:
        return None
    if type(value) is not dict or not value.keys() <= _IMAGE_KEYS:
        raise Unsure
    path = text(value.get("path"))
    source = origin(value.get("source", "environment"))
    annotations = value.get("annotations")
    if annotations is not None:
        if type(annotations) is not list:
            raise Unsure
        dumped = []
        for a in annotations:
            if type(a) is not dict or a.keys() != _ANNOTATION_KEYS:
                raise Unsure
            box = a["bounding_box"]
            if type(box) is not dict or box.keys() != _BOX_KEYS:
                raise Unsure
            coords = {k: opt_float(box[k]) for k in _BOX}
            if None in coords.values():
                raise Unsure
            dumped.append({"text": text(a["text"]), "element_type": text(a["element_type"]), "bounding_box": coords})
        annotations = _dumps(dumped)
    return {"path": path, "source": source, "annotations": annotations}


def viewport(value: Any) -> list[int] | None:
    if value is None:
        return None
    if type(value) not in (list, tuple) or len(value) != 2 or not all(type(v) is int for v in value):
        raise Unsure
    return list(value)


# Step tuples in STEP_TYPE order: kind, tool_call_id, thought, reasoning, function, arguments, language,
# content, source, name, url, html, axtree, image, viewport, reward, label, train, extra, usage; the common
# fields at the models' defaults. The checks are spelled out: these run once per step.
def _opt(value: Any) -> bool:
    return value is None or type(value) is str


def api_step(thought: Any, reasoning: Any, function: Any, arguments: Any) -> tuple[Any, ...]:
    if not (_opt(thought) and _opt(reasoning) and type(function) is str):
        raise Unsure
    return ("api", None, thought, reasoning, function, mapping_json(arguments), None, None, None, None, None, None,
            None, None, None, None, "unknown", True, None, None)


def code_step(thought: Any, reasoning: Any, language: Any, content: Any) -> tuple[Any, ...]:
    if not (_opt(thought) and _opt(reasoning) and type(language) is str and type(content) is str):
        raise Unsure
    return ("code", None, thought, reasoning, None, None, language, content, None, None, None, None, None, None,
            None, None, "unknown", True, None, None)


def message_step(thought: Any, reasoning: Any, content: Any) -> tuple[Any, ...]:
    if not (_opt(thought) and _opt(reasoning) and type(content) is str):
        raise Unsure
    return ("message", None, thought, reasoning, None, None, None, content, None, None, None, None, None, None,
            None, None, "unknown", True, None, None)


def text_step(content: Any, source: Any, name: Any) -> tuple[Any, ...]:
    if not (type(content) is str and type(source) is str and source in ORIGINS and _opt(name)):
        raise Unsure
    return ("text", None, None, None, None, None, None, content, source, name, None, None, None, None, None, None,
            "unknown", True, None, None)


def json_step(content: Any, source: Any, name: Any) -> tuple[Any, ...]:
    if not (type(source) is str and source in ORIGINS and _opt(name)):
        raise Unsure
    return ("json", None, None, None, None, None, None, _dumps(content), source, name, None, None, None, None, None,
            None, "unknown", True, None, None)


def image_step(image_row: dict[str, Any] | None) -> tuple[Any, ...]:
    if image_row is None:
        raise Unsure
    return ("image", None, None, None, None, None, None, None, None, None, None, None, None, image_row, None, None,
            "unknown", True, None, None)


def web_step(url: Any, html: Any, axtree: Any, screenshot: dict[str, Any] | None, view: Any) -> tuple[Any, ...]:
    if not (_opt(url) and _opt(html) and _opt(axtree)):
        raise Unsure
    return ("web", None, None, None, None, None, None, None, None, None, url, html, axtree, screenshot,
            viewport(view), None, "unknown", True, None, None)


def _with_common(step: tuple[Any, ...], d: dict[str, Any]) -> tuple[Any, ...]:
    """`step` with the dict's tool_call_id / reward / label / train / extra instead of the defaults."""
    get = d.get
    label = get("label", "unknown")
    train = get("train", True)
    if type(label) is not str or label not in _LABELS or type(train) is not bool:
        raise Unsure
    extra = mapping_json_or_none(d["extra"]) if "extra" in d else None
    return (step[0], opt_str(get("tool_call_id")), *step[2:15], opt_float(get("reward")), label, train, extra, None)


def step_row(d: Any) -> tuple[Any, ...]:
    """A step dict (the models' field names) -> its row; raises Unsure where the models must decide."""
    if type(d) is not dict:
        raise Unsure
    kind = d.get("kind")
    allowed = _STEP_KEYS.get(kind) if type(kind) is str else None
    if allowed is None or not d.keys() <= allowed:
        raise Unsure
    get = d.get
    try:
        if kind == "api":
            step = api_step(get("thought"), get("reasoning"), d["function"], get("arguments", {}))
        elif kind == "code":
            step = code_step(get("thought"), get("reasoning"), d["language"], d["content"])
        elif kind == "message":
            step = message_step(get("thought"), get("reasoning"), d["content"])
        elif kind == "text":
            step = text_step(d["content"], d["source"], get("name"))
        elif kind == "json":
            step = json_step(d["content"], get("source", "environment"), get("name"))
        elif kind == "image":
            step = image_step(image(d["image"]))
        else:
            step = web_step(get("url"), get("html"), get("axtree"), image(get("screenshot")), get("viewport"))
    except KeyError:  # a required field is missing
        raise Unsure from None
    if get("usage") is not None:  # a model call's usage: rare in converted input, the models check it
        raise Unsure
    if d.keys() & {"tool_call_id", "reward", "label", "train", "extra"}:
        step = _with_common(step, d)
    return step


def trajectory_row(
    id_: Any, source: Any, steps: list[tuple[Any, ...]], tools: Any = (), reward: Any = None, success: Any = None,
    provenance: Any = None, details: Any = None,
) -> tuple[Any, ...]:
    # `provenance` and `details` are dicts (None is what the models reject, as here).
    """The row of a trajectory whose steps are rows already; the other fields as the models take them."""
    if type(id_) is not str or type(source) is not str or not id_ or not source:
        raise Unsure
    tool_rows = []
    for tool in tools:
        if type(tool) is not dict or not tool.keys() <= _TOOL_KEYS:
            raise Unsure
        parameters = tool.get("parameters")
        tool_rows.append((text(tool.get("name")), opt_str(tool.get("description")),
                          None if parameters is None else mapping_json(parameters)))
    if success is not None and type(success) is not bool:
        raise Unsure
    p = provenance
    if type(p) is not dict or not p.keys() <= _PROVENANCE_KEYS or p.get("created_at") is not None:
        raise Unsure
    seed = p.get("seed")
    parents = p.get("parent_ids", [])
    if (seed is not None and type(seed) is not int) or type(parents) is not list \
            or not all(type(x) is str for x in parents):
        raise Unsure
    prov = (opt_str(p.get("method")), opt_str(p.get("source_dataset")), opt_str(p.get("source_id")),
            opt_str(p.get("source_format")), opt_str(p.get("model")), opt_str(p.get("prompt_template_hash")),
            seed, opt_str(p.get("task_id")), list(parents), opt_str(p.get("trajforge_version")), None,
            opt_str(p.get("schema_version", SCHEMA_VERSION)), opt_str(p.get("task_split")))
    return (id_, source, steps, tool_rows, opt_float(reward), success, prov,
            mapping_json_or_none(details))


def row_from_dict(obj: Any) -> tuple[Any, ...] | None:
    """The row `BatchBuilder.add(Trajectory.model_validate(obj))` adds, or None where the models must decide.

    Raises what building the row raises for a value JSON cannot encode, as `BatchBuilder.add` does.
    """
    try:
        if type(obj) is not dict or not obj.keys() <= _TRAJECTORY_KEYS:
            raise Unsure
        steps, tools = obj.get("steps", []), obj.get("tools", [])
        if type(steps) is not list or type(tools) is not list:
            raise Unsure
        details = obj.get("details", {})
        return trajectory_row(obj.get("id"), obj.get("source"), list(map(step_row, steps)), tools,
                              obj.get("reward"), obj.get("success"), obj.get("provenance", {}), details)
    except Unsure:
        return None
