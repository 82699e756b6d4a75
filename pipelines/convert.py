"""The convert stage as a Beam pipeline: input chunks -> converter -> one store unit per chunk.

Pipeline shape (see `pipelines.convert_work` for why there are two steps):

    Create(todo chunks) | Reshuffle | ParDo(ConvertChunk)     -> chunk results (ids, counts)
    results -> (id partition, the chunk's ids in it)          ┐
    Create(finished units) | ReadIds (only when resuming)     │ Flatten | GroupByKey(partition)
            -> (id partition, the unit's ids in it)           ┘ | pick losers -> (unit, seq)
    results | ParDo(WriteUnit, losers as a multimap side input) -> one committed unit per chunk

The driver (`run_convert`) plans the chunks, skips those whose unit is already finished
(resume, idempotent re-run), runs the pipeline, and sums the manifest's unit counts for the
summary: in = out + quarantined + duplicates, checked per unit and in total. Chunks a killed
run converted but did not commit are staged durably in `.tmp-convert-staged/` and taken over,
not converted again (`pipelines.convert_work.load_result`).

Any Beam runner works (`runner=` plus `beam_args`, e.g. DataflowRunner, FlinkRunner,
SparkRunner): the output directory (which also holds the staged shards) must then be a
shared filesystem that every worker sees at the same path, as the store uses plain files.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import apache_beam as beam

from converters.registry import get_converter
from pipelines.beam_runner import DEFAULT_RUNNER, check_portable, run_beam
from pipelines.convert_work import (
    ChunkResult,
    convert_chunk,
    load_result,
    losers_of_partition,
    partitioned_committed_ids,
    partitioned_ids,
    prune_staged,
    staged_units,
    write_unit,
)
from pipelines.convert_render import with_renderer
from pipelines.convert_worker import driver_identity
from pipelines.inputs import DEFAULT_CHUNK_SIZE, DEFAULT_MAX_RECORD_BYTES, Chunk, InputError, plan_chunks
from schemas.models import SCHEMA_VERSION
from schemas.store import DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS, TEMP_PREFIX, Dataset

STAGING_PREFIX = f"{TEMP_PREFIX}convert-"
# Converted, uncommitted chunks; kept across runs so a re-run after a kill takes them over.
STAGED_DIR = f"{STAGING_PREFIX}staged"
# Progress callback: (chunks converted, chunks written, chunks to do).
Progress = Callable[[int, int, int], None]
# Below this many records to convert, worker processes cost more than they save (each starts
# Beam and the converters, ~1.5 s of CPU; measured break-even ~20,000 ADP records on 2 cores).
AUTO_WORKERS_MIN_RECORDS = 40_000
_LOCAL_RUNNERS = frozenset({DEFAULT_RUNNER, "FnApiRunner"})
# Partitions of the id space for the duplicate decision: its parallelism, and 1/N of the ids in
# memory per partition.
ID_PARTITIONS = 64


class _DropRunningModeWarning(logging.Filter):
    # FnApiRunner warns when several workers run without its own multi-process mode; ours
    # (`_local_runner`) is that mode with a worker that exits with the driver.
    def filter(self, record: logging.LogRecord) -> bool:
        return "direct_running_mode" not in record.getMessage()


_RUNNING_MODE_FILTER = _DropRunningModeWarning()


class ConvertError(Exception):
    """A fatal problem with a convert run (unknown source, counts that do not add up)."""


@dataclass
class ConvertSummary:
    """What a run did; `counts` are summed from the manifest's units of this run's inputs."""

    output: str
    inputs: list[str]
    chunks: int
    chunks_done: int
    chunks_skipped: int
    counts: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    workers: int = 1
    # Chunks of chunks_done that a killed run had converted: committed now, not converted again.
    chunks_reused: int = 0

    @property
    def quarantine_reasons(self) -> dict[str, int]:
        return {k.split(":", 1)[1]: v for k, v in sorted(self.counts.items()) if k.startswith("quarantined:")}

    @property
    def balanced(self) -> bool:
        c = self.counts
        return c["in"] == c["out"] + c["quarantined"] + c["duplicate"]


def trajforge_version() -> str:
    try:
        return importlib.metadata.version("trajforge")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def config_hash(source: str, converter: str, chunk_size: int, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> str:
    # Not the inputs: a unit name already encodes its input, and adding inputs to an output is fine.
    # The record size limit is: a re-run with a larger one must not keep the quarantine of the smaller.
    key = f"convert\0{source}\0{converter}\0{chunk_size}\0{trajforge_version()}\0{SCHEMA_VERSION}"
    if max_record_bytes != DEFAULT_MAX_RECORD_BYTES:
        key += f"\0{max_record_bytes}"
    return hashlib.sha256(key.encode()).hexdigest()


class ConvertChunk(beam.DoFn):
    """Step 1 on a worker: convert one chunk and stage its shards (or take over what a killed run staged)."""

    def __init__(self, source: str, output: str, spill_dir: str, max_rows: int, max_bytes: int) -> None:
        self.source = source
        # Resolved on the driver and pickled along: a converter registered by the user's own code
        # is unknown to a worker's registry.
        self.converter = get_converter(source)
        self.output = output
        self.spill_dir = spill_dir
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.records_in = beam.metrics.Metrics.counter("convert", "records_in")

    def setup(self) -> None:
        # The browser starts on the worker, for converters that render pages.
        self.info, self.renderer = with_renderer(self.converter)
        self.dataset = Dataset(Path(self.output))

    def teardown(self) -> None:
        if self.renderer is not None:
            self.renderer.close()

    def process(self, chunk: Chunk) -> Any:
        result = load_result(Path(self.spill_dir), chunk.unit)
        if result is None:
            result = convert_chunk(chunk, self.info, self.dataset, Path(self.spill_dir),
                                   max_rows=self.max_rows, max_bytes=self.max_bytes)
        self.records_in.inc(result.counts.get("in", 0))
        yield result


class WriteUnit(beam.DoFn):
    """Step 2 on a worker: commit one chunk's unit, minus the duplicates picked globally."""

    def __init__(self, output: str, max_rows: int, max_bytes: int) -> None:
        self.output = output
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.duplicates = beam.metrics.Metrics.counter("convert", "duplicates")

    def setup(self) -> None:
        self.dataset = Dataset(Path(self.output))

    def process(self, result: ChunkResult, losers: Any) -> Any:  # a multimap: unit -> seqs
        counts = write_unit(
            result, self.dataset, list(losers[result.unit]), max_rows=self.max_rows, max_bytes=self.max_bytes,
        )
        self.duplicates.inc(counts.get("duplicate", 0))
        yield counts


def build_pipeline(
    p: beam.Pipeline,
    todo: list[Chunk],
    finished: list[str],
    *,
    source: str,
    output: str,
    spill_dir: str,
    max_rows: int,
    max_bytes: int,
) -> None:
    results = (
        p
        | "Chunks" >> beam.Create(todo)
        | "Spread" >> beam.Reshuffle()
        | "Convert" >> beam.ParDo(ConvertChunk(source, output, spill_dir, max_rows, max_bytes))
    )
    ids = results | "NewIds" >> beam.FlatMap(partitioned_ids, ID_PARTITIONS)
    if finished:  # units an earlier run committed: their copies win over new ones
        old_ids = (
            p
            | "FinishedUnits" >> beam.Create(finished)
            | "SpreadFinished" >> beam.Reshuffle()
            | "CommittedIds" >> beam.FlatMap(lambda unit: partitioned_committed_ids(output, unit, ID_PARTITIONS))
        )
        ids = (ids, old_ids) | "AllIds" >> beam.Flatten()
    # Duplicates are rare: the losers ((unit, seq) to drop) are a small side input, looked up by unit.
    losers = ids | "ByPartition" >> beam.GroupByKey() | "Losers" >> beam.FlatMap(losers_of_partition)
    _ = results | "Write" >> beam.ParDo(
        WriteUnit(output, max_rows, max_bytes), losers=beam.pvalue.AsMultiMap(losers)
    )


def _poll_progress(
    ds: Dataset, spill_dir: Path, todo: list[Chunk], on_progress: Progress, stop: threading.Event
) -> None:
    units = {c.unit for c in todo}
    while True:
        try:
            written = len(units & set(ds.finished_units()))
            converted = max(written, written + len(staged_units(spill_dir) - set(ds.finished_units())))
            on_progress(min(converted, len(units)), written, len(units))
        except Exception:  # a manifest mid-replace or a spill dir just removed; try again
            pass
        if stop.wait(0.25):
            return


def summarize(ds: Dataset, chunks: list[Chunk]) -> Counter[str]:
    """Sum of the finished units' counts for these chunks (the manifest is the source of truth)."""
    finished = ds.finished_units()
    total: Counter[str] = Counter()
    for chunk in chunks:
        if chunk.unit in finished:
            total.update(finished[chunk.unit].get("counts", {}))
    for key in ("in", "out", "quarantined", "duplicate"):
        total[key] += 0
    return total


def local_workers(
    requested: int, runner: str, beam_args: Sequence[str], todo_records: int, cpus: int | None = None
) -> int:
    """Worker processes for the local runner: `requested` if > 0; 0 means one per CPU core when
    there are enough records to pay for starting them, else 1 (in-process).

    Other runners, and Beam options that already say how to run locally, are left alone (1);
    asking for workers there as well is a ConvertError.
    """
    beam_chooses = any(a.startswith(("--direct_num_workers", "--direct_running_mode")) for a in beam_args)
    if runner not in _LOCAL_RUNNERS or beam_chooses:
        if requested > 0:
            where = "Beam's --direct_num_workers is also given" if beam_chooses else f"the runner is {runner}"
            raise ConvertError(f"--workers is for the local FnApiRunner, but {where}; use one or the other")
        return 1
    if requested > 0:
        return requested
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
    return cpus if cpus > 1 and todo_records >= AUTO_WORKERS_MIN_RECORDS else 1


def _local_runner(runner: str, workers: int) -> tuple[Any, list[str]]:
    """The runner and Beam options for `workers` local worker processes: FnApiRunner's own
    multi-process mode, but each worker is `pipelines.convert_worker`, which exits as soon as
    this driver is gone (Beam's worker lingers for seconds after a kill)."""
    if workers <= 1:
        return runner, []
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.transforms.environments import SubprocessSDKEnvironment

    driver = driver_identity()
    if driver is None:  # no /proc: Beam's own worker
        return runner, [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    command = f"{shlex.quote(sys.executable)} -m pipelines.convert_worker {driver[0]} {driver[1]}"
    logging.getLogger("apache_beam.runners.portability.fn_api_runner.fn_runner").addFilter(_RUNNING_MODE_FILTER)
    environment = SubprocessSDKEnvironment.from_command_string(command_string=command)
    return FnApiRunner(default_environment=environment), [f"--direct_num_workers={workers}"]


def run_convert(
    source: str,
    inputs: Sequence[str],
    output: str,
    *,
    runner: str = DEFAULT_RUNNER,
    beam_args: Sequence[str] = (),
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    max_rows: int = DEFAULT_MAX_ROWS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    overwrite: bool = False,
    on_progress: Progress | None = None,
    workers: int = 0,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> ConvertSummary:
    """Convert `inputs` with the converter registered as `source` into the dataset at `output`.

    `workers`: processes of the local runner (0: one per core for large inputs, see `local_workers`).
    `max_record_bytes`: a JSONL line longer than this is quarantined with its size, never parsed.

    Raises ConvertError (unknown source), pipelines.inputs.InputError (bad input) or
    schemas.store.StoreError (bad output); bad records never raise, they are quarantined.
    """
    started = time.perf_counter()
    try:
        info = get_converter(source)
    except KeyError as exc:
        raise ConvertError(str(exc.args[0])) from None
    if not inputs:
        raise ConvertError("no inputs given")
    local_workers(workers, runner, beam_args, 0)  # a conflicting request fails before the output is touched
    check_portable(runner, beam_args, ConvertError)
    chunks = plan_chunks(list(inputs), chunk_size, info.episode_key, max_record_bytes)
    converter = f"{info.fn.__module__}.{info.fn.__qualname__}"
    ds = Dataset.create(output, stage="convert", overwrite=overwrite,
                        config_hash=config_hash(source, converter, chunk_size, max_record_bytes))
    out_path = str(ds.path.resolve())
    # Leftovers of a killed run: temp shards of unfinished units, Beam's temp dirs, and staged
    # chunks that are committed already or were cut short (the others are taken over).
    ds.recover()
    staged_dir = ds.path / STAGED_DIR
    for stale in ds.path.glob(f"{STAGING_PREFIX}*"):
        if stale != staged_dir or overwrite:
            shutil.rmtree(stale, ignore_errors=True)
    staged_dir.mkdir(exist_ok=True)
    finished = ds.finished_units()
    todo = [c for c in chunks if c.unit not in finished]
    reused = len(prune_staged(staged_dir, finished).keys() & {c.unit for c in todo})
    n_workers = local_workers(workers, runner, beam_args, sum(c.rows for c in todo))
    if todo:
        ds.update_manifest(complete=False)
        beam_runner, worker_args = _local_runner(runner, n_workers)
        _run_pipeline(ds, out_path, todo, sorted(finished), source=source, runner=beam_runner,
                      beam_args=[*beam_args, *worker_args], max_rows=max_rows, max_bytes=max_bytes,
                      on_progress=on_progress)
    missing = [c.unit for c in chunks if not ds.is_finished(c.unit)]
    if missing:
        raise ConvertError(f"{len(missing)} chunks were not written (first: {missing[0]}); re-run to resume")
    counts = summarize(ds, chunks)
    shutil.rmtree(staged_dir, ignore_errors=True)  # every unit is committed
    summary = ConvertSummary(out_path, list(inputs), len(chunks), len(todo), len(chunks) - len(todo), counts,
                             time.perf_counter() - started, n_workers if todo else 0, reused)
    if not summary.balanced:
        raise ConvertError(f"counts do not add up: in={counts['in']} out={counts['out']} "
                           f"quarantined={counts['quarantined']} duplicate={counts['duplicate']}")
    ds.mark_complete({k: counts[k] for k in ("in", "out", "quarantined", "duplicate")})
    return summary


def _run_pipeline(
    ds: Dataset,
    out_path: str,
    todo: list[Chunk],
    finished: list[str],
    *,
    source: str,
    runner: Any,
    beam_args: Sequence[str],
    max_rows: int,
    max_bytes: int,
    on_progress: Progress | None,
) -> None:
    # Beam's temp_location lives in a hidden dir of the output: removed at the end, and by the
    # next run if this one is killed (a /tmp dir would leak on SIGKILL).
    beam_tmp = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}beam-", dir=out_path))
    spill_dir = Path(out_path) / STAGED_DIR
    stop = threading.Event()
    poller = None
    if on_progress is not None:
        poller = threading.Thread(target=_poll_progress, args=(ds, spill_dir, todo, on_progress, stop), daemon=True)
        poller.start()
    try:
        run_beam(lambda p: build_pipeline(p, todo, finished, source=source, output=out_path,
                                          spill_dir=str(spill_dir), max_rows=max_rows, max_bytes=max_bytes),
                 runner=runner, beam_args=beam_args, temp_location=beam_tmp, error=ConvertError,
                 passthrough=(InputError,))
    finally:
        stop.set()
        if poller is not None:
            poller.join()
            with_units = {c.unit for c in todo}
            done = len(with_units & set(ds.finished_units()))
            on_progress(done, done, len(todo))  # type: ignore[misc]
        shutil.rmtree(beam_tmp, ignore_errors=True)
