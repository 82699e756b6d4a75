"""The acting model's request, rebuilt from a trajectory: one function for the agent and the exporters.

A generated trajectory records what its acting model was conditioned on: its first step is the
system prompt it received (a text step named "system", `schemas.models.system_step`), its tools are
the tools as sent, and `details["render"]` holds the `RenderSettings` its prompts were rendered
with. The request that produced the action at step k is then a pure function of steps[:k] and
those settings:

1. render steps[:k] (`render.render`, or `render_batch` for a batch) with the settings' page limit,
   tool format and reasoning choice: the system step is hoisted into the system message;
2. keep the system message, the first other message (the task) and the most recent messages whose
   content fits in `history_chars` characters (`window`); a kept tail never starts on a tool answer
   whose call was dropped.

`AgentPolicy` builds every prompt with `request`; exporters rebuild the request of each trainable
assistant message with `request_positions` over the rendered trajectory, so a training row's
prompt is the messages the model was sent, message for message.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import orjson

from converters.export.render import SYSTEM, TOOL, Conversation, RenderOptions, messages, render
from schemas.models import RenderSettings, Step, Tool, Trajectory

TEXT_FORMAT = (
    "Reply with one short thought, then either exactly one\n"
    '<tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>\n'
    "or, when you are finished, your final answer to the user with no tool call."
)


def tools_block(tools: Sequence[Tool]) -> str:
    """Tools as JSON lines (`name`, `description`, `parameters`), the way text prompts list them."""
    return "\n".join(
        orjson.dumps({"name": t.name, "description": t.description, "parameters": t.parameters}).decode()
        for t in tools
    )


def system_prompt(instructions: str, tools: Sequence[Tool], tool_format: str, guidance: str | None = None) -> str:
    """The system prompt of an acting model: its instructions, a method's guidance, and in the text
    tool format the tools and how to call them (native function calling sends the tools apart)."""
    system = f"{instructions}\n\n{guidance}" if guidance else instructions
    if tool_format == "text":
        system = f"{system}\n\nTools (JSON, one per line):\n{tools_block(tools)}\n\n{TEXT_FORMAT}"
    return system


def render_options(settings: RenderSettings, reasoning: bool | None = None) -> RenderOptions:
    """The render options of a request's messages (`reasoning`: override for an answer's own reasoning)."""
    return RenderOptions(reasoning=settings.reasoning if reasoning is None else reasoning,
                         web_max_chars=settings.web_max_chars, tool_format=settings.tool_format)


def _size(content: Any) -> int:
    return len(str(content or ""))


def window(sizes: Sequence[int], is_tool: Callable[[int], bool], limit: int | None) -> list[int]:
    """Positions kept of a history without its system message (`sizes`: each message's content length;
    `is_tool(i)`: whether message i answers a tool call): the first (the task) and as many of the most
    recent as fit in `limit` characters of content; a kept tail never starts on a tool answer. The latest
    turn (the last message that is not a tool answer, and the answers after it) is always kept, however
    long: a window without the newest tool result shows the model the same request again, and it repeats
    the same call (observations are bounded where they leave the world: `max_observation_chars`)."""
    n = len(sizes)
    size = sum(sizes)
    if limit is None or size <= limit:
        return list(range(n))
    latest = next((i for i in range(n - 1, 0, -1) if not is_tool(i)), n)
    start = 1
    while start < latest and size > limit:
        size -= sizes[start]
        start += 1
    # Never start on a tool answer whose call was dropped (templates reject orphans).
    while start < n and is_tool(start):
        start += 1
    return [0, *range(start, n)]


def request(history: list[dict[str, Any]], settings: RenderSettings) -> list[dict[str, Any]]:
    """The messages sent for a rendered history (system message first where it has one).

    Called for every model call: a history that fits the window is returned as it is."""
    start = 1 if history and history[0]["role"] == "system" else 0
    rest = history[start:]
    sizes = [len(str(m.get("content") or "")) for m in rest]
    if settings.history_chars is None or sum(sizes) <= settings.history_chars:
        return history
    kept = window(sizes, lambda i: rest[i]["role"] == "tool", settings.history_chars)
    return history[:start] + [rest[i] for i in kept]


def request_positions(conv: Conversation, k: int, settings: RenderSettings) -> list[int]:
    """Positions in `conv` (a rendered trajectory) of the request that produced message k."""
    roles, content = conv.r.py("role"), conv.r.py("content")
    idx = conv.idx
    system = [0] if k > 0 and roles[idx[0]] == SYSTEM else []
    rest = range(len(system), k)
    kept = window([_size(content[idx[p]]) for p in rest], lambda i: roles[idx[rest[i]]] == TOOL, settings.history_chars)
    return system + [rest[i] for i in kept]


def request_for(steps: Sequence[Step], settings: RenderSettings) -> list[dict[str, Any]]:
    """The messages sent for a history of steps (arguments as JSON text, as on the wire)."""
    history = Trajectory(id="request", source="request", steps=list(steps))
    return request(messages(render(history, render_options(settings), require_assistant=False)), settings)
