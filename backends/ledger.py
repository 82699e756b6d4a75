"""Failure ledger: one JSONL line per request given up, so a job can finish and report its losses."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson

from backends.redact import Redactor


class FailureLedger:
    def __init__(self, path: str | Path | None, redact: Redactor):
        self.path = Path(path) if path else None
        self._redact = redact
        # Kept in memory too so a run summary (and tests) can read failures without the file.
        self.records: list[dict[str, Any]] = []
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, key: str, error_type: str, message: str, attempts: int, **extra: Any) -> dict[str, Any]:
        entry = {
            "ts": time.time(),
            "key": key,
            "error_type": error_type,
            "message": self._redact(message)[:2000],
            "attempts": attempts,
            **extra,
        }
        self.records.append(entry)
        if self.path:
            # O_APPEND single write per line: concurrent writers cannot interleave inside a line,
            # and a crash leaves at worst one partial last line.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, orjson.dumps(entry) + b"\n")
            finally:
                os.close(fd)
        return entry
