"""`trajforge generate`: run one generation method from a YAML config into a dataset directory."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError
from rich.table import Table

from backends.stats import endpoint_table, format_cost
from envs.base import EnvError
from envs.sandbox import SandboxUnavailable, sandbox_problem
from envs.tasks import TaskFileError, TaskSourceConfig
from flows.config_file import ConfigFileError
from flows.console import console, err_console, fail, read_config_mapping
from flows.preflight import check_generate_config
from flows.progress import RichProgress
from generators.base import RunSummary, describe_role
from generators.runner import generate as run_generation
from generators.runner import load_config
from schemas.store import StoreError


def generate(
    method: Annotated[str, typer.Option("--method", "-m", help="Generation method name.")],
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML config of the method.")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Output dataset directory.")] = Path("out/generated"),
    overwrite: Annotated[bool, typer.Option(help="Start the output afresh.")] = False,
    unsafe_no_sandbox: Annotated[bool, typer.Option(
        "--unsafe-no-sandbox", help="Where bubblewrap is missing, run generated code (verifiers) with only "
                                    "seccomp, rlimits and in-process guards. Unsafe: warns every run.")] = False,
    allow_test_split: Annotated[bool, typer.Option("--allow-test-split", help="Allow tasks of a benchmark's test "
                                                   "split (refused by default: no training on test tasks).")] = False,
) -> None:
    """Generate trajectories with one method; resumes a killed run of the same config."""
    data = read_config_mapping(config) if config is not None else {}
    try:
        cfg = load_config(data, method)
    except KeyError as exc:
        fail(str(exc.args[0]))
    except ValidationError as exc:
        fail(f"{config or 'config'}: " + "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors()))
    except ValueError as exc:
        fail(f"{config or 'config'}: {exc}".replace("\n", "; "))
    if allow_test_split:
        if not isinstance(getattr(cfg, "tasks", None), TaskSourceConfig):
            fail(f"--allow-test-split: method {cfg.method} takes no tasks from a task source")
        cfg = cfg.model_copy(update={"tasks": cfg.tasks.model_copy(update={"allow_test_split": True})})
    try:
        check_generate_config(cfg, str(config or "config"))
    except ConfigFileError as exc:
        fail(str(exc))
    sandbox = getattr(cfg, "sandbox", None)
    if unsafe_no_sandbox and sandbox is not None:
        sandbox.unsafe_no_sandbox = True
    if sandbox is not None and sandbox.unsafe_no_sandbox and (problem := sandbox_problem()) is not None:
        err_console.print(f"[bold yellow]warning:[/] UNSAFE: {problem}; generated code runs WITHOUT the OS sandbox "
                          "(--unsafe-no-sandbox / sandbox.unsafe_no_sandbox)", highlight=False)
    console.print(f"[bold]generate[/] {cfg.method} with {cfg.llm.backend}:{cfg.llm.model} -> {output}")
    try:
        with RichProgress(f"{cfg.method} tasks") as progress:
            summary = asyncio.run(run_generation(cfg, output, overwrite=overwrite, progress=progress))
    except (StoreError, SandboxUnavailable) as exc:
        fail(str(exc))
    except EnvError as exc:  # the world could not start (a server that exits, a missing browser): one line
        fail(f"{config or 'config'}: {exc}")
    except TaskFileError as exc:
        # The tasks file's path came from the config: name both, the path may be the damage.
        fail(f"{exc} (tasks of {config or 'the config'})")
    print_summary(summary)
    for name, info in summary.roles.items():
        if info["played_by"] != "own model":
            err_console.print(f"[bold yellow]note:[/] the {name} was {describe_role(info)}: records say so "
                              "(details.actor_roles, the export card)", highlight=False)
    for note in nothing_notes(summary):
        err_console.print(f"[bold yellow]note:[/] {note}", highlight=False)
    if failed_everything(summary):
        top = summary.reasons.most_common(1)
        fail(f"nothing succeeded: all {summary.processed} task(s) run were quarantined"
             + (f" (most often: {top[0][0]}, {top[0][1]}x)" if top else "") + f"; see {output}/quarantine")


def nothing_notes(summary: RunSummary) -> list[str]:
    """Where a method produced nothing, why: its own word for a stage that made nothing (a report value
    starting with "nothing"), and a run that wrote no trajectory and no pair, with its top reasons."""
    notes = [f"{summary.method} {key}: {value}" for key, value in summary.report.items()
             if isinstance(value, str) and value.startswith("nothing")]
    counts = summary.counts
    if summary.processed and not counts.get("trajectories", 0) and not counts.get("pairs", 0):
        why = [f"{reason} ({n}x)" for reason, n in summary.reasons.most_common(3)]
        notes.append(f"{summary.method} wrote no trajectory from {summary.processed} task(s)"
                     + (f": {'; '.join(why)}" if why else "") + " (filtered/ and quarantine/ hold what was not kept)")
    return notes


def failed_everything(summary: RunSummary) -> bool:
    """Whether this run's tasks all ended in quarantine (none wrote a trajectory, pair or verdict)."""
    counts = summary.counts
    wrote = sum(counts.get(k, 0) for k in ("trajectories", "pairs", "filtered"))
    return summary.processed > 0 and wrote == 0 and counts.get("quarantine", 0) > 0


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
    if (rate := data["success_rate"]) is not None:
        table.add_row(f"successes ({rate['method']}{' on ' + rate['env'] if rate['env'] else ''})",
                      f"{rate['successes']} of {rate['episodes']} episodes ({rate['rate']:.1%})")
    for key, n in sorted(data["counts"].items()):
        if key.startswith("failed_step:"):
            table.add_row(f"  failed steps ({key.split(':', 1)[1]} answer)", str(n))
    for key, n in sorted(data["counts"].items()):
        if key.startswith("unchecked:"):
            criterion = key.split(":", 1)[1]
            table.add_row(f"  scored without {criterion}" + (" (no judge)" if criterion == "NL_ASSERTION" else ""),
                          f"{n} episodes")
    for reason, n in sorted(data["rejected_by_reason"].items()):
        table.add_row(f"  rejected: {reason}", str(n))
    for name, value in data["report"].items():
        table.add_row(name, _measure(value))
    for name, info in data["roles"].items():
        table.add_row(f"role: {name}", describe_role(info))
    llm = data["llm"]
    for key in ("requests", "cache_hits", "calls", "retries", "failovers", "failures", "truncated", "unusable",
                "prompt_tokens", "completion_tokens"):
        table.add_row(f"LLM {key.replace('_', ' ')}", f"{llm.get(key, 0):,}")
    table.add_row("LLM latency (s)", f"{llm.get('latency_s', 0.0):,.1f}")
    table.add_row("LLM cost", format_cost(llm.get("cost_usd"), llm.get("cost", "-")))
    usage = data["usage"]
    if usage["calls"]:
        table.add_row("steps made by the model (written)",
                      f"{usage['calls']:,} calls, {usage['cached']:,} from cache; tokens {usage['prompt_tokens']:,} "
                      f"prompt / {usage['completion_tokens']:,} completion; cost "
                      + ("unknown" if usage["cost_usd"] is None else f"${usage['cost_usd']:,.4f}"))
    for role, stats in llm.items():  # the role models' own clients (judge, teacher, student)
        if isinstance(stats, dict) and "calls" in stats and role != "endpoints":
            for key in ("calls", "cache_hits", "failures"):
                table.add_row(f"{role} LLM {key.replace('_', ' ')}", f"{stats.get(key, 0):,}")
    console.print(table)
    if llm.get("endpoints"):
        console.print(endpoint_table(llm["endpoints"]))


def _measure(value: object) -> str:
    """A measurement for one summary cell: `key value` pairs for a mapping, the value itself otherwise."""
    if isinstance(value, dict):
        return ", ".join(f"{k.replace('_', ' ')} {'n/a' if v is None else v}" for k, v in value.items())
    return str(value)
