"""The per-chunk work of the convert stage, independent of Beam: convert, spill, dedup, write.

A chunk is processed in two steps with a global decision between them:
1. `convert_chunk`: read the chunk, convert each record with the registered converter,
   build its Arrow row, and *spill* the rows (Arrow IPC) next to the output; return the
   chunk's ids and counts.
2. `write_unit`: once every chunk's ids are known and the duplicates are picked
   (`pick_losers`), write the chunk's rows minus its duplicates into one store unit.

Why spill instead of writing the unit at once: a unit becomes visible atomically and is
never rewritten, so a duplicate found later (in another chunk) could no longer be
removed. Spilling costs one extra Arrow encode/decode per record (~10% of the path) and
buys a simple rule that holds on any runner and across resumes: per id, the copy already
committed wins, otherwise the first in input order (input, chunk, position).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.ipc as ipc

from pipelines.inputs import Chunk, ParseFailure, read_chunk
from schemas import jsonutil
from schemas.arrow import QUARANTINE_SCHEMA, TRAJECTORY_SCHEMA, trajectory_to_row
from schemas.models import Trajectory
from schemas.store import Dataset

STAGE = "convert"
# Position of an id already committed by an earlier run: sorts before every new one.
COMMITTED: tuple[int, int, int, str] = (-1, -1, -1, "")
Position = tuple[int, int, int, str]  # (input index, chunk index, seq within chunk, unit)
# Uncompressed: spill files live only until their unit is written, and lz4 cost ~40 us a record.
_IPC_OPTIONS = ipc.IpcWriteOptions(compression=None)


@dataclass
class ChunkResult:
    """What step 1 hands to step 2: the unit, its order, its trajectory ids and counts."""

    unit: str
    order: tuple[int, int]
    ids: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


def quarantine_key(stage: str, error_class: str) -> str:
    return f"quarantined:{stage}:{error_class}"


def _quarantine_row(stage: str, location: str, error: str, raw: str) -> dict[str, Any]:
    return {
        "id": f"{stage}:{location}",
        "stage": stage,
        "error": error,
        "raw": raw,
        "location": location,
        "created_at": datetime.now(timezone.utc),
    }


def _raw_json(value: Any) -> str:
    try:
        return jsonutil.dumps(value)
    except (TypeError, ValueError):
        return repr(value)  # e.g. bytes from a Parquet binary column


def convert_records(
    records: Iterable[tuple[str, Any]], fn: Callable[[Any], Trajectory]
) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]], Counter[str]]:
    """Convert records to trajectory rows; anything that fails goes to quarantine rows.

    Returns (trajectory rows, their ids, quarantine rows, counts). The converter validates
    (it returns a pydantic Trajectory), so rows are built straight from the model.
    """
    rows: list[dict[str, Any]] = []
    ids: list[str] = []
    bad: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    for location, raw in records:
        counts["in"] += 1
        if isinstance(raw, ParseFailure):
            bad.append(_quarantine_row("parse", location, f"{location}: invalid JSON: {raw.error}", raw.text))
            counts[quarantine_key("parse", raw.error_class)] += 1
            continue
        try:
            traj = fn(raw)
            if not isinstance(traj, Trajectory):
                raise TypeError(f"converter returned {type(traj).__name__}, expected Trajectory")
            row = trajectory_to_row(traj)
        except Exception as exc:  # a converter bug must not lose the other records of the chunk
            bad.append(_quarantine_row(STAGE, location, f"{location}: {type(exc).__name__}: {exc}", _raw_json(raw)))
            counts[quarantine_key(STAGE, type(exc).__name__)] += 1
            continue
        rows.append(row)
        ids.append(traj.id)
    return rows, ids, bad, counts


def _to_batch(
    rows: list[dict[str, Any]], ids: list[str], bad: list[dict[str, Any]], counts: Counter[str]
) -> tuple[pa.RecordBatch, list[str]]:
    """Rows -> one Arrow batch; a row Arrow rejects (e.g. an int beyond 64 bits) is quarantined."""
    try:
        return pa.RecordBatch.from_pylist(rows, schema=TRAJECTORY_SCHEMA), ids
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    keep_rows, keep_ids = [], []
    for row, id_ in zip(rows, ids):
        try:
            pa.RecordBatch.from_pylist([row], schema=TRAJECTORY_SCHEMA)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            bad.append(_quarantine_row(STAGE, id_, f"{id_}: not storable in Arrow: {type(exc).__name__}: {exc}",
                                       _raw_json(row)))
            counts[quarantine_key(STAGE, type(exc).__name__)] += 1
            continue
        keep_rows.append(row)
        keep_ids.append(id_)
    return pa.RecordBatch.from_pylist(keep_rows, schema=TRAJECTORY_SCHEMA), keep_ids


def spill_paths(spill_dir: Path, unit: str) -> tuple[Path, Path]:
    return spill_dir / f"{unit}.traj.arrow", spill_dir / f"{unit}.quar.arrow"


def _write_ipc(path: Path, batch: pa.RecordBatch) -> None:
    # Temp name + rename: a retried bundle replaces a spill file whole, never half.
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    with ipc.new_file(tmp, batch.schema, options=_IPC_OPTIONS) as writer:
        writer.write_batch(batch)
    os.replace(tmp, path)


def convert_chunk(chunk: Chunk, fn: Callable[[Any], Trajectory], spill_dir: Path) -> ChunkResult:
    """Step 1: convert one chunk and spill its rows; returns its ids and counts."""
    rows, ids, bad, counts = convert_records(read_chunk(chunk), fn)
    batch, ids = _to_batch(rows, ids, bad, counts)
    counts["converted"] = len(ids)
    counts["quarantined"] = len(bad)
    traj_path, quar_path = spill_paths(spill_dir, chunk.unit)
    _write_ipc(quar_path, pa.RecordBatch.from_pylist(bad, schema=QUARANTINE_SCHEMA))
    _write_ipc(traj_path, batch)
    return ChunkResult(chunk.unit, chunk.order, ids, dict(counts))


def positions(result: ChunkResult) -> Iterator[tuple[str, Position]]:
    """(id, position) for every trajectory of a chunk: the input of the duplicate decision."""
    input_index, chunk_index = result.order
    for seq, id_ in enumerate(result.ids):
        yield id_, (input_index, chunk_index, seq, result.unit)


def committed_ids(dataset_path: str, unit: str) -> Iterator[tuple[str, Position]]:
    """(id, COMMITTED) for every trajectory of a unit finished by an earlier run."""
    import pyarrow.parquet as pq

    ds = Dataset(Path(dataset_path))
    entry = ds.finished_units().get(unit, {})
    for shard in entry.get("tables", {}).get("trajectories", []):
        for id_ in pq.read_table(ds.path / shard["file"], columns=["id"]).column(0).to_pylist():
            yield id_, COMMITTED


def pick_losers(item: tuple[str, Iterable[Position]]) -> Iterator[tuple[str, int]]:
    """(unit, seq) of every copy of an id but the winner (committed, else first in input order)."""
    _, found = item
    ordered = sorted(found)
    for _input, _chunk, seq, unit in ordered[1:]:
        if unit:  # a committed copy cannot be removed (and never is: committed copies sort first)
            yield unit, seq


def write_unit(
    result: ChunkResult,
    dataset: Dataset,
    spill_dir: Path,
    losers: Iterable[int] = (),
    *,
    max_rows: int,
    max_bytes: int,
) -> dict[str, int]:
    """Step 2: write a chunk's spilled rows, minus its duplicates, as one store unit."""
    traj_path, quar_path = spill_paths(spill_dir, result.unit)
    if dataset.is_finished(result.unit):
        # A retried bundle: the unit was committed by the first attempt.
        _remove(traj_path, quar_path)
        return dataset.finished_units()[result.unit]["counts"]
    drop = set(losers)
    traj = ipc.open_file(traj_path).read_all()
    quar = ipc.open_file(quar_path).read_all()
    counts = Counter(result.counts)
    with dataset.unit(result.unit, max_rows=max_rows, max_bytes=max_bytes) as unit:
        write = unit.write_row
        for seq, row in enumerate(traj.to_pylist()):
            if seq in drop:
                continue
            write("trajectories", row)
        for row in quar.to_pylist():
            write("quarantine", row)
        counts["duplicate"] = len(drop)
        counts["out"] = counts["converted"] - len(drop)
        if counts["in"] != counts["out"] + counts["quarantined"] + counts["duplicate"]:
            raise AssertionError(f"unit {result.unit}: counts do not add up: {dict(counts)}")
        unit.counts.update(counts)
    _remove(traj_path, quar_path)
    return dict(counts)


def _remove(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
