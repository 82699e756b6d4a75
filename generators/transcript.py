"""Parse a model-written transcript (USER / ASSISTANT / TOOL turns) into interlingua steps.

The format, shown to models in prompts:

    USER: <request>
    ASSISTANT: <thought>
    <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>
    TOOL: <tool output>
    ASSISTANT: <final answer>

Tool calls may also come Hermes-style without the closing tag, or as a bare / fenced JSON
object with `name` and `arguments`. Hidden reasoning (`<think>...</think>`) is stripped
from visible text and kept as the step's `reasoning`.
"""

from __future__ import annotations

import re

import orjson

from backends.jsonrepair import first_balanced_object
# ParsedCall and strip_reasoning are part of this module's interface too (the agent's text mode reads them here).
from backends.toolcalls import ParsedCall, ToolCallError, load_call, strip_reasoning, tool_call_blocks  # noqa: F401
from converters.export.request import tools_block  # noqa: F401 - prompts list tools the way agents see them
from schemas.models import ApiAction, MessageAction, Step, TextObservation

_TURN = re.compile(r"^\s*(USER|ASSISTANT|TOOL)\s*:\s?", re.IGNORECASE | re.MULTILINE)
_FENCED_JSON = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)

FORMAT_HELP = (
    "Write the transcript as turns, each starting on a new line with USER:, ASSISTANT: or TOOL:.\n"
    "An ASSISTANT turn that calls a tool writes one short thought, then exactly\n"
    '<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}</tool_call>\n'
    "and the next turn is TOOL: with the tool's output. The last turn is an ASSISTANT answer without a tool call."
)


class TranscriptError(ValueError):
    """The text is not a usable transcript; the message says why."""


def _load_call(text: str) -> ParsedCall:
    try:
        return load_call(text)
    except ToolCallError as exc:
        raise TranscriptError(str(exc)) from None


def parse_assistant(text: str) -> tuple[str, str | None, list[ParsedCall]]:
    """(thought or answer text, reasoning, tool calls) of one assistant turn."""
    visible, reasoning = strip_reasoning(text)
    rest, blocks = tool_call_blocks(visible)
    if blocks or rest != visible:  # empty blocks are dropped, not read as calls
        return rest, reasoning, [_load_call(b) for b in blocks]
    fenced = _FENCED_JSON.search(visible)
    candidate = fenced.group(1) if fenced else first_balanced_object(visible)
    if candidate is not None:
        try:
            call = _load_call(candidate)
        except TranscriptError:
            return visible, reasoning, []
        rest = (visible.replace(fenced.group(0), "") if fenced else visible.replace(candidate, "")).strip()
        return rest, reasoning, [call]
    return visible, reasoning, []


def parse_transcript(text: str, *, call_prefix: str = "call") -> list[Step]:
    """Turn the whole transcript into steps; raises TranscriptError when it has no usable turns."""
    marks = list(_TURN.finditer(text))
    if not marks:
        raise TranscriptError("no USER:/ASSISTANT:/TOOL: turns found")
    steps: list[Step] = []
    pending: list[ApiAction] = []
    n_calls = 0
    for i, mark in enumerate(marks):
        role = mark.group(1).upper()
        body = text[mark.end() : marks[i + 1].start() if i + 1 < len(marks) else len(text)].strip()
        if role == "USER":
            steps.append(TextObservation(content=body, source="user"))
        elif role == "TOOL":
            call = pending.pop(0) if pending else None
            steps.append(
                TextObservation(
                    content=body,
                    source="environment",
                    name=call.function if call else None,
                    tool_call_id=call.tool_call_id if call else None,
                )
            )
        else:
            thought, reasoning, calls = parse_assistant(body)
            if not calls:
                steps.append(MessageAction(content=thought, reasoning=reasoning))
                continue
            for j, call in enumerate(calls):
                if not isinstance(call.arguments, dict):
                    raise TranscriptError(f"arguments of {call.name!r} are not a JSON object")
                n_calls += 1
                action = ApiAction(
                    function=call.name,
                    arguments=call.arguments,
                    thought=thought if j == 0 and thought else None,
                    reasoning=reasoning if j == 0 else None,
                    tool_call_id=f"{call_prefix}_{n_calls}",
                )
                steps.append(action)
                pending.append(action)
    if not any(s.kind in ("api", "message") for s in steps):
        raise TranscriptError("transcript has no assistant turn")
    return steps


def system_text(steps: list[Step]) -> str | None:
    """A trajectory's system prompt: the text before its first action that is named "system" or comes
    from the environment (what exporters hoist into the system message), joined; None when it has none."""
    parts: list[str] = []
    for step in steps:
        if step.kind in ("api", "code", "message") or (step.kind == "text" and step.source == "agent"):
            break
        if step.kind == "text" and (step.name == "system" or step.source == "environment") and step.content.strip():
            parts.append(step.content.strip())
    return "\n\n".join(parts) or None


def render_transcript(steps: list[Step]) -> str:
    """The inverse direction, for showing seed trajectories to a model in the same format."""
    lines: list[str] = []
    acted = False
    for step in steps:
        if step.kind == "text":
            if step.source != "user" and not acted:
                continue  # a system prompt before any action: shown apart from the transcript (`system_text`)
            role = "USER" if step.source == "user" else "TOOL"
            lines.append(f"{role}: {step.content}")
            continue
        acted = True
        if step.kind == "api":
            call = orjson.dumps({"name": step.function, "arguments": step.arguments}).decode()
            thought = f"{step.thought}\n" if step.thought else ""
            lines.append(f"ASSISTANT: {thought}<tool_call>{call}</tool_call>")
        elif step.kind == "message":
            lines.append(f"ASSISTANT: {step.content}")
        elif step.kind == "code":
            lines.append(f"ASSISTANT: {step.thought or ''}\n```{step.language}\n{step.content}\n```")
        elif step.kind == "json":
            lines.append(f"TOOL: {orjson.dumps(step.content).decode()}")
        elif step.kind == "web":
            page = step.axtree or step.html or ""
            # Where the page is matters to a reader (a judge, a relabeller) as much as what it shows.
            lines.append(f"TOOL: page {step.url}\n{page}" if step.url and page else f"TOOL: {page or step.url or ''}")
    return "\n".join(lines)
