"""Tool calls a model writes as text: `<tool_call>{json}</tool_call>` blocks, and `<think>` reasoning.

Chat templates of the Qwen, Hermes and SmolLM families have the model write each call as a JSON
object `{"name": ..., "arguments": {...}}` inside a `<tool_call>` block (sometimes without the
closing tag); reasoning models wrap hidden reasoning in `<think>`. The transformers backend reads
generated answers with this (text -> `tool_calls`), and so does the agent's text mode
(`generators/transcript.py`): one parser for both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from backends.jsonrepair import extract_json

THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL | re.IGNORECASE)
TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|$)", re.DOTALL | re.IGNORECASE)


class ToolCallError(ValueError):
    """A tool call that cannot be read; the message says why."""


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: object


def strip_reasoning(text: str) -> tuple[str, str | None]:
    """(visible text, hidden reasoning or None)."""
    thoughts = [m.strip() for m in THINK.findall(text)]
    visible = THINK.sub("", text).strip()
    return visible, ("\n".join(t for t in thoughts if t) or None)


def load_call(text: str) -> ParsedCall:
    """One call from the JSON text of a block: `{"name": ..., "arguments" | "parameters": ...}`."""
    try:
        data = extract_json(text)
    except ValueError:
        raise ToolCallError(f"tool call is not JSON: {text.strip()[:120]!r}") from None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise ToolCallError(f"tool call has no string 'name': {text.strip()[:120]!r}")
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        # Some models double-encode arguments as a JSON string (the OpenAI wire format).
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            raise ToolCallError(f"arguments of {data['name']!r} are not JSON") from None
    return ParsedCall(data["name"], arguments)


def tool_call_blocks(text: str) -> tuple[str, list[str]]:
    """(the text without its `<tool_call>` blocks, the blocks' non-empty contents in order); `text` as it is
    when it has no block."""
    found = TOOL_CALL.findall(text)
    if not found:
        return text, []
    return TOOL_CALL.sub("", text).strip(), [b for b in found if b.strip()]
