"""Secrets and PII: API keys, cloud keys, tokens, emails and phone numbers, scrubbed or dropped.

mode=scrub replaces each match with a placeholder (`<EMAIL>`, `<API_KEY>`, ...) in every
text field of every step, keeps the record, and records the counts in
`details["pii"] = {"scrubbed": n, "by_kind": {...}}`. mode=drop drops records with any match.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Iterable

from filters.base import BaseFilter, Decision, drop, keep, register
from schemas.models import Trajectory

# Order matters: specific key formats before the generic bearer/email/phone patterns.
PATTERNS: dict[str, tuple[re.Pattern[str], str]] = {
    "openai_key": (re.compile(r"\bsk-(?:proj-|ant-|live-|test-)?[A-Za-z0-9_-]{20,}"), "<API_KEY>"),
    "aws_key": (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "<AWS_KEY>"),
    "github_token": (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})"), "<GITHUB_TOKEN>"),
    "slack_token": (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), "<SLACK_TOKEN>"),
    "google_key": (re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"), "<API_KEY>"),
    "bearer_token": (re.compile(r"(?i)(?<=bearer )[A-Za-z0-9\-._~+/]{16,}=*"), "<TOKEN>"),
    "private_key": (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
                    "<PRIVATE_KEY>"),
    "email": (re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"), "<EMAIL>"),
    # +CC then 7-12 digits in groups, or North-American (xxx) xxx-xxxx / xxx-xxx-xxxx. Dates,
    # versions and plain long numbers do not match (separators are required).
    "phone": (re.compile(
        r"(?<![\w+])(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]\d{2,4}){1,3}"
        r"|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}|\d{3}[.-]\d{3}[.-]\d{4})(?![\w])"), "<PHONE>"),
}

_STEP_TEXT_FIELDS = ("content", "thought", "reasoning", "html", "axtree", "url")


class _Scrubber:
    def __init__(self, kinds: Iterable[str]) -> None:
        self.patterns = [(k, *PATTERNS[k]) for k in kinds]
        self.counts: Counter[str] = Counter()

    def text(self, value: str) -> str:
        for kind, pattern, placeholder in self.patterns:
            value, n = pattern.subn(placeholder, value)
            if n:
                self.counts[kind] += n
        return value

    def value(self, value: Any) -> Any:
        # Tool arguments and JSON observations are nested; scrub every string in them.
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value


@register("pii")
class Pii(BaseFilter):
    def __init__(self, mode: str = "scrub", kinds: Iterable[str] | None = None) -> None:
        if mode not in ("scrub", "drop"):
            raise ValueError(f"mode must be scrub or drop, not {mode!r}")
        unknown = set(kinds or ()) - set(PATTERNS)
        if unknown:
            raise ValueError(f"unknown pii kinds {sorted(unknown)}; known: {sorted(PATTERNS)}")
        self.mode = mode
        self.kinds = list(kinds or PATTERNS)

    def decide(self, record: Trajectory) -> Decision:
        scrubber = _Scrubber(self.kinds)
        out = record.model_copy(deep=True)
        for step in out.steps:
            for field in _STEP_TEXT_FIELDS:
                value = getattr(step, field, None)
                if isinstance(value, str):
                    setattr(step, field, scrubber.text(value))
            if step.kind == "api":
                step.arguments = scrubber.value(step.arguments)  # type: ignore[union-attr]
            if step.kind == "json":
                step.content = scrubber.value(step.content)  # type: ignore[union-attr]
        total = sum(scrubber.counts.values())
        if not total:
            return keep(record, 0.0)
        found = ", ".join(f"{k} ({n})" for k, n in sorted(scrubber.counts.items()))
        if self.mode == "drop":
            return drop(record, f"contains {found}", float(total))
        out.details = {**out.details, "pii": {"scrubbed": total, "by_kind": dict(sorted(scrubber.counts.items()))}}
        return keep(out, float(total))
