"""Tool declarations and argument validation against their JSON Schemas, with readable reasons."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from jsonschema import Draft202012Validator

from schemas.models import Tool
from schemas.toolcalls import describe_error


def obj(properties: dict[str, dict[str, Any]], required: list[str] | None = None) -> dict[str, Any]:
    """A closed JSON Schema object: listed properties, all required unless told, no extras."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


@dataclass
class ToolSpec:
    """A tool: its public declaration plus the function implementing it."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    mutates: bool = False
    _validator: Draft202012Validator | None = field(default=None, repr=False)

    def tool(self) -> Tool:
        return Tool(name=self.name, description=self.description, parameters=self.parameters)

    def validate(self, arguments: Any) -> str | None:
        """None when `arguments` fit the schema, else one sentence naming the problem."""
        if self._validator is None:
            self._validator = Draft202012Validator(self.parameters)
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: (len(e.path), str(e.path)))
        if not errors:
            return None
        return "; ".join(describe_error(e) for e in errors[:3])


def validate_call(specs: dict[str, ToolSpec], function: str, arguments: Any) -> str | None:
    """None when the call names a known tool with valid arguments, else the reason."""
    spec = specs.get(function)
    if spec is None:
        return f"unknown tool {function!r}; available tools: {', '.join(sorted(specs))}"
    return spec.validate(arguments)


def as_tool(value: Tool | dict[str, Any]) -> Tool:
    """A tool from any common declaration: a `Tool`, `{name, description, parameters}`, the OpenAI wire
    format `{"type": "function", "function": {...}}`, or an MCP listing `{name, description, inputSchema}`."""
    if isinstance(value, Tool):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"a tool is an object, not {type(value).__name__}")
    if value.get("type") == "function" and isinstance(value.get("function"), dict):
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("a tool needs a 'name' string")
    parameters = value.get("parameters", value.get("inputSchema"))
    if parameters is not None and not isinstance(parameters, dict):
        raise ValueError(f"tool {name!r}: parameters must be a JSON Schema object")
    return Tool(name=name, description=value.get("description"), parameters=parameters)


def load_tools_file(path: str | Path) -> list[Tool]:
    """Tools from a JSON file (a list of declarations, or `{"tools": [...]}` as MCP lists them) or a
    JSONL file (one declaration a line); errors name the file and the entry."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{p}: cannot read tools file ({exc})") from None
    entries: list[tuple[str, Any]] = []
    try:
        if p.suffix == ".jsonl":
            entries = [(f"line {n}", json.loads(line)) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        else:
            data = json.loads(text)
            data = data.get("tools") if isinstance(data, dict) else data
            if not isinstance(data, list):
                raise ValueError(f"{p}: a tools file is a JSON list of tools (or {{\"tools\": [...]}})")
            entries = [(f"entry {n}", item) for n, item in enumerate(data)]
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not JSON ({exc.msg} at line {exc.lineno})") from None
    tools: list[Tool] = []
    for where, item in entries:
        try:
            tools.append(as_tool(item))
        except ValueError as exc:
            raise ValueError(f"{p}: {where}: {exc}") from None
    if not tools:
        raise ValueError(f"{p}: no tools in the file")
    return tools
