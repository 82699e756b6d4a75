"""`trajforge generate`: run one generation method from a YAML config into a dataset directory."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError
from rich.table import Table

from envs.tasks import TaskFileError, TaskSourceConfig
from flows.console import console, fail, read_config
from flows.progress import RichProgress
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
    allow_test_split: Annotated[bool, typer.Option("--allow-test-split", help="Allow tasks of a benchmark's test "
                                                   "split (refused by default: no training on test tasks).")] = False,
) -> None:
    """Generate trajectories with one method; resumes a killed run of the same config."""
    data = read_config(config) if config is not None else {}
    try:
        cfg = load_config(data, method)
    except KeyError as exc:
        fail(str(exc.args[0]))
    except (ValueError, ValidationError) as exc:
        fail(f"{config or 'config'}: {exc}".replace("\n", "; "))
    if allow_test_split:
        if not isinstance(getattr(cfg, "tasks", None), TaskSourceConfig):
            fail(f"--allow-test-split: method {cfg.method} takes no tasks from a task source")
        cfg = cfg.model_copy(update={"tasks": cfg.tasks.model_copy(update={"allow_test_split": True})})
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
    for key in ("calls", "cache_hits", "retries", "failures", "prompt_tokens", "completion_tokens"):
        table.add_row(f"LLM {key.replace('_', ' ')}", f"{llm.get(key, 0):,}")
    console.print(table)
