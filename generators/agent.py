"""The agent policy: a model proposes the next action from the task, the tools and the history.

Two ways to ask, chosen by config: `tools` uses the server's native function calling (the
request carries the tool specs; vLLM, llama.cpp server, hosted APIs and the embedded
backend all return `tool_calls`), `text` asks for a ReAct-style turn (thought, then a
`<tool_call>` block or a final answer) and parses it, for servers without tool support.
A proposal that cannot be parsed is returned as such, with the raw text, so callers can
count it as a failed step instead of crashing.

What the model is sent is a pure function of the history and the policy's `RenderSettings`
(`converters.export.request.request`, the function exporters rebuild requests with): a history
opens with the policy's system step (`system_step`: its instructions, the environment's policy, a
method's guidance, in text mode the tools), which the renderer hoists into the system message; a
history without one gets the policy's. The tools go out as the specs the trajectory records.

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
from backends.errors import REFUSED
from backends.types import Completion
from converters.export.render import RenderOptions, messages, render, text_message
from converters.export.request import TEXT_FORMAT, request, system_prompt  # noqa: F401 - TEXT_FORMAT: methods hash it
from converters.export.tools import function_spec
from generators.transcript import TranscriptError, parse_assistant, strip_reasoning
from schemas.models import (ApiAction, MessageAction, RenderSettings, Step, TextObservation, Tool, Trajectory,
                            Usage, is_system_step, system_step)

ACTION_KINDS = ("api", "code", "message")
# The start of a Proposal error for an answer cut short (or refused: `REFUSED`); episodes count failed steps by it.
TRUNCATED = "truncated answer"
RENDER_CACHE_SIZE = 512
# The history window and page limit of agent prompts, in characters.
MAX_HISTORY_CHARS = 12_000

SYSTEM = (
    "You are an agent that completes the user's task by calling the available tools. "
    "Think briefly, then call one tool at a time; when the task is done (or cannot be done), "
    "reply to the user without calling a tool."
)


@dataclass
class Proposal:
    """One sampled next action, or why none could be read from the model's answer."""

    action: ApiAction | MessageAction | None
    raw: str
    error: str | None = None
    # The model call that made it (the action carries it too); a failed step records it.
    usage: Usage | None = None
    # The policy stops acting (an outside caller ended the episode): the loop ends it and evaluates it as it stands.
    end: bool = False


def agent_settings(mode: Literal["tools", "text"] = "tools",
                   max_history_chars: int = MAX_HISTORY_CHARS) -> RenderSettings:
    """How an agent policy renders its prompts: pages and the history window cut at `max_history_chars`,
    earlier reasoning not sent again."""
    return RenderSettings(tool_format=mode, web_max_chars=max_history_chars, history_chars=max_history_chars,
                          reasoning=False)


def openai_tools(tools: list[Tool]) -> list[dict[str, Any]]:
    """The tools as sent: the specs exporters write for the trajectory's tools (so rows carry them as sent)."""
    return [{"type": "function", "function": function_spec(t.name, t.description, t.parameters)} for t in tools]


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
        max_history_chars: int = MAX_HISTORY_CHARS,
        seed: int | None = None,
    ) -> None:
        self.llm = llm
        # A sampling seed of its own: independent draws of one policy (Monte Carlo rollouts) send the same
        # prompts with different seeds, so no draw is answered from another's cache entry or in-flight call.
        self.seed = seed
        self.tools = tools
        self._wire_tools = openai_tools(tools)  # built once: every proposal sends the same specs
        self.mode = mode
        self.system = system
        self.temperature = temperature
        self.max_history_chars = max_history_chars
        self.settings = agent_settings(mode, max_history_chars)
        # Cached in the tools format: `_extensible` sees pending calls there; text mode converts after.
        self._rendered = _RenderCache(RenderOptions(reasoning=False, web_max_chars=max_history_chars))
        self._system_steps: dict[str | None, TextObservation] = {}

    def system_step(self, guidance: str | None = None) -> TextObservation:
        """The step that opens this policy's histories: the system prompt it sends (with `guidance`, a
        method's words for one episode). One object per guidance, so cached renders stay reusable."""
        step = self._system_steps.get(guidance)
        if step is None:
            step = system_step(system_prompt(self.system, self.tools, self.mode, guidance))
            self._system_steps[guidance] = step
        return step

    def prompt(self, history: list[Step]) -> list[dict[str, Any]]:
        """The messages sent for `history` (`converters.export.request.request` of its render)."""
        if not history or not is_system_step(history[0]):
            history = [self.system_step(), *history]
        rendered = self._rendered.messages(history)
        if self.mode == "text":
            rendered = [text_message(m) for m in rendered]
        return request(rendered, self.settings)

    async def propose(self, history: list[Step], *, n: int = 1) -> list[Proposal]:
        """n candidate next actions (distinct samples: each is its own cache entry)."""
        msgs = self.prompt(history)
        params: dict[str, Any] = {}
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self.seed is not None:
            params["seed"] = self.seed
        if self.mode == "tools":
            completions = await self.llm.chat(msgs, tools=self._wire_tools, n=n, **params)
        else:
            completions = await self.llm.chat(msgs, n=n, **params)
        proposals = []
        for c in completions:
            proposal = _unusable(c) if c.unusable or c.finish_reason == "length" else self._read(c.text, c.tool_calls)
            proposal.usage = self.llm.step_usage(c)
            if proposal.action is not None:
                proposal.action.usage = proposal.usage
            proposals.append(proposal)
        return proposals

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


def _unusable(completion: Completion) -> Proposal:
    """An answer the backend could only get unusable (cut short, an unparseable or refused tool call):
    never an action (its end is missing, or its call cannot be made)."""
    raw = completion.text or "".join(f"{c.name}({c.arguments}" for c in completion.tool_calls)
    if completion.finish_reason == "length":
        return Proposal(None, raw, f"{TRUNCATED} (finish_reason=length after the retries)")
    why = completion.unusable or "unusable answer"
    return Proposal(None, raw, why if why.startswith(REFUSED) else f"unreadable answer: {why}")


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
