"""Plain value types exchanged between the wrapper layer and backend implementations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Slotted dataclasses instead of pydantic models: these are built once per response on the
# hot path, where client CPU (not the server) bounds throughput.


@dataclass(slots=True, frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text, exactly as the model produced it


@dataclass(slots=True, frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True, frozen=True)
class TokenIds:
    """The ids a sample's model was fed and produced, and the logprob of each produced one (None: not given)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None = None

    def to_list(self) -> list[Any]:
        return [self.prompt_ids, self.completion_ids, self.logprobs]


@dataclass(slots=True, frozen=True)
class Completion:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    # Tokens of this sample; after the wrapper, sample 0 also carries those of the call's retried attempts.
    usage: Usage = field(default_factory=Usage)
    cached: bool = False
    # Seconds the model took over the call's attempts, and attempts beyond the first (sample 0 carries them).
    latency_s: float = 0.0
    retries: int = 0
    # Why the answer cannot be used (cut short, unparseable tool call, refused), when the wrapper gave
    # up asking again and hands it back as it is; None for a usable answer.
    unusable: str | None = None
    # The call's token ids where the backend gives them (`llm.token_ids`), cached with the answer.
    tokens: TokenIds | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {
            "text": self.text,
            "tool_calls": [[t.id, t.name, t.arguments] for t in self.tool_calls],
            "finish_reason": self.finish_reason,
            "usage": [self.usage.prompt_tokens, self.usage.completion_tokens],
            "latency_s": self.latency_s,
            "retries": self.retries,
        }
        if self.unusable is not None:
            data["unusable"] = self.unusable
        if self.tokens is not None:
            data["tokens"] = self.tokens.to_list()
        return data

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, cached: bool = False) -> Completion:
        # latency_s / retries / unusable are absent from entries cached by earlier versions.
        return cls(
            text=d["text"],
            tool_calls=[ToolCall(*t) for t in d["tool_calls"]],
            finish_reason=d["finish_reason"],
            usage=Usage(*d["usage"]),
            cached=cached,
            latency_s=d.get("latency_s", 0.0),
            retries=d.get("retries", 0),
            unusable=d.get("unusable"),
            tokens=TokenIds(*d["tokens"]) if d.get("tokens") else None,
        )


@dataclass(slots=True)
class ChatRequest:
    """What a backend's `_complete` receives: everything needed for one raw call."""

    messages: list[dict[str, Any]]
    params: dict[str, Any]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    n: int = 1

    def last_user_text(self) -> str:
        for m in reversed(self.messages):
            if m.get("role") == "user" and isinstance(m.get("content"), str):
                return m["content"]
        return ""


def split_usage(prompt_tokens: int, completion_tokens: int, n: int) -> list[Usage]:
    """Spread one raw call's usage over its n samples so that summing samples gives the real cost.

    The prompt is billed once, so it goes to the first sample only.
    """
    share, rest = divmod(completion_tokens, max(n, 1))
    return [Usage(prompt_tokens if i == 0 else 0, share + (rest if i == 0 else 0)) for i in range(n)]
