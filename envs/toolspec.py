"""Tool declarations and argument validation against their JSON Schemas, with readable reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
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
