"""A trajectory's tools as JSON-Schema function specs (the shape chat templates and OpenAI take).

Declared tools come first, in order. Functions the trajectory calls but does not declare are
appended with an open parameter schema (`{"type": "object"}`: any object), so every tool call
refers to a declared tool; so is a declared tool whose parameter schema is unknown (ADP often
gives names only).
"""

from __future__ import annotations

from typing import Any

from schemas.models import Trajectory

OPEN_SCHEMA: dict[str, Any] = {"type": "object"}


def function_specs(traj: Trajectory) -> list[dict[str, Any]]:
    """`[{"name", "description"?, "parameters"}]`, declared tools then undeclared called functions."""
    specs: list[dict[str, Any]] = []
    seen: set[str] = set()
    for tool in traj.tools:
        if tool.name in seen:
            continue
        seen.add(tool.name)
        spec: dict[str, Any] = {"name": tool.name}
        if tool.description:
            spec["description"] = tool.description
        spec["parameters"] = tool.parameters if tool.parameters is not None else OPEN_SCHEMA
        specs.append(spec)
    for step in traj.steps:
        if step.kind == "api" and step.function not in seen:
            seen.add(step.function)
            specs.append({"name": step.function, "parameters": OPEN_SCHEMA})
    return specs


def openai_tools(traj: Trajectory) -> list[dict[str, Any]]:
    """`[{"type": "function", "function": spec}]` — OpenAI and HF chat templates (`tools=`)."""
    return [{"type": "function", "function": spec} for spec in function_specs(traj)]
