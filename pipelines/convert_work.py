"""The per-chunk work of the convert stage, independent of Beam: convert, spill, dedup, write.

A chunk is processed in two steps with a global decision between them:
1. `convert_chunk`: read the chunk, convert each record with the registered converter,
   build the chunk's Arrow batch column by column (`pipelines.columns`), and write the
   unit's Parquet shards into a staging dir next to the output, uncommitted; return the
   chunk's ids, counts and staged shards.
2. `write_unit`: once every chunk's ids are known and the duplicates are picked
   (`pick_losers`), commit the staged shards as the unit (a rename); a chunk with
   duplicates to drop (rare) has its rows rewritten without them.

Why stage instead of committing at once: a unit becomes visible atomically and is never
rewritten, so a duplicate found later (in another chunk) could no longer be removed.
Staging costs nothing in the common case and buys a simple rule that holds on any runner
and across resumes: per id, the copy already committed wins, otherwise the first in input
order (input, chunk, position).

Staged chunks are durable: step 1 ends by writing the chunk's result (`<unit>.result.json`,
after its shards are synced), and a re-run after a kill takes a staged result instead of
converting the chunk again (`load_result`), so only chunks that had not finished step 1 are
converted again. The duplicate decision is the same either way: it sees the same ids at the
same positions.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import threading
import zlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa

from converters.registry import KEYLESS, ConverterInfo, group_consecutive
from pipelines.columns import BatchBuilder
from pipelines.inputs import Chunk, ParseFailure, read_chunk
from schemas import jsonutil
from schemas.arrow import QUARANTINE_SCHEMA, TABLE_SCHEMAS, TRAJECTORY_SCHEMA, trajectory_to_row
from schemas.models import Trajectory
from schemas.store import Dataset

STAGE = "convert"
# Position of an id already committed by an earlier run: sorts before every new one.
COMMITTED: tuple[int, int, int, str] = (-1, -1, -1, "")
Position = tuple[int, int, int, str]  # (input index, chunk index, seq within chunk, unit)


@dataclass
class ChunkResult:
    """What step 1 hands to step 2: the unit, its order, its trajectory ids and counts."""

    unit: str
    order: tuple[int, int]
    ids: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    # The unit's shards, written but not committed (`UnitWriter.stage`).
    staged: dict[str, Any] = field(default_factory=dict)
    # Where this result is saved until the unit is committed ("" when not saved).
    result_file: str = ""


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


def _convert(
    records: Iterable[tuple[str, Any]],
    info: ConverterInfo,
    add: Callable[[Trajectory], None],
    add_row: Callable[[tuple[Any, ...]], None] | None = None,
) -> tuple[list[str], list[dict[str, Any]], Counter[str]]:
    """Convert records and hand each trajectory to `add`; anything that fails goes to quarantine rows.

    With `add_row` and a converter that builds rows without models (`ConverterInfo.to_row`), a
    record it vouches for goes to `add_row` as a ready row; any other record takes the
    converter's own path (the models validate it, or reject it naming the problem).
    Returns (ids of the added trajectories, quarantine rows, counts).
    """
    ids: list[str] = []
    bad: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    fn = info.fn
    to_row = info.to_row if add_row is not None else None
    for location, raw in records:
        counts["in"] += 1
        if isinstance(raw, ParseFailure):
            bad.append(_quarantine_row("parse", location, f"{location}: {raw.error}", raw.text))
            counts[quarantine_key("parse", raw.error_class)] += 1
            continue
        try:
            row = to_row(raw) if to_row is not None else None
            if row is not None:
                add_row(row)  # type: ignore[misc]
                ids.append(row[0])
                continue
            traj = fn(raw)
            if not isinstance(traj, Trajectory):
                raise TypeError(f"converter returned {type(traj).__name__}, expected Trajectory")
            add(traj)
        except Exception as exc:  # a converter bug must not lose the other records of the chunk
            bad.append(_quarantine_row(STAGE, location, f"{location}: {type(exc).__name__}: {exc}", _raw_json(raw)))
            counts[quarantine_key(STAGE, type(exc).__name__)] += 1
            continue
        ids.append(traj.id)
    return ids, bad, counts


def convert_records(
    records: Iterable[tuple[str, Any]], fn: Callable[[Any], Trajectory]
) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]], Counter[str]]:
    """Convert records to trajectory rows (dicts); returns (rows, their ids, quarantine rows, counts)."""
    rows: list[dict[str, Any]] = []
    ids, bad, counts = _convert(records, ConverterInfo("", fn), lambda t: rows.append(trajectory_to_row(t)))
    return rows, ids, bad, counts


_ARROW_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)


def _to_batch(
    rows: list[dict[str, Any]], ids: list[str], bad: list[dict[str, Any]], counts: Counter[str]
) -> tuple[pa.RecordBatch, list[str]]:
    """Rows -> one Arrow batch; a row Arrow rejects (e.g. an int beyond 64 bits) is quarantined."""
    try:
        return pa.RecordBatch.from_pylist(rows, schema=TRAJECTORY_SCHEMA), ids
    except _ARROW_ERRORS:
        pass
    keep_rows, keep_ids = [], []
    for row, id_ in zip(rows, ids):
        try:
            pa.RecordBatch.from_pylist([row], schema=TRAJECTORY_SCHEMA)
        except _ARROW_ERRORS as exc:
            bad.append(_quarantine_row(STAGE, id_, f"{id_}: not storable in Arrow: {type(exc).__name__}: {exc}",
                                       _raw_json(row)))
            counts[quarantine_key(STAGE, type(exc).__name__)] += 1
            continue
        keep_rows.append(row)
        keep_ids.append(id_)
    return pa.RecordBatch.from_pylist(keep_rows, schema=TRAJECTORY_SCHEMA), keep_ids


def chunk_records(chunk: Chunk, info: ConverterInfo, read: Counter[str] | None = None) -> Iterator[tuple[str, Any]]:
    """(location, record) for each record the chunk's rows make, as `ConverterInfo.records` makes
    them: a row split into its records (`file#3[1]`), or consecutive step rows grouped into one
    episode (`file:10..file:18`). An episode holding an unreadable row cannot be completed: it
    comes out as one ParseFailure naming the episode and the row, with all its rows' text.
    `read["rows"]` counts the rows read."""
    pairs: Iterator[tuple[str, Any]] = read_chunk(chunk) if read is None else _counted(read_chunk(chunk), read)
    if info.split_row is not None:
        pairs = _split(pairs, info.split_row)
    if info.episode_key is not None:
        pairs = _episodes(pairs, info.episode_key)
    return pairs


def _counted(pairs: Iterator[tuple[str, Any]], read: Counter[str]) -> Iterator[tuple[str, Any]]:
    for pair in pairs:
        read["rows"] += 1
        yield pair


def _split(pairs: Iterable[tuple[str, Any]], split: Callable[[Any], list[Any]]) -> Iterator[tuple[str, Any]]:
    for location, raw in pairs:
        if isinstance(raw, ParseFailure) or not isinstance(raw, list):
            yield location, raw
            continue
        for i, record in enumerate(split(raw)):
            yield f"{location}[{i}]", record


def _episodes(pairs: Iterable[tuple[str, Any]], key_of: Callable[[Any], Any]) -> Iterator[tuple[str, Any]]:
    def key(pair: tuple[str, Any]) -> Any:
        return KEYLESS if isinstance(pair[1], ParseFailure) else key_of(pair[1])

    for run in group_consecutive(pairs, key):
        location = run[0][0] if len(run) == 1 else f"{run[0][0]}..{run[-1][0]}"
        broken = [(loc, raw) for loc, raw in run if isinstance(raw, ParseFailure)]
        if not broken:
            yield location, [raw for _, raw in run]
            continue
        keys = [k for k in map(key, run) if k is not KEYLESS]
        name = f"episode {keys[0]!r}" if keys else "a run of rows without an episode key"
        where, failure = broken[0]
        text = "[" + ", ".join(raw.text if isinstance(raw, ParseFailure) else _raw_json(raw) for _, raw in run) + "]"
        yield location, ParseFailure(
            text=text, error=f"{name} cannot be completed: row {where} is unreadable ({failure.error})",
            error_class="IncompleteEpisode",
        )


_pause_lock = threading.Lock()
_pause_depth = 0
_resume_collector = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block (thread-safe, nestable).

    A run of records allocates hundreds of thousands of dicts and tuples that live until the
    run's batch is built; the collector would scan them again at every generation threshold
    (measured: 17% of the conversion path's time). Converted records hold no reference cycles,
    and anything cyclic made meanwhile is collected once the block ends.
    """
    global _pause_depth, _resume_collector
    with _pause_lock:
        if _pause_depth == 0:
            _resume_collector = gc.isenabled()
            gc.disable()
        _pause_depth += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pause_depth -= 1
            if _pause_depth == 0 and _resume_collector:
                gc.enable()


def convert_to_batches(
    chunk: Chunk, info: ConverterInfo, batch_rows: int, read: Counter[str] | None = None
) -> Iterator[tuple[pa.RecordBatch, list[str], list[dict[str, Any]], Counter[str]]]:
    """A chunk -> (trajectory batch, its ids, quarantine rows, counts) for each run of
    `batch_rows` records: the same result as `convert_records` + `_to_batch` over the run,
    built column by column.

    Records stream through: each trajectory becomes plain tuples at once (holding thousands of
    models would make the cyclic garbage collector rescan them over and over), and only one
    run's batch is in memory. A run with a value Arrow rejects (rare) is read and converted
    again by rows, which finds and quarantines the culprits one by one.
    """
    records = chunk_records(chunk, info, read)
    done = 0
    while True:
        builder = BatchBuilder()
        batch: pa.RecordBatch | None = None
        # The run's rows are built and released into Arrow with the collector paused, so it
        # never scans them (`finish` drops them before the collector is back).
        with collector_paused():
            ids, bad, counts = _convert(itertools.islice(records, batch_rows), info, builder.add, builder.add_row)
            with contextlib.suppress(*_ARROW_ERRORS):
                batch = builder.finish()
        if not counts["in"]:
            return
        if batch is None:
            again = itertools.islice(chunk_records(chunk, info), done, done + counts["in"])
            rows, ids, bad, counts = convert_records(again, info.fn)
            batch, ids = _to_batch(rows, ids, bad, counts)
        done += counts["in"]
        yield batch, ids, bad, counts


def convert_chunk(
    chunk: Chunk, info: ConverterInfo, dataset: Dataset, spill_dir: Path, *, max_rows: int, max_bytes: int
) -> ChunkResult:
    """Step 1: convert one chunk and write its shards into `spill_dir`, uncommitted; returns
    its ids, counts and staged shards."""
    ids: list[str] = []
    bad: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    read: Counter[str] = Counter()
    writer = dataset.unit(chunk.unit, max_rows=max_rows, max_bytes=max_bytes, staging=spill_dir)
    try:
        # One run per row group: the shards come out as if the chunk were written in one batch.
        for batch, run_ids, run_bad, run_counts in convert_to_batches(chunk, info, writer.row_group_rows, read):
            writer.write_batch("trajectories", batch)
            ids += run_ids
            bad += run_bad
            counts.update(run_counts)
        counts["converted"] = len(ids)
        counts["quarantined"] = len(bad)
        counts["rows"] = read["rows"]  # raw rows, when records are episodes of rows or split from them
        writer.write_batch("quarantine", pa.RecordBatch.from_pylist(bad, schema=QUARANTINE_SCHEMA))
        staged = writer.stage()
    except BaseException:
        writer.abort()
        raise
    return save_result(ChunkResult(chunk.unit, chunk.order, ids, dict(counts), staged), spill_dir)


RESULT_SUFFIX = ".result.json"


def save_result(result: ChunkResult, spill_dir: Path) -> ChunkResult:
    """Make a staged chunk durable: its result, written after its shards (synced by the writer)."""
    import orjson

    path = spill_dir / f"{result.unit}{RESULT_SUFFIX}"
    result.result_file = str(path)
    data = {"unit": result.unit, "order": list(result.order), "ids": result.ids, "counts": result.counts,
            "staged": result.staged}
    tmp = spill_dir / f".{result.unit}{RESULT_SUFFIX}.{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(orjson.dumps(data))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return result


def load_result(spill_dir: Path, unit: str) -> ChunkResult | None:
    """The staged result a killed run left for `unit`, or None (none, unreadable, or shards gone)."""
    import orjson

    path = spill_dir / f"{unit}{RESULT_SUFFIX}"
    try:
        data = orjson.loads(path.read_bytes())
        result = ChunkResult(data["unit"], tuple(data["order"]), data["ids"], data["counts"], data["staged"], str(path))
        files = [Path(e["tmp"]) for entries in result.staged["tables"].values() for e in entries]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if result.unit != unit or not all(f.is_file() for f in files):
        return None
    return result


def saved_results(spill_dir: Path) -> dict[str, ChunkResult]:
    """Every usable staged result in `spill_dir`, by unit."""
    found = {}
    for path in spill_dir.glob(f"*{RESULT_SUFFIX}"):
        unit = path.name.removesuffix(RESULT_SUFFIX)
        if (result := load_result(spill_dir, unit)) is not None:
            found[unit] = result
    return found


def prune_staged(spill_dir: Path, finished: Iterable[str]) -> dict[str, ChunkResult]:
    """Before a run: drop staged results of finished units and files no usable result lists
    (a conversion killed mid-chunk); returns the results a run can take over."""
    results = saved_results(spill_dir)
    for unit in set(finished) & set(results):
        _remove(*(Path(e["tmp"]) for es in results.pop(unit).staged["tables"].values() for e in es))
    keep = {Path(e["tmp"]).name for r in results.values() for es in r.staged["tables"].values() for e in es}
    keep |= {f"{unit}{RESULT_SUFFIX}" for unit in results}
    for path in spill_dir.iterdir():
        if path.name not in keep:
            _remove(path)
    return results


# What the duplicate decision moves: one element per chunk and id partition, the chunk's place
# once and its ids with their positions in it, instead of a position tuple per id (the shuffle
# encodes ~5x fewer objects). `seqs` is None for a unit an earlier run committed.
IdGroup = tuple[int, int, str, list[str], list[int] | None]  # (input index, chunk index, unit, ids, seqs)


def partitioned_ids(result: ChunkResult, partitions: int) -> Iterator[tuple[int, IdGroup]]:
    """(partition, the chunk's ids in it with their positions). The partition is a stable hash of the id."""
    parts: dict[int, tuple[list[str], list[int]]] = {}
    for seq, id_ in enumerate(result.ids):
        ids, seqs = parts.setdefault(_partition(id_, partitions), ([], []))
        ids.append(id_)
        seqs.append(seq)
    input_index, chunk_index = result.order
    for part, (ids, seqs) in parts.items():
        yield part, (input_index, chunk_index, result.unit, ids, seqs)


def partitioned_committed_ids(dataset_path: str, unit: str, partitions: int) -> Iterator[tuple[int, IdGroup]]:
    """(partition, the ids in it) of a unit finished by an earlier run."""
    import pyarrow.parquet as pq

    ds = Dataset(Path(dataset_path))
    entry = ds.finished_units().get(unit, {})
    parts: dict[int, list[str]] = {}
    for shard in entry.get("tables", {}).get("trajectories", []):
        for id_ in pq.read_table(ds.path / shard["file"], columns=["id"]).column(0).to_pylist():
            parts.setdefault(_partition(id_, partitions), []).append(id_)
    for part, ids in parts.items():
        yield part, (COMMITTED[0], COMMITTED[1], COMMITTED[3], ids, None)


def _partition(id_: str, partitions: int) -> int:
    return zlib.crc32(id_.encode("utf-8", "surrogatepass")) % partitions


def pick_losers(item: tuple[str, Iterable[Position]]) -> Iterator[tuple[str, int]]:
    """(unit, seq) of every copy of an id but the winner (committed, else first in input order)."""
    _, found = item
    ordered = sorted(found)
    for _input, _chunk, seq, unit in ordered[1:]:
        if unit:  # a committed copy cannot be removed (and never is: committed copies sort first)
            yield unit, seq


def losers_of_partition(item: tuple[int, Iterable[IdGroup]]) -> Iterator[tuple[str, int]]:
    """`pick_losers` for every id of one partition that occurs more than once."""
    groups = list(item[1])
    seen: set[str] = set()
    repeated: set[str] = set()
    for group in groups:
        for id_ in group[3]:
            if id_ in seen:
                repeated.add(id_)
            else:
                seen.add(id_)
    if not repeated:  # the common case: no position is built at all
        return
    found: dict[str, list[Position]] = {id_: [] for id_ in repeated}
    for input_index, chunk_index, unit, ids, seqs in groups:
        for i, id_ in enumerate(ids):
            if id_ in found:
                found[id_].append((input_index, chunk_index, seqs[i] if seqs is not None else COMMITTED[2], unit))
    for id_, where in found.items():
        yield from pick_losers((id_, where))


def write_unit(
    result: ChunkResult,
    dataset: Dataset,
    losers: Iterable[int] = (),
    *,
    max_rows: int,
    max_bytes: int,
) -> dict[str, int]:
    """Step 2: commit a chunk's staged shards as one store unit; with duplicates to drop
    (rare), its rows are rewritten without them."""
    staged_files = [Path(e["tmp"]) for entries in result.staged["tables"].values() for e in entries]
    saved = [Path(result.result_file)] if result.result_file else []
    if dataset.is_finished(result.unit):
        # A retried bundle: the unit was committed by the first attempt.
        _remove(*staged_files, *saved)
        return dataset.finished_units()[result.unit]["counts"]
    drop = set(losers)
    counts = Counter(result.counts)
    counts["duplicate"] = len(drop)
    counts["out"] = counts["converted"] - len(drop)
    if counts["in"] != counts["out"] + counts["quarantined"] + counts["duplicate"]:
        raise AssertionError(f"unit {result.unit}: counts do not add up: {dict(counts)}")
    if not drop:
        dataset.commit_staged(result.unit, {**result.staged, "counts": {**result.staged["counts"], **counts}})
        _remove(*saved)
        return dict(counts)
    tables = {table: _read_staged(entries, table) for table, entries in result.staged["tables"].items()}
    traj = tables.get("trajectories")
    if traj is not None:
        tables["trajectories"] = traj.filter(pa.array([seq not in drop for seq in range(traj.num_rows)]))
    with dataset.unit(result.unit, max_rows=max_rows, max_bytes=max_bytes) as unit:
        for table, data in tables.items():
            unit.write_batch(table, data)
        unit.counts.update(counts)
    _remove(*staged_files, *saved)
    return dict(counts)


def _read_staged(entries: list[dict[str, Any]], table: str) -> pa.Table:
    import pyarrow.parquet as pq

    return pa.concat_tables([pq.read_table(e["tmp"], schema=TABLE_SCHEMAS[table]) for e in entries])


def staged_units(spill_dir: Path) -> set[str]:
    """Units staged in `spill_dir` (converted, not yet committed)."""
    return {p.name.removesuffix(RESULT_SUFFIX) for p in spill_dir.glob(f"*{RESULT_SUFFIX}")}


def _remove(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
