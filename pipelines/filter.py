"""The filter stage as a Beam pipeline: one unit per input shard, each record through the chain.

    Create(todo shard files) | Reshuffle | ParDo(FilterShard) -> per-unit counts

A unit is one input shard file, named after it, so a re-run skips finished shards. Each
record goes through the chain in order: kept records go to `trajectories/`, dropped ones
to `filtered/` (filter, reason, score), records that cannot be read or whose filter raised
to `quarantine/` (stage "filter", or "judge" for a judge without a valid answer). For every
unit and in total: in = kept + filtered + quarantined (checked, the run fails otherwise).

Async judges run inside the DoFn: one event loop per bundle, records in batches of
`batch_size` gathered with at most `concurrency` in flight.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import apache_beam as beam
import orjson
import pyarrow.parquet as pq

from filters.base import FilterFactory, factories_for
from filters.chain import DEFAULT_CONCURRENCY, Chain, Outcome, config_digest, load_config
from pipelines.beam_runner import DEFAULT_RUNNER, PipelineError, check_portable, run_beam, staging_dir
from schemas.arrow import trajectory_from_row
from schemas.models import FilterDecision, Filtered, Quarantined
from schemas.store import DEFAULT_MAX_ROWS, Dataset, check_apart

DEFAULT_BATCH = 256
BALANCE_KEYS = ("in", "kept", "filtered", "quarantined")


def trajforge_version() -> str:
    try:
        return importlib.metadata.version("trajforge")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def unit_for_shard(shard: Path) -> str:
    """Unit name of an input shard: its file stem (unique within a dataset, stable across runs)."""
    return shard.stem


def _quarantine(record_id: str, stage: str, error: str, raw: Any, location: str) -> Quarantined:
    return Quarantined(id=record_id or "?", stage=stage, error=error[:2000],
                       raw=orjson.dumps(raw, default=str).decode(), location=location)


class FilterShard(beam.DoFn):
    """Filter one input shard into one output unit.

    It carries the filters' factories as the driver found them: a filter registered by the
    user's own code is then known to workers that never ran that code.
    """

    def __init__(self, specs: list[dict[str, Any]], factories: dict[str, FilterFactory], output: str, *,
                 batch_size: int, concurrency: int, max_rows: int) -> None:
        self.specs = specs
        self.factories = factories
        self.output = output
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.max_rows = max_rows
        self.records_in = beam.metrics.Metrics.counter("filter", "records_in")

    def setup(self) -> None:
        self.chain = Chain(self.specs, self.concurrency, self.factories)
        self.dataset = Dataset(Path(self.output))

    def start_bundle(self) -> None:
        self.loop = asyncio.new_event_loop() if self.chain.has_async else None

    def finish_bundle(self) -> None:
        if self.loop is not None:
            # Judges' clients belong to this loop; close them with it (rebuilt next bundle).
            self.loop.run_until_complete(self.chain.aclose())
            self.loop.close()
            self.loop = None

    def _outcomes(self, batch: list[Any]) -> list[Outcome]:
        if self.loop is None:
            return [self.chain.run_sync(r) for r in batch]
        return self.loop.run_until_complete(self.chain.run_batch(batch))

    def process(self, shard: str) -> Iterator[dict[str, int]]:
        path = Path(shard)
        unit = unit_for_shard(path)
        if self.dataset.is_finished(unit):  # a retried bundle after the unit committed
            return
        with self.dataset.unit(unit, max_rows=self.max_rows) as u:
            for rows in _row_batches(path, self.batch_size):
                records, where = [], []
                for index, row in rows:
                    location = f"{path.name}@{index}"
                    u.counts["in"] += 1
                    try:
                        records.append(trajectory_from_row(row))
                        where.append(location)
                    except Exception as exc:  # an unreadable row is quarantined, not fatal
                        u.write("quarantine", _quarantine(row.get("id") or "?", "filter",
                                                          f"unreadable record: {exc}", row, location))
                        _count(u.counts, "quarantined", "filter")
                for outcome, location in zip(self._outcomes(records), where):
                    _write(u, outcome, location)
            c = u.counts
            if c["in"] != c["kept"] + c["filtered"] + c["quarantined"]:
                raise PipelineError(f"unit {unit}: counts do not add up ({dict(c)})")
            self.records_in.inc(c["in"])
            counts = dict(c)
        yield counts


# Filter options that name files: relative ones are resolved on the driver, whose working
# directory workers do not share. A tokenizer may also be a hub name, so only an existing path is.
_PATH_OPTIONS = ("cache_path", "ledger_path", "model_path")


def absolute_paths(value: Any) -> Any:
    """`value` (filter specs) with every path option made absolute."""
    if isinstance(value, list):
        return [absolute_paths(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, v in value.items():
        if isinstance(v, str) and (key in _PATH_OPTIONS or (key == "tokenizer" and Path(v).exists())):
            v = str(Path(v).expanduser().resolve())
        out[key] = absolute_paths(v)
    return out


def _row_batches(path: Path, batch_size: int) -> Iterator[list[tuple[int, dict[str, Any]]]]:
    index = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
        rows = batch.to_pylist()
        yield list(enumerate(rows, start=index))
        index += len(rows)


def _count(counts: Counter[str], status: str, detail: str) -> None:
    # The unit writer already counts rows per table ("filtered" is one), so only the other
    # statuses are counted here, plus the per-filter / per-stage detail.
    if status != "filtered":
        counts[status] += 1
    counts[f"{status}:{detail}"] += 1


def _write(u: Any, outcome: Outcome, location: str) -> None:
    if outcome.status == "kept":
        u.write("trajectories", outcome.record)
        u.counts["kept"] += 1
    elif outcome.status == "filtered":
        decision = FilterDecision(filter=outcome.filter or "?", reason=outcome.reason or "dropped", score=outcome.score)
        u.write("filtered", Filtered(record=outcome.record, decision=decision))
        _count(u.counts, "filtered", outcome.filter or "?")
        u.counts[f"reason:{outcome.filter}:{outcome.reason}"] += 1
    else:
        stage = outcome.stage or "filter"
        u.write("quarantine", _quarantine(outcome.record.id, stage, outcome.reason or "error",
                                          outcome.record.model_dump(mode="json"), location))
        _count(u.counts, "quarantined", stage)
        u.counts[f"reason:{outcome.filter}:{outcome.reason}"] += 1


@dataclass
class FilterSummary:
    output: str
    shards: int
    shards_done: int
    counts: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def balanced(self) -> bool:
        c = self.counts
        return c["in"] == c["kept"] + c["filtered"] + c["quarantined"]

    def by_prefix(self, prefix: str) -> dict[str, int]:
        return {k[len(prefix):]: v for k, v in sorted(self.counts.items()) if k.startswith(prefix)}


def summarize_units(ds: Dataset, units: list[str], keys: Sequence[str] = BALANCE_KEYS) -> Counter[str]:
    """Sum of the manifest's counts for these units (the manifest is the source of truth)."""
    finished = ds.finished_units()
    total: Counter[str] = Counter()
    for unit in units:
        total.update(finished.get(unit, {}).get("counts", {}))
    for key in keys:
        total[key] += 0
    return total


def run_filter(
    input_dir: str,
    config: Any,
    output: str,
    *,
    runner: str = DEFAULT_RUNNER,
    beam_args: Sequence[str] = (),
    batch_size: int = DEFAULT_BATCH,
    concurrency: int = DEFAULT_CONCURRENCY,
    max_rows: int = DEFAULT_MAX_ROWS,
    overwrite: bool = False,
) -> FilterSummary:
    """Filter the dataset at `input_dir` with the chain in `config` (file, YAML text or list) into `output`."""
    started = time.perf_counter()
    specs = load_config(config)
    Chain(specs)  # fail fast on a bad config, before any Beam work
    check_portable(runner, beam_args)
    factories = factories_for(specs)
    source = Dataset.open(input_dir)
    check_apart(output, [input_dir])
    shards = source.checked_shard_files("trajectories")
    key = f"filter\0{config_digest(specs)}\0{source.path.resolve()}\0{trajforge_version()}"
    ds = Dataset.create(output, stage="filter", config_hash=hashlib.sha256(key.encode()).hexdigest(),
                        overwrite=overwrite)
    ds.recover()
    units = [unit_for_shard(s) for s in shards]
    if len(set(units)) != len(units):
        raise PipelineError(f"{input_dir}: shard file names repeat; cannot name units after them")
    todo = [str(s.resolve()) for s, u in zip(shards, units) if not ds.is_finished(u)]
    if todo:
        ds.update_manifest(complete=False)
        staging = staging_dir(ds, "filter")
        out_path = str(ds.path.resolve())
        try:
            run_beam(lambda p: (
                p
                | "Shards" >> beam.Create(todo)
                | "Spread" >> beam.Reshuffle()
                | "Filter" >> beam.ParDo(FilterShard(absolute_paths(specs), factories, out_path,
                                                     batch_size=batch_size, concurrency=concurrency,
                                                     max_rows=max_rows))
            ), runner=runner, beam_args=beam_args, temp_location=staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    missing = [u for u in units if not ds.is_finished(u)]
    if missing:
        raise PipelineError(f"{len(missing)} shards were not written (first: {missing[0]}); re-run to resume")
    counts = summarize_units(ds, units)
    summary = FilterSummary(str(ds.path), len(shards), len(todo), counts, time.perf_counter() - started)
    if not summary.balanced:
        raise PipelineError("counts do not add up: " + ", ".join(f"{k}={counts[k]}" for k in BALANCE_KEYS))
    ds.mark_complete({k: counts[k] for k in BALANCE_KEYS} | {k: v for k, v in counts.items() if ":" in k})
    return summary
