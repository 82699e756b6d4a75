"""Render a Trajectory as chat turns: OpenAI-style messages, each tagged with its source steps.

Every output format is built from these turns, so the rules live here once:

- **system**: text observations before the first action that are named "system" or come from
  the environment become one `system` message (joined with blank lines) placed first — chat
  templates accept a system message only at the start. Later ones are ordinary observations.
- **user**: other observations that answer no tool call (the task, user follow-ups, the output
  of a code action) become `user` messages.
- **api action** -> an assistant message with `tool_calls=[{"id", "type": "function",
  "function": {"name", "arguments": <JSON string>}}]`; its thought is the message `content`.
  Consecutive api actions with no observation between them (and the same loss mask) share one
  assistant message (parallel calls). The call id is the step's `tool_call_id`, else `call_<step>`.
- **tool**: observations that follow tool calls answer them in order (whatever their `source`:
  some datasets label tool output as "user"), as `role: tool` messages with the matching
  `tool_call_id` (the observation's own `tool_call_id` when it names a pending call). A call
  still unanswered when the next assistant message starts gets an empty tool message, so every
  call is answered (OpenAI and most chat templates require it).
- **code action** -> an assistant message with the code in a fenced block (```` ```<language> ````),
  after the thought. We chose fenced code over an invented `execute_<language>` tool: it is the
  CodeAct convention the source datasets use, needs no synthetic tool specs, and works with
  models that have no tool-call syntax. Its output (an observation) is a `user` message.
- **message action** -> an assistant message (thought, if any, then the text).
- **agent text observations** (source "agent") are text the agent wrote -> assistant messages.
- **reasoning** goes into `reasoning_content` on the assistant message, or is dropped
  (`RenderOptions.reasoning=False`).
- **observation content**: text as is; json dumped (`json.dumps`, unicode kept); images as
  `[image: <path>]` (never pixels); web pages as `URL: <url>` plus the accessibility tree (else
  the html), truncated to `web_max_chars` with a marker, plus `[screenshot: <path>]`.

A trajectory with no assistant turn cannot be rendered: `Unrenderable` carries the reason.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from schemas.models import Trajectory

# A hoisted system turn belongs to every prompt, whatever the split point.
SYSTEM_STEP = -1


class Unrenderable(Exception):
    """The record cannot become a training example; the message is the (short, stable) reason."""


@dataclass(frozen=True)
class RenderOptions:
    reasoning: bool = True
    web_max_chars: int = 20_000


@dataclass
class Turn:
    """One chat message plus the steps it came from (inclusive) and its loss mask."""

    message: dict[str, Any]
    first_step: int
    last_step: int
    train: bool = True
    steps: list[int] = field(default_factory=list)

    @property
    def role(self) -> str:
        return self.message["role"]

    @property
    def is_assistant(self) -> bool:
        return self.message["role"] == "assistant"


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _truncate(text: str, limit: int) -> str:
    if limit <= 0 or len(text) <= limit:
        return text
    return f"{text[:limit]}\n...[truncated {len(text) - limit} chars]"


def observation_text(step: Any, opts: RenderOptions) -> str:
    """The text a model sees for one observation step."""
    kind = step.kind
    if kind == "text":
        return step.content
    if kind == "json":
        return dumps(step.content)
    if kind == "image":
        return f"[image: {step.image.path}]"
    if kind == "web":
        parts = []
        if step.url:
            parts.append(f"URL: {step.url}")
        body = step.axtree or step.html
        if body:
            parts.append(_truncate(body, opts.web_max_chars))
        if step.screenshot is not None:
            parts.append(f"[screenshot: {step.screenshot.path}]")
        return "\n\n".join(parts)
    raise Unrenderable(f"unknown step kind {kind}")


def _with_thought(thought: str | None, text: str) -> str:
    return f"{thought}\n\n{text}" if thought else text


def _join(a: str, b: str) -> str:
    return f"{a}\n\n{b}" if a and b else a or b


def _is_system(step: Any, seen_action: bool) -> bool:
    if step.kind != "text":
        return False
    return step.name == "system" or (not seen_action and step.source == "environment")


class _Renderer:
    def __init__(self, traj: Trajectory, opts: RenderOptions, breaks: frozenset[int],
                 require_assistant: bool = True) -> None:
        self.require_assistant = require_assistant
        self.traj = traj
        self.opts = opts
        self.breaks = breaks
        self.turns: list[Turn] = []
        self.system: list[str] = []
        self.system_steps: list[int] = []
        # Tool calls awaiting an answer: (call id, index of the api step that made it).
        self.pending: deque[tuple[str, int]] = deque()

    def run(self) -> list[Turn]:
        seen_action = False
        for i, step in enumerate(self.traj.steps):
            if step.kind in ("api", "code", "message"):
                self._action(i, step)
                seen_action = True
            elif step.kind == "text" and step.source == "agent":
                self._assistant(i, {"role": "assistant", "content": step.content}, step.train)
                seen_action = True
            elif self.pending:
                self._tool_result(i, step)
            elif not seen_action and _is_system(step, seen_action):
                self.system.append(step.content)
                self.system_steps.append(i)
            else:
                self._append(Turn({"role": "user", "content": observation_text(step, self.opts)}, i, i, steps=[i]))
        if self.system:
            turn = Turn({"role": "system", "content": "\n\n".join(self.system)}, SYSTEM_STEP, SYSTEM_STEP,
                        steps=self.system_steps)
            self.turns.insert(0, turn)
        if self.require_assistant and not any(t.is_assistant for t in self.turns):
            raise Unrenderable("no assistant turn")
        return self.turns

    def _append(self, turn: Turn) -> None:
        self.turns.append(turn)

    def _flush_pending(self) -> None:
        # Every call must be answered before the next assistant message (OpenAI / templates).
        while self.pending:
            call_id, step = self.pending.popleft()
            self._append(Turn({"role": "tool", "content": "", "tool_call_id": call_id}, step, step, steps=[step]))

    def _tool_result(self, i: int, step: Any) -> None:
        call_id = step.tool_call_id
        match = next((p for p in self.pending if p[0] == call_id), None) if call_id else None
        if match is None:
            match = self.pending[0]
        self.pending.remove(match)
        message = {"role": "tool", "content": observation_text(step, self.opts), "tool_call_id": match[0]}
        self._append(Turn(message, i, i, steps=[i]))

    def _mergeable(self, i: int, train: bool) -> Turn | None:
        """The previous assistant message an api action at step i may join, if any."""
        if i in self.breaks or not self.turns:
            return None
        last = self.turns[-1]
        if last.is_assistant and last.last_step == i - 1 and last.train == train and last.steps:
            prev = self.traj.steps[last.last_step]
            if prev.kind in ("api", "message"):
                return last
        return None

    def _action(self, i: int, step: Any) -> None:
        reasoning = step.reasoning if self.opts.reasoning else None
        if step.kind == "api":
            call_id = step.tool_call_id or f"call_{i}"
            call = {"id": call_id, "type": "function",
                    "function": {"name": step.function, "arguments": dumps(step.arguments)}}
            target = self._mergeable(i, step.train)
            if target is not None:
                msg = target.message
                msg["content"] = _join(msg.get("content") or "", step.thought or "")
                msg.setdefault("tool_calls", []).append(call)
                if reasoning:
                    msg["reasoning_content"] = _join(msg.get("reasoning_content") or "", reasoning)
                target.last_step = i
                target.steps.append(i)
            else:
                message = {"role": "assistant", "content": step.thought or "", "tool_calls": [call]}
                if reasoning:
                    message["reasoning_content"] = reasoning
                self._assistant(i, message, step.train)
            self.pending.append((call_id, i))
            return
        if step.kind == "code":
            text = _with_thought(step.thought, f"```{step.language}\n{step.content}\n```")
        else:
            text = _with_thought(step.thought, step.content)
        message = {"role": "assistant", "content": text}
        if reasoning:
            message["reasoning_content"] = reasoning
        self._assistant(i, message, step.train)

    def _assistant(self, i: int, message: dict[str, Any], train: bool) -> None:
        # A new assistant message: answer what is still open first. (The api action pushes its
        # own call onto `pending` only after this, so it is never answered by itself.)
        self._flush_pending()
        self._append(Turn(message, i, i, train=train, steps=[i]))


def render(traj: Trajectory, opts: RenderOptions = RenderOptions(), breaks: Iterable[int] = (),
           *, require_assistant: bool = True) -> list[Turn]:
    """The trajectory as chat turns. `breaks`: steps that must start a new message (split points).

    `require_assistant=False` renders a history that has no agent turn yet (an agent's prompt).
    """
    if not traj.steps:
        raise Unrenderable("empty trajectory")
    return _Renderer(traj, opts, frozenset(breaks), require_assistant).run()


def messages(turns: Iterable[Turn]) -> list[dict[str, Any]]:
    return [t.message for t in turns]


def split_at(turns: list[Turn], step: int) -> tuple[list[Turn], list[Turn]]:
    """Turns before step `step` and from it on (render with `breaks=[step]` so none straddles)."""
    before = [t for t in turns if t.first_step < step]
    after = [t for t in turns if t.first_step >= step]
    return before, after


def leading_context(turns: list[Turn]) -> int:
    """Index of the first assistant turn: everything before it is the task prompt."""
    return next(k for k, t in enumerate(turns) if t.is_assistant)


def last_assistant(turns: list[Turn]) -> int:
    return max(k for k, t in enumerate(turns) if t.is_assistant)
