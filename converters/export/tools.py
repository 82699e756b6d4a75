"""A trajectory's tools as JSON-Schema function specs (the shape chat templates and OpenAI take).

Declared tools come first, in order. Functions the trajectory calls but does not declare are
appended (sorted by name) with an open parameter schema (any object), so every tool call refers to a declared
tool; so is a declared tool whose parameter schema is unknown (ADP often gives names only). An
object schema always has `properties` (an empty one when it lists none): several chat templates
(Nemotron 3, LLaMA-Factory's tool prompt) iterate `parameters.properties` without a guard.

Trajectories of one environment share their tool list: a batch's trajectories are keyed by
(declared tools, called functions) with vectorized string kernels, and specs are built once per
distinct key.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

OPEN_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
# Separators of the key; they cannot occur in tool names, descriptions or JSON text as written.
_FIELD, _TOOL, _PART, _NONE = "\x01", "\x02", "\x03", "\x00"


def _parameters(schema: str) -> dict[str, Any]:
    return OPEN_SCHEMA if schema == _NONE else _normalized(orjson.loads(schema))


def _normalized(params: Any) -> dict[str, Any]:
    if isinstance(params, dict) and params.get("type", "object") == "object" and "properties" not in params:
        params = {**params, "properties": {}}
    return params


def function_spec(name: str, description: str | None, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """One declared tool as a spec, as `specs_of` writes it (an agent sends its tools this way too)."""
    spec: dict[str, Any] = {"name": name}
    if description:
        spec["description"] = description
    spec["parameters"] = OPEN_SCHEMA if parameters is None else _normalized(parameters)
    return spec


@lru_cache(maxsize=1024)
def specs_of(key: str) -> tuple[list[dict[str, Any]], str | None, str | None]:
    """(specs, OpenAI tools JSON, specs JSON) for one key; the JSONs are None without tools."""
    declared, called = key.split(_PART)
    specs: list[dict[str, Any]] = []
    seen: set[str] = set()
    for tool in declared.split(_TOOL) if declared else ():
        name, description, parameters = tool.split(_FIELD)
        if name in seen:
            continue
        seen.add(name)
        spec: dict[str, Any] = {"name": name}
        if description != _NONE and description:
            spec["description"] = description
        spec["parameters"] = _parameters(parameters)
        specs.append(spec)  # = function_spec of the declared tool
    for name in called.split(_TOOL) if called else ():
        if name not in seen:
            seen.add(name)
            specs.append({"name": name, "parameters": OPEN_SCHEMA})
    if not specs:
        return specs, None, None
    wrapped = [{"type": "function", "function": spec} for spec in specs]
    return specs, orjson.dumps(wrapped).decode(), orjson.dumps(specs).decode()


def _lists_joined(offsets: np.ndarray, values: pa.Array, separator: str) -> pa.Array:
    lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)
    return pc.fill_null(pc.binary_join(lists, separator), "")


def tool_keys(tools: pa.ListArray, steps: pa.Array, owner: np.ndarray, n: int,
              as_sent: np.ndarray | None = None) -> pa.DictionaryArray:
    """Per trajectory, the key of its (declared tools, called functions), dictionary-encoded.

    `tools`: the `list<tool>` column; `steps`: the flattened steps; `owner`: each step's trajectory;
    `as_sent`: trajectories whose declared tools are the tools as a model was sent them (their
    called functions are not added: a call to an unknown tool stays a call to an unknown tool)."""
    values = tools.values
    per_tool = pc.binary_join_element_wise(
        values.field("name"), pc.fill_null(values.field("description"), _NONE),
        pc.fill_null(values.field("parameters"), _NONE), _FIELD)
    raw = tools.offsets.to_numpy()
    declared = _lists_joined(raw - raw[0], per_tool.slice(int(raw[0]), int(raw[-1] - raw[0])), _TOOL)
    api = np.flatnonzero(pc.fill_null(pc.equal(steps.field("kind"), "api"), False).to_numpy(zero_copy_only=False))
    if as_sent is not None and as_sent.any():
        api = api[~as_sent[owner[api]]]
    names = steps.field("function").take(pa.array(api)).dictionary_encode()
    sorted_names = sorted(names.dictionary.to_pylist())
    k = len(sorted_names) + 1
    rank = {name: r for r, name in enumerate(sorted_names)}
    code = np.array([rank[name] for name in names.dictionary.to_pylist()], dtype=np.int64)[names.indices.to_numpy()]
    # Distinct (trajectory, function) pairs, ordered by trajectory, then function name.
    pair_owner, pair_code = np.divmod(np.unique(owner[api] * k + code), k)
    counts = np.bincount(pair_owner, minlength=n)
    called = _lists_joined(np.r_[0, np.cumsum(counts)], pa.array(sorted_names, pa.string()).take(pa.array(pair_code)),
                           _TOOL)
    return pc.binary_join_element_wise(declared, called, _PART).dictionary_encode()


def tools_columns(keys: pa.DictionaryArray) -> tuple[pa.Array, pa.Array]:
    """(OpenAI tools JSON, specs JSON) per trajectory (null without tools)."""
    built = [specs_of(k) for k in keys.dictionary.to_pylist()]
    indices = keys.indices
    openai = pa.array([b[1] for b in built], pa.string()).take(indices)
    specs = pa.array([b[2] for b in built], pa.string()).take(indices)
    return openai, specs
