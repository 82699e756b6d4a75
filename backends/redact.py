"""Scrub API keys out of any text that may reach logs, the ledger, or exception messages."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# Generic shapes of bearer tokens/keys, so keys are caught even when we were not told the value
# (e.g. a hosted API echoing a partial key back in its error body).
_PATTERNS = re.compile(
    r"(sk-[A-Za-z0-9_\-*]{6,}|Bearer\s+\S+|(?i:api[_-]?key)[\"']?\s*[:=]\s*[\"']?[^\s\"',}]+)"
)


class Redactor:
    def __init__(self, secrets: list[str] | None = None):
        # Very short values would redact ordinary words; real keys are long.
        self._secrets = [s for s in (secrets or []) if s and len(s) >= 6]

    def __call__(self, text: str) -> str:
        for s in self._secrets:
            if s in text:
                text = text.replace(s, "***")
        return _PATTERNS.sub("***", text)


def endpoint_name(url: str) -> str:
    """A server's URL as logs and summaries show it: no user:password, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else url.split("?", 1)[0]
