"""Content-addressed response cache in SQLite (WAL): a rerun never repeats a completed request."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import time
from collections.abc import Iterable
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


_INSERT = "INSERT OR REPLACE INTO responses (key, value, created) VALUES (?, ?, ?)"


def _row(key: str, completion: Completion) -> tuple[str, bytes, float]:
    return key, orjson.dumps(completion.to_dict()), time.time()


class ResponseCache:
    """Single-connection SQLite store used from one event loop thread.

    Every answer is committed before its caller sees it: with WAL, a SIGKILL loses at most the
    calls that were still in flight and never corrupts the file. `commit` groups the answers
    that arrive in the same event-loop turn into one transaction; a commit per answer cost more
    CPU than the rest of a request's client-side work.
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
        self._pending: list[tuple[str, bytes, float]] = []
        self._flushed: asyncio.Future[None] | None = None

    def get(self, key: str) -> Completion | None:
        row = self._db.execute("SELECT value FROM responses WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        return Completion.from_dict(orjson.loads(row[0]), cached=True)

    async def commit(self, items: Iterable[tuple[str, Completion]]) -> None:
        """Store answers; returns once they are committed, together with others of this loop turn."""
        self._pending.extend(_row(key, completion) for key, completion in items)
        if self._flushed is None:
            loop = asyncio.get_running_loop()
            self._flushed = loop.create_future()
            loop.call_soon(self._flush)
        # shield: a cancelled caller must not cancel the transaction others wait on.
        await asyncio.shield(self._flushed)

    def _flush(self) -> None:
        done, rows = self._flushed, self._pending
        if done is None:  # already flushed by close()
            return
        self._flushed, self._pending = None, []
        try:
            self._db.execute("BEGIN")
            self._db.executemany(_INSERT, rows)
            self._db.execute("COMMIT")
        except Exception as exc:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            done.set_exception(exc)
            done.exception()  # retrieved: every waiter may have been cancelled
        else:
            done.set_result(None)

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        self._flush()  # answers whose callers were cancelled mid-commit are still kept
        self._db.close()
