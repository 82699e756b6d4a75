"""Test data helpers: direct conversion, uniform ADP derivations, writers for each input format."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from converters.registry import get_converter
from schemas.models import Trajectory


def direct(records: list[Any], source: str = "adp") -> dict[str, Trajectory]:
    """Each record converted in-process, first copy per id kept (what the pipeline must produce)."""
    fn = get_converter(source).fn
    out: dict[str, Trajectory] = {}
    for record in records:
        traj = fn(record)
        out.setdefault(traj.id, traj)
    return out


def uniform(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ADP records rewritten to one layout (text observations only), so Arrow round-trips them.

    Parquet and datasets store structs with one key set: heterogeneous ADP steps come back
    with extra null keys, which a lossless converter rightly keeps. Uniform records let the
    test compare all formats record for record.
    """
    out = []
    for i, record in enumerate(records):
        steps = [
            {"class_": "text_observation", "content": orjson.dumps(step).decode(),
             "source": "environment", "name": None}
            for step in record["content"][:3]
        ]
        out.append({"id": f"u{i}", "content": steps, "details": {"from": str(record["id"])}})
    return out


def write_jsonl(path: Path, records: list[Any]) -> Path:
    data = b"".join(orjson.dumps(r) + b"\n" for r in records)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(data))
    elif path.name.endswith(".zst"):
        path.write_bytes(zstandard.ZstdCompressor().compress(data))
    else:
        path.write_bytes(data)
    return path


def write_parquet(path: Path, records: list[dict[str, Any]], row_group_size: int = 7) -> Path:
    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=row_group_size)
    return path
