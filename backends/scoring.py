"""Teacher-forcing scores: how likely a model finds a given conversation, token by token.

`LLM.prompt_logprobs(messages)` asks a backend for the log-probability of every token of a
conversation it is shown (no generation): vLLM's `prompt_logprobs` extra parameter on the
OpenAI-compatible API, llama.cpp's echoed logprobs in the embedded backend. `target_loss` turns
those into the mean negative log-likelihood of chosen messages (the assistant turns training
would put loss on), locating each message in the tokens by its text, so no tokenizer is needed
on this side. A backend or server that cannot score raises `ScoringUnsupported`: callers fall
back to something else and say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import orjson

from backends.errors import CapabilityError


class ScoringUnsupported(CapabilityError):
    """The backend or its server cannot return prompt logprobs; the message says which and why."""


class ScoringError(ValueError):
    """The scored tokens cannot be matched with the messages (e.g. a template rewrote a turn)."""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One prompt token as the server decoded it, with its log-probability (None for the first token)."""

    text: str
    logprob: float | None


@dataclass(frozen=True, slots=True)
class TargetLoss:
    """Mean negative log-likelihood over the target messages' tokens, and how many tokens that was."""

    mean_nll: float
    tokens: int


def parse_prompt_logprobs(entries: Any) -> list[TokenLogprob]:
    """vLLM's `prompt_logprobs` list -> tokens.

    Each entry is null (the first token) or `{token_id: {logprob, rank, decoded_token}}`: the
    prompt token itself, plus the top alternatives when more were asked for. The prompt token is
    the entry of highest rank (when it is itself the top choice it is the only entry).
    """
    if not isinstance(entries, list):
        raise ScoringError(f"prompt_logprobs is not a list but {type(entries).__name__}")
    out: list[TokenLogprob] = []
    for entry in entries:
        if entry is None:
            out.append(TokenLogprob("", None))
            continue
        if not isinstance(entry, dict) or not entry:
            raise ScoringError("a prompt_logprobs entry is not a mapping of token ids")
        own = max(entry.values(), key=lambda v: int(v.get("rank") or 0))
        out.append(TokenLogprob(str(own.get("decoded_token") or ""), float(own["logprob"])))
    return out


def target_loss(tokens: Sequence[TokenLogprob], messages: Sequence[dict[str, Any]], targets: Iterable[int]) -> TargetLoss:
    """The mean NLL of the tokens that make up the contents of `messages[i]` for i in `targets`.

    The decoded tokens, joined, give the templated conversation; each message's content is found
    in it in order (special tokens decode to markers or to nothing, which does not matter). A
    token counts for a target when it overlaps the target's content. Messages other than targets
    that cannot be found are skipped (templates may drop or rewrite a system turn); a target that
    cannot be found raises ScoringError.
    """
    wanted = set(targets)
    text = "".join(t.text for t in tokens)
    spans: list[tuple[int, int]] = []
    cursor = 0
    for i, message in enumerate(messages):
        content = str(message.get("content") or "")
        if not content.strip():
            continue
        start = text.find(content, cursor)
        if start < 0:
            if i in wanted:
                raise ScoringError(f"message {i} ({message.get('role')}) is not in the scored tokens")
            continue
        cursor = start + len(content)
        if i in wanted:
            spans.append((start, cursor))
    total, count, offset, s = 0.0, 0, 0, 0
    for token in tokens:
        begin, offset = offset, offset + len(token.text)
        while s < len(spans) and spans[s][1] <= begin:
            s += 1
        if s < len(spans) and token.logprob is not None and begin < spans[s][1] and offset > spans[s][0]:
            total -= token.logprob
            count += 1
    if not count:
        raise ScoringError("no scored token falls inside the target messages")
    return TargetLoss(total / count, count)


def encode(tokens: Sequence[TokenLogprob]) -> str:
    """Tokens as compact JSON text (how the response cache stores a score)."""
    return orjson.dumps([[t.text, t.logprob] for t in tokens]).decode()


def decode(text: str) -> list[TokenLogprob]:
    return [TokenLogprob(t, lp) for t, lp in orjson.loads(text)]
