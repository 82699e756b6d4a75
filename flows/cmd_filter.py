"""CLI commands of the filter stages: `trajforge filter`, `trajforge dedup` and `trajforge mix`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Mapping

import typer
from rich.table import Table

from flows.config_file import ConfigFileError, read_config
from flows.cmd_store import SHARD_READ_ERRORS, unreadable
from flows.console import beam_errors_reported_once, console, fail

# Unknown options go to Beam (`ctx.args`); applied where the commands are registered in flows/cli.py.
CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}
DEFAULT_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"


def _counts_table(title: str, counts: Mapping[str, int], rows: list[tuple[str, str]]) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    for label, key in rows:
        table.add_row(label, str(counts.get(key, 0)))
        for k, v in sorted(counts.items()):
            if k.startswith(f"{key}:"):
                table.add_row(f"  {k.split(':', 1)[1]}", str(v))
    console.print(table)


def filter_cmd(
    ctx: typer.Context,
    input_dir: Annotated[Path, typer.Argument(help="Input dataset directory.")],
    config: Annotated[Path, typer.Option("--config", "-c", help="YAML list of filters (see docs/filters.md).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output dataset directory.")],
    runner: Annotated[str, typer.Option(help="Beam runner (class path or name).")] = DEFAULT_RUNNER,
    batch_size: Annotated[int, typer.Option(help="Records per batch inside a bundle.", min=1)] = 256,
    concurrency: Annotated[int, typer.Option(help="Records in flight per batch (LLM judges).", min=1)] = 32,
    overwrite: Annotated[bool, typer.Option(help="Start the output afresh instead of resuming it.")] = False,
) -> None:
    """Run a chain of filters and judges over a dataset as a Beam pipeline (resumable per shard).

    Unknown options (e.g. --direct_num_workers=2) are passed to Beam.
    """
    from filters.base import FilterConfigError
    from pipelines.beam_runner import PipelineError
    from pipelines.filter import run_filter
    from schemas.store import StoreError

    try:
        specs = read_config(config, "filter config")
    except ConfigFileError as exc:
        fail(str(exc))
    try:
        with beam_errors_reported_once():
            s = run_filter(str(input_dir), specs, str(output), runner=runner, beam_args=list(ctx.args),
                           batch_size=batch_size, concurrency=concurrency, overwrite=overwrite)
    except FilterConfigError as exc:
        fail(f"{config}: {exc}")
    except PipelineError as exc:
        fail(f"{input_dir}: {exc}")
    except (StoreError, ValueError) as exc:
        fail(str(exc))
    c = s.counts
    _counts_table(f"filter -> {s.output}", c, [("records in", "in"), ("kept", "kept"), ("filtered", "filtered"),
                                              ("quarantined", "quarantined")])
    reasons = s.by_prefix("reason:")
    if reasons:
        table = Table(title="reasons")
        for col in ("filter", "reason", "count"):
            table.add_column(col)
        for key, n in reasons.items():
            name, reason = key.split(":", 1)
            table.add_row(name, reason, str(n))
        console.print(table)
    console.print(f"in {c['in']} = kept {c['kept']} + filtered {c['filtered']} + quarantined {c['quarantined']}"
                  f"  ({s.shards_done}/{s.shards} shards run, {s.seconds:.1f}s)", highlight=False, markup=False)


def dedup_cmd(
    ctx: typer.Context,
    input_dir: Annotated[Path, typer.Argument(help="Input dataset directory.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output dataset directory.")],
    threshold: Annotated[float, typer.Option(help="Jaccard threshold for near duplicates.")] = 0.8,
    num_perm: Annotated[int, typer.Option(help="MinHash permutations.", min=8)] = 128,
    exact_only: Annotated[bool, typer.Option(help="Only exact (normalized content) duplicates.")] = False,
    prefer_reward: Annotated[bool, typer.Option(help="Representative: highest reward, then smallest id.")] = False,
    partitions: Annotated[int, typer.Option(help="Split each LSH band into this many grouping tasks.", min=1)] = 1,
    runner: Annotated[str, typer.Option(help="Beam runner (class path or name).")] = DEFAULT_RUNNER,
    overwrite: Annotated[bool, typer.Option(help="Start the output afresh instead of resuming it.")] = False,
) -> None:
    """Remove exact and near (MinHash LSH) duplicates; clusters go to OUTPUT/clusters.parquet."""
    from pipelines.dedup import run_dedup
    from pipelines.beam_runner import PipelineError
    from schemas.store import StoreError

    try:
        with beam_errors_reported_once():
            s = run_dedup(str(input_dir), str(output), threshold=threshold, num_perm=num_perm,
                          exact_only=exact_only, prefer_reward=prefer_reward, partitions=partitions, runner=runner,
                          beam_args=list(ctx.args), overwrite=overwrite)
    except PipelineError as exc:
        fail(f"{input_dir}: {exc}")
    except StoreError as exc:
        fail(str(exc))
    c = s.counts
    _counts_table(f"dedup -> {s.output}", c, [("records in", "in"), ("kept", "kept"), ("filtered", "filtered")])
    lsh = f"{s.params.bands} bands x {s.params.rows} rows" if s.params else "exact only"
    console.print(f"in {c['in']} = kept {c['kept']} + filtered {c['filtered']} + quarantined {c['quarantined']}; "
                  f"{s.clusters} clusters ({lsh}; {s.verified_edges}/{s.candidate_edges} near candidates verified)"
                  f"  ({s.seconds:.1f}s)", highlight=False, markup=False)


def _parse_weights(text: str | None) -> dict[str, float]:
    weights: dict[str, float] = {}
    for part in filter(None, (text or "").split(",")):
        name, sep, value = part.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            fail(f"bad weight {part!r}; write source=weight,...")
        if not sep:
            fail(f"bad weight {part!r}; write source=weight,...")
    return weights


def mix_cmd(
    inputs: Annotated[list[Path], typer.Argument(help="Input dataset directories.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output dataset directory.")],
    weights: Annotated[str | None, typer.Option(help="Per-source weights: source=w,... (default 1).")] = None,
    temperature: Annotated[float, typer.Option(help="Temperature T: p ∝ (n·w)^(1/T).", min=0.01)] = 1.0,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    total: Annotated[int | None, typer.Option(help="Records to draw in all (default: all, re-weighted).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Start the output afresh.")] = False,
) -> None:
    """Balanced, deterministic sampling across sources (AgentOhana-style), streamed with DuckDB."""
    from pipelines.mix import MixError, run_mix
    from schemas.store import StoreError

    try:
        s = run_mix([str(p) for p in inputs], str(output), weights=_parse_weights(weights),
                    temperature=temperature, seed=seed, total=total, overwrite=overwrite)
    except (MixError, StoreError) as exc:
        fail(str(exc))
    except SHARD_READ_ERRORS as exc:
        fail(unreadable(Path(", ".join(map(str, inputs))), exc))
    table = Table(title=f"mix -> {s.output}")
    for col in ("source", "available", "weight", "p", "target", "written"):
        table.add_column(col, justify="right")
    for src in s.sources:
        table.add_row(src.name, str(src.available), f"{src.weight:g}", f"{src.probability:.3f}",
                      f"{src.target:.0f}", str(src.written))
    console.print(table)
    console.print(f"{s.written} records written (seed {seed}, T={temperature:g}); "
                  f"{s.duplicates} duplicate ids dropped (the first occurrence kept)", highlight=False)


