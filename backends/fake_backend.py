"""In-process scripted backend for unit tests: deterministic answers, no HTTP."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import orjson

from backends.base import LLM
from backends.config import LLMConfig
from backends.types import ChatRequest, Completion, ToolCall, Usage

# A rule looks at the request and returns an answer, or None to let the next rule decide.
# Answers: str (text), ToolCall (a tool call), dict/list (JSON text), Completion (verbatim),
# or an Exception instance to raise (e.g. BackendError("rate_limit", ...)).
Rule = Callable[[ChatRequest], Any]


class FakeLLM(LLM):
    backend_name = "fake"
    local = True  # scripted in process: no bill

    def __init__(self, config: LLMConfig, rules: list[Rule] | None = None):
        super().__init__(config)
        self.rules: list[Rule] = list(rules or [])
        self.requests: list[ChatRequest] = []  # every raw call, for assertions

    async def _complete(self, request: ChatRequest) -> list[Completion]:
        self.requests.append(request)
        answer = None
        for rule in self.rules:
            answer = rule(request)
            if answer is not None:
                break
        if isinstance(answer, Exception):
            raise answer
        return [self._to_completion(answer, request, i) for i in range(request.n)]

    @staticmethod
    def _to_completion(answer: Any, request: ChatRequest, index: int) -> Completion:
        if isinstance(answer, Completion):
            return answer
        if isinstance(answer, ToolCall):
            return Completion("", [answer], "tool_calls", Usage(1, 1))
        if isinstance(answer, (dict, list)):
            text = orjson.dumps(answer).decode()
        elif answer is None:
            text = f"echo[{index}]: {request.last_user_text()}"
        else:
            text = str(answer)
        return Completion(text, [], "stop", Usage(len(request.messages), len(text.split())))


def tool_call(name: str, arguments: dict[str, Any]) -> ToolCall:
    return ToolCall(f"call_{uuid.uuid4().hex[:12]}", name, orjson.dumps(arguments).decode())
