"""`trajforge generate`: run one generation method from a YAML config into a dataset directory."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml
from pydantic import ValidationError
from rich.table import Table

from backends.stats import endpoint_table
from flows.console import console, fail
from flows.progress import RichProgress
from generators._episode import TaskFileError
from generators.base import RunSummary
from generators.registry import all_methods
from generators.runner import generate as run_generation
from generators.runner import load_config
from schemas.store import StoreError


def generate(
    method: Annotated[str, typer.Option("--method", "-m", help="Generation method name.")],
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML config of the method.")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Output dataset directory.")] = Path("out/generated"),
    overwrite: Annotated[bool, typer.Option(help="Start the output afresh.")] = False,
) -> None:
    """Generate trajectories with one method; resumes a killed run of the same config."""
    data = {}
    if config is not None:
        try:
            data = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            fail(f"{config}: cannot read config ({exc})")
        if not isinstance(data, dict):
            fail(f"{config}: a config is a YAML mapping, not {type(data).__name__}")
    try:
        cfg = load_config(data, method)
    except KeyError as exc:
        fail(str(exc.args[0]))
    except (ValueError, ValidationError) as exc:
        fail(f"{config or 'config'}: {exc}".replace("\n", "; "))
    console.print(f"[bold]generate[/] {cfg.method} with {cfg.llm.backend}:{cfg.llm.model} -> {output}")
    try:
        with RichProgress(f"{cfg.method} tasks") as progress:
            summary = asyncio.run(run_generation(cfg, output, overwrite=overwrite, progress=progress))
    except StoreError as exc:
        fail(str(exc))
    except TaskFileError as exc:
        # The tasks file's path came from the config: name both, the path may be the damage.
        fail(f"{exc} (tasks_file of {config or 'the config'})")
    print_summary(summary)


def methods() -> None:
    """List the generation methods."""
    table = Table(title="generation methods")
    table.add_column("method")
    table.add_column("what it does")
    for name, cls in all_methods().items():
        table.add_row(name, (cls.__doc__ or "").strip().splitlines()[0])
    console.print(table)


def print_summary(summary: RunSummary) -> None:
    data = summary.as_dict()
    table = Table(title=f"generate {summary.method}: summary")
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("tasks", str(data["tasks"]))
    table.add_row("tasks already done (skipped)", str(data["skipped_done"]))
    table.add_row("tasks run now", str(data["processed"]))
    for key in ("trajectories", "pairs", "filtered", "quarantine"):
        table.add_row(f"{key} written" if key != "quarantine" else "quarantined", str(data["counts"].get(key, 0)))
    for reason, n in sorted(data["rejected_by_reason"].items()):
        table.add_row(f"  rejected: {reason}", str(n))
    llm = data["llm"]
    for key in ("calls", "cache_hits", "retries", "failovers", "failures", "prompt_tokens", "completion_tokens"):
        table.add_row(f"LLM {key.replace('_', ' ')}", f"{llm.get(key, 0):,}")
    console.print(table)
    if llm.get("endpoints"):
        console.print(endpoint_table(llm["endpoints"]))
