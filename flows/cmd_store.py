"""CLI commands over the interlingua and a dataset directory: schema, validate, stats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import duckdb
import pyarrow as pa
import typer
from rich.table import Table

from flows.console import console, fail
from schemas.json_schema import SCHEMA_PATH, render
from schemas.stats import dataset_stats
from schemas.store import TABLES, Dataset, StoreError
from schemas.validate import validate_dataset


def schema(
    write: Annotated[bool, typer.Option("--write", help=f"Regenerate {SCHEMA_PATH.name} in the package.")] = False,
) -> None:
    """Print the interlingua's JSON Schema (generated from the models)."""
    text = render()
    if write:
        SCHEMA_PATH.write_text(text)
        console.print(f"wrote {SCHEMA_PATH}")
        return
    typer.echo(text, nl=False)


# A shard that passes the footer check can still hold damaged pages; readers then raise their own errors.
SHARD_READ_ERRORS = (duckdb.Error, pa.ArrowException, OSError, UnicodeDecodeError)


def unreadable(path: Path, exc: Exception) -> str:
    """One line naming the dataset and what its reader said."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{path}: a shard cannot be read ({type(exc).__name__}: {first})"


def _open(path: Path) -> Dataset:
    try:
        return Dataset.open(path)
    except StoreError as exc:
        fail(str(exc))


def validate(
    path: Annotated[Path, typer.Argument(help="Dataset directory.")],
    max_errors: Annotated[int, typer.Option(help="How many errors to show.")] = 10,
) -> None:
    """Check every record against the models; print counts and the first errors."""
    ds = _open(path)
    try:
        report = validate_dataset(ds, max_errors=max_errors)
    except StoreError as exc:
        fail(str(exc))
    except SHARD_READ_ERRORS as exc:
        fail(unreadable(path, exc))
    table = Table(title=f"validate {path}")
    for column in ("table", "records", "valid", "invalid"):
        table.add_column(column, justify="right" if column != "table" else "left")
    for name in TABLES:
        counts = report.counts[name]
        table.add_row(name, str(counts["records"]), str(counts["valid"]), str(counts["invalid"]))
    console.print(table)
    for error in report.errors:
        console.print(f"[red]{error}[/]", highlight=False)
    if report.invalid:
        fail(f"{report.invalid} invalid record(s) in {path}")
    console.print(f"[green]ok[/]: {report.total} records valid")


def stats(
    path: Annotated[Path, typer.Argument(help="Dataset directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Summarise a dataset with DuckDB: sources, steps, actions, tools, rewards, labels, broken simulated users,
    quarantine."""
    ds = _open(path)
    try:
        result = dataset_stats(ds)
    except StoreError as exc:
        fail(str(exc))
    except SHARD_READ_ERRORS as exc:
        fail(unreadable(path, exc))
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
        return
    _print_stats(result)


def _print_stats(result: dict[str, Any]) -> None:
    console.print(f"[bold]{result['path']}[/]  records: {result['records']}  pairs: {result['pairs']}  "
                  f"quarantined: {result['quarantined']}  filtered: {result['filtered']}")
    steps = result["steps_per_trajectory"]
    console.print(
        "steps per trajectory: "
        + "  ".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}" for k, v in steps.items())
    )
    for title, key, columns in (
        ("records per source", "sources", ("source", "records")),
        ("records per method", "methods", ("method", "records")),
        ("step kinds", "step_kinds", ("kind", "steps")),
        ("tools used", "tools_used", ("function", "calls")),
        ("step labels", "labels", ("label", "steps")),
        ("outcomes", "outcomes", ("success", "records")),
        ("quarantine reasons", "quarantine_reasons", ("stage", "error", "records")),
        ("filter reasons", "filter_reasons", ("filter", "reason", "records")),
    ):
        rows = result[key]
        if not rows:
            continue
        table = Table(title=title)
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*(str(row[c]) for c in columns))
        console.print(table)
    if result["reward"]["count"]:
        console.print("reward: " + "  ".join(f"{k}={v}" for k, v in result["reward"].items()))
    fidelity = result["user_fidelity"]
    if fidelity["checked"]:
        console.print(f"simulated user: checked {fidelity['checked']}  broken {fidelity['broken']} (details.user_fidelity"
                      ".ok false: exports leave these out)", highlight=False)

