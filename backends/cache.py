"""Content-addressed response cache in SQLite (WAL): a rerun never repeats a completed request."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson

from backends.types import Completion


def request_digest(
    *,
    backend: str,
    model: str,
    messages: list[dict[str, Any]],
    params: dict[str, Any],
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    response_format: dict[str, Any] | None = None,
) -> hashlib._Hash:
    """Hash state for a request, before the sample index is mixed in.

    Sorted-key canonical JSON makes the key independent of dict ordering. The API key, headers
    and base_url are not part of it: they do not change what the model answers.
    """
    canonical = orjson.dumps(
        {
            "backend": backend,
            "model": model,
            "messages": messages,
            "params": params,
            "tools": tools,
            "tool_choice": tool_choice,
            "response_format": response_format,
        },
        option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
    )
    return hashlib.sha256(canonical)


def sample_key(digest: hashlib._Hash, index: int) -> str:
    """One cache entry per sample, so asking n=4 after n=2 only computes samples 2 and 3."""
    h = digest.copy()
    h.update(b"#sample=%d" % index)
    return h.hexdigest()


class ResponseCache:
    """Single-connection SQLite store used from one event loop thread.

    Each entry is committed on its own: with WAL, a SIGKILL loses at most the calls that were
    still in flight and never corrupts the file.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # check_same_thread=False: asyncio.to_thread users (tests, local engines) may touch it,
        # but all writes are still serialized by the GIL-held sqlite3 module lock.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL: durable across process crashes (only an OS crash can drop the last commits).
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, value BLOB NOT NULL, created REAL NOT NULL)"
        )

    def get(self, key: str) -> Completion | None:
        row = self._db.execute("SELECT value FROM responses WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        return Completion.from_dict(orjson.loads(row[0]), cached=True)

    def put(self, key: str, completion: Completion) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO responses (key, value, created) VALUES (?, ?, ?)",
            (key, orjson.dumps(completion.to_dict()), time.time()),
        )

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        self._db.close()
