"""Error taxonomy: which failures are worth retrying and which ones mean the server is overloaded."""

from __future__ import annotations

# Kinds that a retry can fix. "client" (4xx other than 408/409/429) is deliberately absent:
# repeating a bad request only burns quota.
RETRYABLE = frozenset({"rate_limit", "timeout", "server", "connection", "malformed", "truncated", "conflict",
                       "refused"})
# How an unusable answer's reason starts when the server or model refused it (a tool call the server
# could not parse, a model's refusal).
REFUSED = "refused"
# Kinds that signal congestion, so the adaptive limiter should back off.
OVERLOAD = frozenset({"rate_limit", "timeout"})


class BackendError(Exception):
    """A classified failure of one raw call. Messages must already be redacted."""

    def __init__(self, kind: str, message: str, *, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE


def kind_for_status(status: int) -> str:
    if status == 429:
        return "rate_limit"
    if status == 408:
        return "timeout"
    if status == 409:
        return "conflict"
    if status >= 500:
        return "server"
    return "client"


def parse_retry_after(value: str | None) -> float | None:
    """Seconds form only; HTTP-date Retry-After is rare on LLM APIs and not worth a date parser."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class LLMRequestError(Exception):
    """Raised by `LLM.chat` once a request is given up (after it was written to the ledger)."""

    def __init__(self, key: str, kind: str, message: str, attempts: int):
        super().__init__(f"{kind}: {message} (after {attempts} attempt(s), key {key[:12]})")
        self.key = key
        self.kind = kind
        self.attempts = attempts


class CapabilityError(Exception):
    """The backend or its server lacks what the caller asked for (e.g. prompt logprobs).

    Not a transient failure: never retried, never ledgered; callers fall back and say so.
    """


class EngineCrashed(Exception):
    """A local engine's process died (a crash in its native code) and did so again when restarted: no later request
    can succeed, so the run stops here, in one line, with its finished work kept for a re-run to resume. Never
    retried by the backend's retry loop, never quarantined as one task's failure."""
