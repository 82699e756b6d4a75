"""`openai`: OpenAI chat fine-tuning JSONL lines `{"messages": [...], "tools": [...]}`.

Messages carry only the keys that apply (no nulls): assistant messages with tool calls have
`content` only when there is a thought; tool-call arguments are JSON text, as OpenAI requires.
Every assistant message gets `weight`: 0 when it comes from masked steps (`train = false`), 1
otherwise — OpenAI trains only on assistant messages and honours `weight` on them. Messages
after the last assistant message carry no training signal and are left out. A trajectory with
no weight-1 assistant message is skipped ("no trainable assistant turn"). `tools` is omitted
when the trajectory has none. `reasoning_content` is not part of OpenAI's format: the driver
drops reasoning for this format unless asked to keep it. No provenance keys are added to the
lines (OpenAI rejects unknown keys).
"""

from __future__ import annotations

from typing import Any

from converters.export.options import FormatOptions
from converters.export.records import Record
from converters.export.render import Unrenderable


def openai_rows(record: Record, opts: FormatOptions) -> list[dict[str, Any]]:
    conv = record.render(opts.render).through_last_assistant()
    if not any(conv.train(k) for k in conv.assistant_positions()):
        raise Unrenderable("no trainable assistant turn")
    msgs = conv.messages()
    for k, msg in enumerate(msgs):
        if msg["role"] == "assistant":
            if msg.get("tool_calls") and not msg["content"]:
                del msg["content"]
            msg["weight"] = 1 if conv.train(k) else 0
    row: dict[str, Any] = {"messages": msgs}
    tools = record.openai_tools()
    if tools:
        row["tools"] = tools
    return [row]
