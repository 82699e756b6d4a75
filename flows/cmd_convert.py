"""CLI commands of the convert stage: `trajforge convert` (the Beam pipeline) and `trajforge sources`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from flows import args
from flows.console import beam_errors_reported_once, console, fail
from pipelines.inputs import DEFAULT_CHUNK_SIZE, DEFAULT_MAX_RECORD_BYTES, InputError
from schemas.store import DEFAULT_MAX_ROWS, StoreError

# Unknown options go to Beam (`ctx.args`); applied where the command is registered in flows/cli.py.
CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def convert(
    ctx: typer.Context,
    source: Annotated[str, typer.Option("--source", "-s", help="Registered converter (see `trajforge sources`).")],
    inputs: Annotated[
        list[str],
        typer.Option("--input", "-i", help="JSON, JSONL(.gz/.zst), Parquet, a saved datasets dir, or hf:OWNER/NAME."),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output dataset directory.")],
    runner: Annotated[
        str,
        typer.Option(help="Beam runner (class path or name, e.g. DataflowRunner); "
                     "other runners need --output on a filesystem every worker sees."),
    ] = (
        "apache_beam.runners.portability.fn_api_runner.FnApiRunner"
    ),
    chunk_size: Annotated[int, typer.Option(help="Records per unit of work.", min=1)] = DEFAULT_CHUNK_SIZE,
    shard_rows: Annotated[int, typer.Option(help="Maximum rows per Parquet shard.", min=1)] = DEFAULT_MAX_ROWS,
    overwrite: Annotated[bool, typer.Option(help="Start the output afresh instead of resuming it.")] = False,
    workers: Annotated[
        int,
        typer.Option(help="Worker processes of the local runner; 0: one per CPU core for inputs of "
                     "40,000+ records, else in-process.", min=0),
    ] = 0,
    max_record_bytes: Annotated[
        int,
        typer.Option(help="A JSONL line longer than this many bytes is quarantined with its size, not parsed "
                     "(parsing takes several times a line's size in memory)."),
    ] = DEFAULT_MAX_RECORD_BYTES,
) -> None:
    """Convert public dataset records to the interlingua with a Beam pipeline (resumable).

    Unknown options (e.g. --project=...) are passed to Beam.
    """
    from pipelines.convert import ConvertError, run_convert  # Beam import is slow; only here

    args.at_least(max_record_bytes, 1, "--max-record-bytes", "bytes")

    # Started on the first report, so errors found before the pipeline runs print cleanly.
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    )
    converted = progress.add_task("converted", total=None)
    written = progress.add_task("written", total=None)

    def on_progress(n_converted: int, n_written: int, total: int) -> None:
        if not progress.live.is_started:
            progress.start()
        progress.update(converted, completed=n_converted, total=total)
        progress.update(written, completed=n_written, total=total)

    try:
        with beam_errors_reported_once():
            summary = run_convert(
                source, inputs, str(output), runner=runner, beam_args=list(ctx.args), chunk_size=chunk_size,
                max_rows=shard_rows, overwrite=overwrite, on_progress=on_progress, workers=workers,
                max_record_bytes=max_record_bytes,
            )
    except (ConvertError, InputError, StoreError) as exc:
        fail(str(exc))
    finally:
        if progress.live.is_started:
            progress.stop()
    print_summary(summary)
    n = summary.counts["in"]
    if n and summary.counts["quarantined"] == n:
        fail(f"all {n} records were quarantined, none converted (reasons above; the records are in {output}/quarantine): "
             f"are these {source} records?")


def print_summary(summary: object) -> None:
    from pipelines.convert import ConvertSummary

    assert isinstance(summary, ConvertSummary)
    c = summary.counts
    table = Table(title=f"convert -> {summary.output}", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("inputs", str(len(summary.inputs)))
    reused = f", {summary.chunks_reused} of them converted before a kill" if summary.chunks_reused else ""
    table.add_row("chunks", f"{summary.chunks} ({summary.chunks_done} done{reused}, {summary.chunks_skipped} skipped)")
    if summary.workers > 1:
        table.add_row("worker processes", str(summary.workers))
    if c["rows"] and c["rows"] != c["in"]:
        table.add_row("rows read", str(c["rows"]))
    table.add_row("records in", str(c["in"]))
    table.add_row("out", str(c["out"]))
    table.add_row("quarantined", str(c["quarantined"]))
    for reason, n in summary.quarantine_reasons.items():
        table.add_row(f"  {reason}", str(n))
    table.add_row("duplicates", str(c["duplicate"]))
    console.print(table)
    rate = c["in"] / summary.seconds if summary.seconds > 0 and summary.chunks_done else 0.0
    console.print(
        f"in {c['in']} = out {c['out']} + quarantined {c['quarantined']} + duplicates {c['duplicate']}"
        + (f"  ({summary.seconds:.1f}s, {rate:,.0f} records/s)" if rate else f"  ({summary.seconds:.1f}s)"),
        highlight=False,
    )


def sources() -> None:
    """List the registered converters, their source datasets and what they convert."""
    from converters.registry import all_converters

    table = Table(title="converters")
    for column in ("source", "datasets", "description"):
        table.add_column(column)
    for name, info in all_converters().items():
        first_line = info.doc.strip().splitlines()[0] if info.doc.strip() else ""
        table.add_row(name, ", ".join(info.sources), first_line)
    console.print(table)
