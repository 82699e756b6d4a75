"""Check a tool call against the JSON Schema of the tool it names; reasons are one readable line."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from schemas.models import Tool

_JSON_TYPE_NAMES = {
    bool: "boolean", int: "integer", float: "number", str: "string",
    list: "array", dict: "object", type(None): "null",
}


def json_type(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def describe_error(error: ValidationError) -> str:
    """One sentence for one jsonschema error, naming the argument and the problem."""
    where = ".".join(str(p) for p in error.path)
    arg = f"argument '{where}'" if where else "arguments"
    if error.validator == "required":
        missing = [r for r in error.validator_value if isinstance(error.instance, dict) and r not in error.instance]
        return f"missing required argument {', '.join(repr(m) for m in missing)}"
    if error.validator == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in allowed)
        return f"unexpected argument {', '.join(repr(x) for x in extra)}"
    if error.validator == "type":
        return f"{arg} must be of type {error.validator_value}, got {json_type(error.instance)}"
    if error.validator == "enum":
        return f"{arg} must be one of {error.validator_value}, got {error.instance!r}"
    return f"{arg}: {error.message}"


@lru_cache(maxsize=4096)
def _validator(schema_json: bytes) -> Draft202012Validator:
    return Draft202012Validator(orjson.loads(schema_json))


def argument_problem(parameters: dict[str, Any] | None, arguments: Any) -> str | None:
    """None when `arguments` fit `parameters` (a JSON Schema; None accepts anything)."""
    if parameters is None:
        return None
    try:
        validator = _validator(orjson.dumps(parameters, option=orjson.OPT_SORT_KEYS))
        errors = sorted(validator.iter_errors(arguments), key=lambda e: (len(e.path), str(e.path)))
    except SchemaError as exc:
        return f"the tool's parameter schema is invalid ({exc.message})"
    if not errors:
        return None
    return "; ".join(describe_error(e) for e in errors[:3])


def call_problem(tools: list[Tool], function: str, arguments: Any) -> str | None:
    """None when the call names one of `tools` with valid arguments, else the reason."""
    for tool in tools:
        if tool.name == function:
            return argument_problem(tool.parameters, arguments)
    names = ", ".join(sorted(t.name for t in tools)) or "none"
    return f"unknown tool {function!r}; available tools: {names}"
