"""Streams export rows into `OUT/data/train-XXXXX-of-YYYYY.parquet` (zstd) or `.jsonl` shards.

The driver hands over one Arrow batch (Parquet) or one list of rows (JSONL) per input batch;
nothing else is held, so memory is bounded by the input batch, not by the export. Parquet row
groups hold at most `row_group_rows` rows. Encoding and compressing Parquet runs in a background
thread (Arrow releases the GIL there) while the driver renders the next batch; at most
`QUEUE_BATCHES` batches wait for it. The total shard count is unknown until the end, so
shards are written under hidden temp names and renamed `train-<k>-of-<n>` on `close()`; an
export that fails midway leaves no visible partial shard. (The driver refuses an export with no
row: `datasets` cannot load a directory of empty shards.)
"""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

DEFAULT_SHARD_ROWS = 50_000
ROW_GROUP_ROWS = 1_000
TEMP_PREFIX = ".tmp-"
QUEUE_BATCHES = 2
_DONE = object()


def shard_name(k: int, n: int, ext: str) -> str:
    return f"train-{k:05d}-of-{n:05d}.{ext}"


class ShardWriter:
    def __init__(self, data_dir: Path, file_type: str, schema: pa.Schema | None,
                 shard_rows: int = DEFAULT_SHARD_ROWS, row_group_rows: int = ROW_GROUP_ROWS) -> None:
        if shard_rows < 1:
            raise ValueError("shard_rows must be >= 1")
        if file_type == "parquet" and schema is None:
            raise ValueError("a Parquet export needs a schema")
        self.data_dir = data_dir
        self.file_type = file_type
        self.schema = schema
        self.shard_rows = shard_rows
        self.row_group_rows = min(row_group_rows, shard_rows)
        self.rows = 0
        self._temps: list[Path] = []
        self._in_shard = 0
        self._parquet: pq.ParquetWriter | None = None
        self._jsonl: Any = None
        self._queue: queue.Queue[Any] = queue.Queue(QUEUE_BATCHES)
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        data_dir.mkdir(parents=True, exist_ok=True)

    @property
    def ext(self) -> str:
        return "jsonl" if self.file_type == "jsonl" else "parquet"

    def _room(self) -> int:
        """Rows the open shard still takes, opening the next shard when it is full."""
        if self._in_shard >= self.shard_rows:
            self._close_shard()
        if self._parquet is None and self._jsonl is None:
            self._open_shard()
        return self.shard_rows - self._in_shard

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Queue a batch for the background thread (blocks while `QUEUE_BATCHES` wait)."""
        self._raise()
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="trajforge-shard-writer", daemon=True)
            self._thread.start()
        self.rows += batch.num_rows
        self._queue.put(batch)

    def _drain(self) -> None:
        while (batch := self._queue.get()) is not _DONE:
            if self._error is None:
                try:
                    self._write(batch)
                except BaseException as exc:  # handed to the driver's thread by _raise()
                    self._error = exc

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _join(self) -> None:
        if self._thread is not None:
            self._queue.put(_DONE)
            self._thread.join()
            self._thread = None

    def _write(self, batch: pa.RecordBatch) -> None:
        done = 0
        while done < batch.num_rows:
            n = min(self._room(), batch.num_rows - done)
            assert self._parquet is not None
            self._parquet.write_batch(batch.slice(done, n), row_group_size=self.row_group_rows)
            self._in_shard += n
            done += n

    def write_lines(self, rows: list[dict[str, Any]]) -> None:
        done = 0
        while done < len(rows):
            n = min(self._room(), len(rows) - done)
            self._jsonl.write(b"".join(orjson.dumps(row) + b"\n" for row in rows[done:done + n]))
            self._in_shard += n
            self.rows += n
            done += n

    def _open_shard(self) -> None:
        tmp = self.data_dir / f"{TEMP_PREFIX}{len(self._temps):05d}.{self.ext}"
        self._temps.append(tmp)
        self._in_shard = 0
        if self.file_type == "jsonl":
            self._jsonl = open(tmp, "wb")
        else:
            self._parquet = pq.ParquetWriter(tmp, self.schema, compression="zstd")

    def _close_shard(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None

    def close(self) -> list[Path]:
        """Finish the last shard and give every shard its final name; returns the final paths."""
        self._join()
        self._raise()
        self._close_shard()
        n = len(self._temps)
        final = []
        for k, tmp in enumerate(self._temps):
            path = self.data_dir / shard_name(k, n, self.ext)
            os.replace(tmp, path)
            final.append(path)
        return final

    def abort(self) -> None:
        try:
            self._join()
            self._close_shard()
        finally:
            for tmp in self._temps:
                tmp.unlink(missing_ok=True)
