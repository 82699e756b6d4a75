"""Shared pieces for function-calling datasets (xLAM, APIGen-MT): tool specs, calls, <think> blocks."""

from __future__ import annotations

import re
from typing import Any

from converters._util import Ctx

# Python-ish type names used by xLAM tool specs -> JSON Schema types.
_TYPES = {
    "str": "string", "string": "string", "int": "integer", "integer": "integer", "float": "number",
    "number": "number", "bool": "boolean", "boolean": "boolean", "list": "array", "array": "array",
    "dict": "object", "object": "object", "tuple": "array", "set": "array", "none": "null", "null": "null",
}
_THINK = re.compile(r"\s*<think>(.*?)</think>\s*", re.DOTALL)


def json_type(name: str) -> str | None:
    """'str' / 'List[int]' / 'str, optional' -> a JSON Schema type name (None if unknown)."""
    base = name.split(",")[0].strip().lower()
    base = re.split(r"[\[\(]", base)[0].strip()
    if base.startswith("typing."):
        base = base[len("typing."):]
    return _TYPES.get(base)


def parameters_schema(ctx: Ctx, params: Any, where: str) -> dict[str, Any] | None:
    """Tool parameters as JSON Schema.

    Accepts a JSON Schema object ({"type": "object", "properties": ...}) as is, or xLAM's
    {param: {"type": "str, optional", "description": ..., "default": ...}} map, which becomes
    properties with JSON types; a parameter is required unless its type says "optional" or it
    has a default. The original type string is kept as `x-type` when it says more than a plain type name.
    """
    if params is None:
        return None
    if isinstance(params, str):
        params = ctx.json_loads(params, where)
    if not isinstance(params, dict):
        ctx.fail(f"`{where}` is {type(params).__name__}, expected an object")
    if params.get("type") == "object" or "properties" in params:
        return params
    props: dict[str, Any] = {}
    required: list[str] = []
    for name, spec in params.items():
        if not isinstance(spec, dict):
            ctx.fail(f"`{where}.{name}` is {type(spec).__name__}, expected an object")
        prop = {k: v for k, v in spec.items() if k != "type"}
        type_name = spec.get("type")
        if type_name is not None and not isinstance(type_name, str):
            ctx.fail(f"`{where}.{name}.type` is {type(type_name).__name__}, expected string")
        if type_name:
            jtype = json_type(type_name)
            if jtype:
                prop["type"] = jtype
            if type_name.strip().lower() not in _TYPES:
                prop["x-type"] = type_name
        props[name] = prop
        optional = "optional" in (type_name or "").lower() or "default" in spec
        if not optional:
            required.append(name)
    return {"type": "object", "properties": props, "required": required}


def tool_specs(ctx: Ctx, tools: Any, where: str) -> list[dict[str, Any]]:
    """A list (or JSON string of a list) of {name, description, parameters} or OpenAI specs -> Tool dicts."""
    if tools is None:
        return []
    if isinstance(tools, str):
        tools = ctx.json_loads(tools, where) if tools.strip() else []
    if not isinstance(tools, list):
        ctx.fail(f"`{where}` is {type(tools).__name__}, expected a list")
    out = []
    for i, spec in enumerate(tools):
        w = f"{where}[{i}]"
        if isinstance(spec, str):
            spec = ctx.json_loads(spec, w)
        if not isinstance(spec, dict):
            ctx.fail(f"`{w}` is {type(spec).__name__}, expected an object")
        fn = spec["function"] if isinstance(spec.get("function"), dict) else spec
        name = ctx.str_(fn, "name", w)
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            ctx.fail(f"`{w}.description` is {type(desc).__name__}, expected string")
        out.append({"name": name, "description": desc, "parameters": parameters_schema(ctx, fn.get("parameters"), f"{w}.parameters")})
    return out


def call_arguments(ctx: Ctx, args: Any, where: str) -> dict[str, Any]:
    """Call arguments from a dict or a JSON string (empty string -> {})."""
    if args is None:
        return {}
    if isinstance(args, str):
        if not args.strip():
            return {}
        args = ctx.json_loads(args, where)
    if not isinstance(args, dict):
        ctx.fail(f"`{where}` is {type(args).__name__}, expected an object (or a JSON object string)")
    return args


def split_think(text: str) -> tuple[str | None, str]:
    """Leading `<think>...</think>` block -> (reasoning, rest)."""
    if "<think>" not in text:
        return None, text
    m = _THINK.match(text)
    if not m:
        return None, text
    return m.group(1).strip(), text[m.end():]


class CallLinker:
    """Pairs tool calls with their results: explicit ids when present, else FIFO with generated ids."""

    def __init__(self) -> None:
        self.count = 0
        self.pending: list[str] = []

    def new(self, explicit: Any = None) -> str:
        self.count += 1
        call_id = explicit if isinstance(explicit, str) and explicit else f"call_{self.count}"
        self.pending.append(call_id)
        return call_id

    def result(self, explicit: Any = None) -> str | None:
        if isinstance(explicit, str) and explicit:
            if explicit in self.pending:
                self.pending.remove(explicit)
            return explicit
        return self.pending.pop(0) if self.pending else None
