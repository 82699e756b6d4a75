"""`trajforge eval`: measure a model on an environment's tasks; `trajforge eval compare A B`: two evals, paired."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError
from rich.table import Table

from envs.sandbox import SandboxUnavailable
from envs.tasks import TaskFileError
from flows.console import console, err_console, fail, read_config_mapping
from flows.progress import RichProgress
from schemas.store import StoreError

app = typer.Typer(help="Measure a model on an environment's tasks; compare two evals.", no_args_is_help=False,
                  invoke_without_command=True, add_completion=False)


@app.callback()
def eval_cmd(
    ctx: typer.Context,
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML agent config: llm, env, env_config, "
                                                   "tasks, max_steps, ... (an eval or rollout config).")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Output directory: the episodes as a "
                                                   "dataset and the report.")] = None,
    split: Annotated[Optional[str], typer.Option(help="Task split to run (default: test, where the source has "
                                                      "splits; 'all' for every task).")] = None,
    samples: Annotated[Optional[int], typer.Option("--samples", "-k", min=1, max=1000,
                                                   help="Episodes per task (pass@k, pass^k).")] = None,
    tasks: Annotated[Optional[int], typer.Option("--tasks", "-n", min=1, help="At most N tasks.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Start the output afresh.")] = False,
) -> None:
    """Run the config's model on the tasks (test split by default) and report pass@1, pass@k, pass^k, reward,
    failures per criterion, steps, tokens, cost and time; resumes a killed eval of the same config."""
    if ctx.invoked_subcommand is not None:
        return
    if config is None or output is None:
        fail("trajforge eval needs --config and --output (or: trajforge eval compare A B)")
    from evals.report import headline
    from evals.run import eval_config, run_eval

    try:
        cfg = eval_config(read_config_mapping(config))
    except ValidationError as exc:
        fail(f"{config}: " + "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors()))
    except ValueError as exc:
        fail(f"{config}: {exc}".replace("\n", "; "))
    _check_endpoint(cfg, config)
    console.print(f"[bold]eval[/] {cfg.llm.backend}:{cfg.llm.model} on {cfg.env} -> {output}", highlight=False)
    try:
        with RichProgress("episodes") as progress:
            report = asyncio.run(run_eval(cfg, output, split=split, samples=samples, max_tasks=tasks,
                                          overwrite=overwrite, progress=progress))
    except (StoreError, SandboxUnavailable, ValueError) as exc:
        fail(str(exc))
    except TaskFileError as exc:
        fail(f"{exc} (tasks of {config})")
    table = Table(title=f"eval: split {report['split']}")
    table.add_column("what")
    table.add_column("value", justify="right")
    for what, value in headline(report):
        table.add_row(what, value)
    for criterion, n in report["failures"]["by_criterion"].items():
        table.add_row(f"  failed: {criterion}", str(n))
    console.print(table)
    console.print(f"report: {output / 'README.md'} (per task: {output / 'tasks.csv'}); episodes: trajforge view {output}",
                  highlight=False)
    unscorable = report["unscorable_by_user"]
    if report["scored"] == 0 and not unscorable["episodes"]:
        fail(f"no episode was scored: all {report['episodes']} were quarantined (world or model server errors); "
             f"see {output}/quarantine")
    if unscorable["episodes"]:
        # Not the agent's failure and not a broken run: the simulated user broke them; say where they are.
        where = [f"{unscorable['kept_marked']} kept, marked details.user_fidelity (trajforge view {output})"
                 if unscorable["kept_marked"] else "", f"{unscorable['quarantined']} in {output}/quarantine"
                 if unscorable["quarantined"] else ""]
        err_console.print(f"[bold yellow]warning:[/] {unscorable['episodes']} of {report['episodes']} episode(s) "
                          f"unscorable: the simulated user broke them ({', '.join(f'{r}: {n}' for r, n in unscorable['by_reason'].items())}); "
                          f"{'; '.join(w for w in where if w)}. pass@1 is over the {report['scored']} scored"
                          + ("" if report["scored"] else " (none): a deterministic user (user: {kind: scenario}) "
                             "scores a small model"), highlight=False)
    for criterion, n in report.get("scored_without", {}).items():
        err_console.print(f"[bold yellow]note:[/] {n} task(s) scored without {criterion}"
                          + (" (no judge: set env_config.judge)" if criterion == "NL_ASSERTION" else " (unchecked)"),
                          highlight=False)


def _check_endpoint(cfg: Any, where: Path) -> None:
    if cfg.llm.backend == "openai":
        from backends.openai_backend import endpoint_problem

        if (problem := endpoint_problem(cfg.llm)) is not None:
            fail(f"{where}: {problem}")


@app.command("compare")
def compare_cmd(
    a: Annotated[Path, typer.Argument(help="The first eval's output directory (before).")],
    b: Annotated[Path, typer.Argument(help="The second eval's output directory (after).")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write compare.json, compare.csv, "
                                                   "compare.md and a plot here.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap.")] = 0,
) -> None:
    """Per-task differences of pass@1 (B - A) and a paired bootstrap interval of their mean."""
    from evals.compare import check_compare_output, compare_dirs, summary_rows, write_compare

    try:
        if output is not None:  # refused before the work, not after the tables
            check_compare_output(output)
        result = compare_dirs(a, b, seed=seed)
    except ValueError as exc:
        fail(str(exc))
    for warning in result["warnings"]:
        console.print(f"[bold yellow]warning:[/] {warning}", highlight=False)
    table = Table(title="eval compare")
    table.add_column("what")
    table.add_column("value", justify="right")
    for what, value in summary_rows(result):
        table.add_row(what, value)
    console.print(table)
    groups = Table(title="pass@1 per task")
    for column in ("task", "tasks", "A", "B", "B - A"):
        groups.add_column(column, justify="left" if column == "task" else "right")
    for g in result["groups"]:
        groups.add_row(g["group"], str(g["tasks"]), _pct(g["a"]), _pct(g["b"]), f"{100 * g['delta']:+.1f}")
    console.print(groups)
    if output is not None:
        try:
            write_compare(output, result)
        except OSError as exc:
            fail(f"{output}: cannot write the comparison ({exc.strerror or exc})")
        console.print(f"written: {output / 'compare.md'}", highlight=False)
    if result["tasks_in_common"] == 0:
        fail(f"{a} and {b} have no scored task in common")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"
