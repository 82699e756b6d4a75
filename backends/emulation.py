"""Tool calls and JSON-schema output for in-process engines that only do constrained generation.

llama.cpp / vLLM in-process have no tool-call parser for small models like SmolLM2, so a tool
call is asked for as JSON `{"name": ..., "arguments": {...}}` constrained by a schema built
from the tools, and turned back into a ToolCall.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from backends.jsonrepair import extract_json
from backends.types import ChatRequest, Completion, ToolCall, Usage


def response_schema(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """The JSON schema inside either OpenAI response_format shape ({} = any JSON object)."""
    if not response_format:
        return None
    if response_format.get("type") == "json_schema":
        return response_format.get("json_schema", {}).get("schema") or {"type": "object"}
    if response_format.get("type") == "json_object":
        return response_format.get("schema") or {"type": "object"}
    return None


def _chosen_tools(tools: list[dict[str, Any]], tool_choice: Any) -> list[dict[str, Any]]:
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        wanted = tool_choice["function"]["name"]
        return [t for t in tools if t["function"]["name"] == wanted]
    return tools


def tool_call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """One object shape per tool (anyOf), so the grammar only admits a valid name/arguments pair."""
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t["function"]["name"]]},
                "arguments": t["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for t in tools
    ]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def tool_instructions(tools: list[dict[str, Any]]) -> str:
    lines = ["You can call these tools. Answer with only a JSON object {\"name\": tool name, \"arguments\": {...}}."]
    for t in tools:
        f = t["function"]
        params = orjson.dumps(f.get("parameters") or {}).decode()
        lines.append(f"- {f['name']}: {f.get('description', '')} parameters: {params}")
    return "\n".join(lines)


def flatten_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rewrite tool-call turns as plain text: small models' chat templates know no 'tool' role."""
    out = []
    for m in messages:
        if m.get("role") == "tool":
            out.append({"role": "user", "content": f"Tool result: {m.get('content', '')}"})
        elif m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": orjson.dumps(calls[0] if len(calls) == 1 else calls).decode()})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return out


def prepare(request: ChatRequest) -> tuple[list[dict[str, Any]], dict[str, Any] | None, bool]:
    """(messages, schema to constrain output with, whether the answer is an emulated tool call)."""
    messages = flatten_history(request.messages)
    if request.tools and request.tool_choice != "none":
        tools = _chosen_tools(request.tools, request.tool_choice)
        return [{"role": "system", "content": tool_instructions(tools)}, *messages], tool_call_schema(tools), True
    return messages, response_schema(request.response_format), False


def to_completion(text: str, finish_reason: str | None, usage: Usage, tool_call: bool) -> Completion:
    if not tool_call:
        return Completion(text, [], finish_reason, usage)
    try:
        obj = extract_json(text)
        call = ToolCall(f"call_{uuid.uuid4().hex[:12]}", obj["name"], orjson.dumps(obj.get("arguments", {})).decode())
    except (ValueError, KeyError, TypeError):
        # The answer as it is, marked: the wrapper asks again (a cut-off or off-grammar answer says nothing
        # about the request) and, once the retries are spent, hands it back for the caller to record.
        why = "cut off at the token limit" if finish_reason == "length" else "off the grammar"
        return Completion(text, [], finish_reason, usage, unusable=f"emulated tool call unparseable ({why})")
    return Completion("", [call], "tool_calls", usage)
