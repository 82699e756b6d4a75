"""Streams export rows into `OUT/data/train-XXXXX-of-YYYYY.parquet` (zstd) or `.jsonl` shards.

Rows are buffered only up to one row group, so memory is bounded by `row_group_rows`, not by
the export. The total shard count is unknown until the end, so shards are written under hidden
temp names and renamed `train-<k>-of-<n>` on `close()`; an export that fails midway leaves no
visible partial shard. An empty export still writes one empty shard so the directory loads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

DEFAULT_SHARD_ROWS = 50_000
ROW_GROUP_ROWS = 1_000
TEMP_PREFIX = ".tmp-"


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
        self._buffer: list[dict[str, Any]] = []
        self._parquet: pq.ParquetWriter | None = None
        self._jsonl: Any = None
        data_dir.mkdir(parents=True, exist_ok=True)

    @property
    def ext(self) -> str:
        return "jsonl" if self.file_type == "jsonl" else "parquet"

    def write(self, row: dict[str, Any]) -> None:
        if self._in_shard >= self.shard_rows:
            self._close_shard()
        if not self._is_open():
            self._open_shard()
        self._in_shard += 1
        self.rows += 1
        if self.file_type == "jsonl":
            self._jsonl.write(orjson.dumps(row) + b"\n")
            return
        self._buffer.append(row)
        if len(self._buffer) >= self.row_group_rows:
            self._flush()

    def _is_open(self) -> bool:
        return self._parquet is not None or self._jsonl is not None

    def _open_shard(self) -> None:
        tmp = self.data_dir / f"{TEMP_PREFIX}{len(self._temps):05d}.{self.ext}"
        self._temps.append(tmp)
        self._in_shard = 0
        if self.file_type == "jsonl":
            self._jsonl = open(tmp, "wb")
        else:
            self._parquet = pq.ParquetWriter(tmp, self.schema, compression="zstd")

    def _flush(self) -> None:
        if self._buffer and self._parquet is not None:
            self._parquet.write_batch(pa.RecordBatch.from_pylist(self._buffer, schema=self.schema))
        self._buffer.clear()

    def _close_shard(self) -> None:
        if self._parquet is not None:
            self._flush()
            self._parquet.close()
            self._parquet = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None

    def close(self) -> list[Path]:
        """Finish the last shard and give every shard its final name; returns the final paths."""
        if not self._temps:
            self._open_shard()  # an empty export is still a loadable dataset
        self._close_shard()
        n = len(self._temps)
        final = []
        for k, tmp in enumerate(self._temps):
            path = self.data_dir / shard_name(k, n, self.ext)
            os.replace(tmp, path)
            final.append(path)
        return final

    def abort(self) -> None:
        self._buffer.clear()
        try:
            self._close_shard()
        finally:
            for tmp in self._temps:
                tmp.unlink(missing_ok=True)
