"""`openai`: OpenAI chat fine-tuning JSONL lines `{"messages": [...], "tools": [...]}`.

Messages carry only the keys that apply (no nulls): assistant messages with tool calls have
`content` only when there is a thought. Every assistant message gets `weight`: 0 when it comes
from masked steps (`train = false`), 1 otherwise — OpenAI trains only on assistant messages and
honours `weight` on them. A trajectory with no weight-1 assistant message is skipped ("no
trainable assistant turn"). `tools` is omitted when the trajectory has none. `reasoning_content`
is not part of OpenAI's format: the driver drops reasoning for this format unless asked to keep
it. No provenance keys are added to the lines (OpenAI rejects unknown keys).
"""

from __future__ import annotations

from typing import Any

from converters.export.options import FormatOptions
from converters.export.render import Turn, Unrenderable, render
from converters.export.tools import openai_tools
from schemas.models import Trajectory


def _message(turn: Turn) -> dict[str, Any]:
    msg = {k: v for k, v in turn.message.items() if v not in (None, "") or k == "content"}
    if turn.is_assistant:
        if msg.get("tool_calls") and not msg.get("content"):
            msg.pop("content", None)
        msg["weight"] = 1 if turn.train else 0
    return msg


def openai_rows(traj: Trajectory, opts: FormatOptions) -> list[dict[str, Any]]:
    turns = render(traj, opts.render)
    if not any(t.is_assistant and t.train for t in turns):
        raise Unrenderable("no trainable assistant turn")
    row: dict[str, Any] = {"messages": [_message(t) for t in turns]}
    tools = openai_tools(traj)
    if tools:
        row["tools"] = tools
    return [row]
