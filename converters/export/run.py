"""The streaming export driver: dataset directory -> OUT/data shards + OUT/README.md.

Records are streamed from the store (trajectories) or from the DuckDB pair join (pairs), mixed
(`mix`), rendered by the format's pure row function and streamed into shards; nothing holds the
whole dataset. Every input record ends up counted: exported, or skipped with a reason
(`records_in == records_exported + sum(skipped)`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import duckdb

from converters.export import pairs as pair_join
from converters.export.card import write_card
from converters.export.formats import FORMATS, Format
from converters.export.mix import copies
from converters.export.options import FormatOptions
from converters.export.render import RenderOptions, Unrenderable
from converters.export.writer import DEFAULT_SHARD_ROWS, TEMP_PREFIX, ShardWriter
from schemas.models import Pair, Trajectory
from schemas.store import Dataset

SFT_LAYOUTS = ("auto", "messages", "prompt-completion")
KTO_MODES = ("auto", "steps", "trajectory")


class ExportError(Exception):
    """Bad input or options; the message is a one-line explanation."""


@dataclass
class ExportConfig:
    format: str
    shard_rows: int = DEFAULT_SHARD_ROWS
    mix: dict[str, float] | None = None
    seed: int = 0
    # None: the format's default (kept, except for openai whose format has no field for it).
    reasoning: bool | None = None
    web_max_chars: int = 20_000
    sft_layout: str = "auto"
    kto_mode: str = "auto"
    overwrite: bool = False
    duckdb_memory_limit: str = pair_join.DEFAULT_MEMORY_LIMIT


@dataclass
class RunningStats:
    count: int = 0
    total: int = 0
    min: int | None = None
    max: int | None = None

    def add(self, value: int) -> None:
        self.count += 1
        self.total += value
        self.min = value if self.min is None else min(self.min, value)
        self.max = value if self.max is None else max(self.max, value)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


@dataclass
class ExportReport:
    format: str
    output: Path
    records_in: int = 0
    records_exported: int = 0
    rows: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    records_by_source: Counter[str] = field(default_factory=Counter)
    rows_by_source: Counter[str] = field(default_factory=Counter)
    steps_by_source: dict[str, RunningStats] = field(default_factory=dict)
    provenance: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    files: list[Path] = field(default_factory=list)
    sft_layout: str | None = None
    reasoning: bool = True

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


# ---- preparing -------------------------------------------------------------------------------


def _prepare_output(out: Path, src: Path, overwrite: bool) -> None:
    if out.resolve() == src.resolve() or src.resolve() in out.resolve().parents:
        raise ExportError(f"{out}: the output must not be the input dataset or inside it")
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ExportError(f"{out}: exists and is not empty (use --overwrite to replace an earlier export)")
        # Only what an export writes is removed; anything else the user put there stays.
        for old in [*(out / "data").glob("train-*"), *(out / "data").glob(f"{TEMP_PREFIX}*"), out / "README.md"]:
            if old.is_file():
                old.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _any_masked(files: list[Path], mix: dict[str, float] | None) -> bool:
    """DuckDB pre-scan (steps' `train` flags only): does any selected trajectory have a masked step?"""
    if not files:
        return False
    paths = "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in files) + "]"
    where = "list_bool_or(list_transform(steps, lambda s: NOT coalesce(s.train, true)))"
    params: list[Any] = []
    if mix is not None:
        kept = [s for s, w in mix.items() if w > 0]
        if not kept:
            return False
        where += f" AND source IN ({', '.join('?' for _ in kept)})"
        params = kept
    con = duckdb.connect()
    try:
        return con.execute(f"SELECT EXISTS (SELECT 1 FROM read_parquet({paths}) WHERE {where})", params).fetchone()[0]
    finally:
        con.close()


def resolve_options(fmt: Format, cfg: ExportConfig, ds: Dataset) -> FormatOptions:
    if cfg.sft_layout not in SFT_LAYOUTS:
        raise ExportError(f"unknown SFT layout {cfg.sft_layout!r}; choose one of {', '.join(SFT_LAYOUTS)}")
    if cfg.kto_mode not in KTO_MODES:
        raise ExportError(f"unknown KTO mode {cfg.kto_mode!r}; choose one of {', '.join(KTO_MODES)}")
    layout = cfg.sft_layout
    if layout == "auto":
        masked = fmt.name == "trl-sft" and _any_masked(ds.checked_shard_files("trajectories"), cfg.mix)
        layout = "prompt-completion" if masked else "messages"
    reasoning = fmt.keeps_reasoning if cfg.reasoning is None else cfg.reasoning
    return FormatOptions(RenderOptions(reasoning=reasoning, web_max_chars=cfg.web_max_chars), layout, cfg.kto_mode)  # type: ignore[arg-type]


# ---- streaming -------------------------------------------------------------------------------


def _records(fmt: Format, ds: Dataset, cfg: ExportConfig) -> Iterator[tuple[str, str, Callable[[FormatOptions], list[dict[str, Any]]], Trajectory | None]]:
    """(id, source, make_rows, trajectory for stats) per input record; make_rows may raise Unrenderable."""
    if fmt.table == "trajectories":
        for traj in ds.iter_records("trajectories"):
            yield traj.id, traj.source, (lambda o, t=traj: fmt.rows(t, o)), traj
        return
    joined = pair_join.iter_joined_pairs(ds.checked_shard_files("pairs"), ds.checked_shard_files("trajectories"), cfg.duckdb_memory_limit)
    for pair, chosen, rejected in joined:
        yield pair.id, pair.source, (lambda o, p=pair, c=chosen, r=rejected: _pair_rows(fmt, p, c, r, o)), chosen


def _pair_rows(fmt: Format, pair: Pair, chosen: Trajectory | None, rejected: Trajectory | None,
               opts: FormatOptions) -> list[dict[str, Any]]:
    if chosen is None:
        raise Unrenderable("missing chosen trajectory")
    if rejected is None:
        raise Unrenderable("missing rejected trajectory")
    return fmt.rows(pair, chosen, rejected, opts)


def _record_stats(report: ExportReport, source: str, traj: Trajectory | None, rows: int) -> None:
    report.records_exported += 1
    report.records_by_source[source] += 1
    report.rows_by_source[source] += rows
    if traj is not None:
        report.steps_by_source.setdefault(source, RunningStats()).add(len(traj.steps))
        p = traj.provenance
        report.provenance[(p.method or "-", p.source_dataset or "-", p.model or "-")] += 1


def export(src: str | Path, out: str | Path, cfg: ExportConfig,
           progress: Callable[[int], None] | None = None, total: Callable[[int], None] | None = None) -> ExportReport:
    """Export the dataset at `src` into `out`. `total(n)` is told the input count, `progress(1)` each record."""
    src, out = Path(src), Path(out)
    fmt = FORMATS.get(cfg.format)
    if fmt is None:
        raise ExportError(f"unknown format {cfg.format!r}; choose one of {', '.join(FORMATS)}")
    if cfg.shard_rows < 1:
        raise ExportError(f"--shard-rows must be >= 1, got {cfg.shard_rows}")
    ds = Dataset.open(src)
    opts = resolve_options(fmt, cfg, ds)
    _prepare_output(out, src, cfg.overwrite)
    report = ExportReport(format=fmt.name, output=out, reasoning=opts.render.reasoning,
                          sft_layout=opts.sft_layout if fmt.name == "trl-sft" else None)
    if total is not None:
        total(ds.count(fmt.table))
    schema = fmt.schema(opts) if fmt.schema is not None else None
    writer = ShardWriter(out / "data", fmt.file_type, schema, cfg.shard_rows)
    try:
        for record_id, source, make_rows, traj in _records(fmt, ds, cfg):
            report.records_in += 1
            if progress is not None:
                progress(1)
            n = 1
            if cfg.mix is not None:
                if source not in cfg.mix:
                    report.skipped["source not in --mix"] += 1
                    continue
                n = copies(cfg.mix[source], cfg.seed, record_id)
                if n == 0:
                    report.skipped["sampled out by --mix"] += 1
                    continue
            try:
                rows = make_rows(opts)
            except Unrenderable as exc:
                report.skipped[str(exc)] += 1
                continue
            for _ in range(n):
                for row in rows:
                    writer.write(row)
            report.rows += n * len(rows)
            _record_stats(report, source, traj, n * len(rows))
        report.files = writer.close()
    except BaseException:
        writer.abort()
        raise
    write_card(out, fmt, cfg, report, report.files, source=src)
    return report

