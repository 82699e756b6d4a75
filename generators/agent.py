"""The agent policy: a model proposes the next action from the task, the tools and the history.

Two ways to ask, chosen by config: `tools` uses the server's native function calling (the
request carries the tool specs; vLLM, llama.cpp server, hosted APIs and the embedded
backend all return `tool_calls`), `text` asks for a ReAct-style turn (thought, then a
`<tool_call>` block or a final answer) and parses it, for servers without tool support.
A proposal that cannot be parsed is returned as such, with the raw text, so callers can
count it as a failed step instead of crashing.

Prompts are rendered incrementally: episodes and search trees ask about histories that extend
one already shown (the same step objects plus a few new ones), so the policy keeps the rendered
messages of recent histories and renders only the new steps. Histories are append-only: a step
is not edited after it has been shown to the policy.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from backends.base import LLM
from backends.types import Completion
from converters.export.render import RenderOptions, messages, render
from generators.transcript import TranscriptError, parse_assistant, strip_reasoning, tools_block
from schemas.models import ApiAction, MessageAction, Step, Tool, Trajectory

ACTION_KINDS = ("api", "code", "message")
# The start of a Proposal error for an answer cut short; episodes count failed steps by it.
TRUNCATED = "truncated answer"
RENDER_CACHE_SIZE = 512

SYSTEM = (
    "You are an agent that completes the user's task by calling the available tools. "
    "Think briefly, then call one tool at a time; when the task is done (or cannot be done), "
    "reply to the user without calling a tool."
)
TEXT_FORMAT = (
    "Reply with one short thought, then either exactly one\n"
    '<tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>\n'
    "or, when you are finished, your final answer to the user with no tool call."
)


@dataclass
class Proposal:
    """One sampled next action, or why none could be read from the model's answer."""

    action: ApiAction | MessageAction | None
    raw: str
    error: str | None = None


def openai_tools(tools: list[Tool]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description or "",
                "parameters": t.parameters or {"type": "object", "properties": {}},
            },
        }
        for t in tools
    ]


class AgentPolicy:
    """Samples next actions for a history; knows nothing of the environment behind the tools."""

    def __init__(
        self,
        llm: LLM,
        tools: list[Tool],
        *,
        mode: Literal["tools", "text"] = "tools",
        system: str = SYSTEM,
        temperature: float | None = None,
        seed: int | None = None,
        max_history_chars: int = 12_000,
    ) -> None:
        self.llm = llm
        self.tools = tools
        self._wire_tools = openai_tools(tools)  # built once: every proposal sends the same specs
        self.mode = mode
        self.system = system
        self.temperature = temperature
        self.seed = seed  # sent with every request: samples of one prompt under other seeds are other answers
        self.max_history_chars = max_history_chars
        self._rendered = _RenderCache(RenderOptions(reasoning=False, web_max_chars=max_history_chars))

    def system_prompt(self, guidance: str | None = None) -> str:
        """The system message this policy sends (before any system text a history brings)."""
        system = self.system
        if guidance:
            system = f"{system}\n\n{guidance}"
        if self.mode == "text":
            system = f"{system}\n\nTools (JSON, one per line):\n{tools_block(self.tools)}\n\n{TEXT_FORMAT}"
        return system

    def prompt(self, history: list[Step], guidance: str | None = None) -> list[dict[str, Any]]:
        system = self.system_prompt(guidance)
        history_msgs = self._rendered.messages(history)
        if self.mode == "text":
            history_msgs = [text_message(m) for m in history_msgs]
        # A hoisted system turn from the history joins ours: chat templates take one system message.
        if history_msgs and history_msgs[0]["role"] == "system":
            system = f"{system}\n\n{history_msgs.pop(0)['content']}"
        return [{"role": "system", "content": system}, *_trim(history_msgs, self.max_history_chars)]

    async def propose(self, history: list[Step], *, n: int = 1, guidance: str | None = None) -> list[Proposal]:
        """n candidate next actions (distinct samples: each is its own cache entry)."""
        msgs = self.prompt(history, guidance)
        params: dict[str, Any] = {}
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self.seed is not None:
            params["seed"] = self.seed
        if self.mode == "tools":
            completions = await self.llm.chat(msgs, tools=self._wire_tools, n=n, **params)
        else:
            completions = await self.llm.chat(msgs, n=n, **params)
        return [_truncated(c) if c.finish_reason == "length" else self._read(c.text, c.tool_calls)
                for c in completions]

    def _read(self, text: str, tool_calls: list[Any]) -> Proposal:
        visible, reasoning = strip_reasoning(text or "")
        if tool_calls:
            call = tool_calls[0]
            try:
                arguments = orjson.loads(call.arguments) if call.arguments.strip() else {}
            except orjson.JSONDecodeError:
                return Proposal(None, call.arguments, f"arguments of {call.name!r} are not JSON")
            if not isinstance(arguments, dict):
                return Proposal(None, call.arguments, f"arguments of {call.name!r} are not a JSON object")
            return Proposal(ApiAction(function=call.name, arguments=arguments, thought=visible or None,
                                      reasoning=reasoning, tool_call_id=call.id), text)
        try:
            thought, reasoning, calls = parse_assistant(text or "")
        except TranscriptError as exc:
            return Proposal(None, text, str(exc))
        if calls:
            call = calls[0]
            if not isinstance(call.arguments, dict):
                return Proposal(None, text, f"arguments of {call.name!r} are not a JSON object")
            return Proposal(ApiAction(function=call.name, arguments=call.arguments, thought=thought or None,
                                      reasoning=reasoning), text)
        if not thought:
            return Proposal(None, text, "empty answer")
        return Proposal(MessageAction(content=thought, reasoning=reasoning), text)


def _truncated(completion: Completion) -> Proposal:
    """An answer the backend could only get cut short: never an action (its end is missing)."""
    raw = completion.text or "".join(f"{c.name}({c.arguments}" for c in completion.tool_calls)
    return Proposal(None, raw, f"{TRUNCATED} (finish_reason=length after the retries)")


class _RenderCache:
    """Rendered history messages by the identity of the history's steps (LRU).

    An entry keeps its steps alive, so their ids cannot be reused while it exists. A history
    that extends an entry's steps renders only the new steps, which is exact when the entry ends
    on an observation with every tool call answered and the new steps start with an action: then
    no message straddles the boundary (no merged calls, no pending answers, no system hoisting).
    """

    def __init__(self, opts: RenderOptions, size: int = RENDER_CACHE_SIZE) -> None:
        self.opts = opts
        self.size = size
        self._entries: OrderedDict[tuple[int, ...], tuple[list[Step], list[dict[str, Any]], bool]] = OrderedDict()

    def messages(self, history: list[Step]) -> list[dict[str, Any]]:
        ids = tuple(map(id, history))
        base, base_msgs = 0, []
        for k in range(len(ids), 0, -1):
            entry = self._entries.get(ids[:k])
            if entry is not None and (k == len(ids) or (entry[2] and _opens_turn(history[k]))):
                self._entries.move_to_end(ids[:k])
                base, base_msgs = k, entry[1]
                break
        if base == len(history):
            return list(base_msgs)
        tail = [_pinned_call_id(step, base + j) for j, step in enumerate(history[base:])] if base else history
        msgs = base_msgs + messages(render(Trajectory(id="prompt", source="agent", steps=tail), self.opts,
                                           require_assistant=False))
        self._entries[ids] = (list(history), msgs, _extensible(history, msgs))
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return list(msgs)


def _opens_turn(step: Step) -> bool:
    """Whether rendering `step` starts a new assistant message (an action or text the agent wrote)."""
    return step.kind in ACTION_KINDS or (step.kind == "text" and step.source == "agent")


def _extensible(history: list[Step], msgs: list[dict[str, Any]]) -> bool:
    """Whether later steps may be rendered on their own after these messages (see `_RenderCache`)."""
    if not history or history[-1].kind in ACTION_KINDS:
        return False
    calls = sum(len(m.get("tool_calls") or ()) for m in msgs)
    return calls == sum(1 for m in msgs if m["role"] == "tool")


def _pinned_call_id(step: Step, index: int) -> Step:
    """An api step rendered away from its position keeps the id it gets there (`call_<index>`)."""
    if step.kind == "api" and not step.tool_call_id:
        return step.model_copy(update={"tool_call_id": f"call_{index}"})
    return step


def text_message(message: dict[str, Any]) -> dict[str, Any]:
    """Chat messages without tool roles, for servers that have no function calling."""
    if message["role"] == "tool":
        return {"role": "user", "content": f"TOOL: {message['content']}"}
    if message.get("tool_calls"):
        calls = "".join(
            f'<tool_call>{{"name": {orjson.dumps(c["function"]["name"]).decode()}, "arguments": {c["function"]["arguments"]}}}</tool_call>'
            for c in message["tool_calls"]
        )
        return {"role": "assistant", "content": f"{message.get('content') or ''}\n{calls}".strip()}
    return {"role": message["role"], "content": message.get("content") or ""}


def _trim(history: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """Keep the first message (the task) and as many recent ones as fit in `limit` characters."""
    if not history:
        return history
    size = sum(len(str(m.get("content") or "")) for m in history)
    if size <= limit:
        return history
    head, tail = history[:1], history[1:]
    while tail and size > limit:
        dropped = tail.pop(0)
        size -= len(str(dropped.get("content") or ""))
    # Never start on a tool answer whose call was dropped (templates reject orphans).
    while tail and tail[0]["role"] == "tool":
        tail.pop(0)
    return head + tail



