"""`trajforge envs`: list the environments; `trajforge envs check`: validate one before a run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError
from rich.table import Table

from envs.base import Capabilities, EnvError
from envs.check import CheckReport, check_env, summary_rows
from envs.registry import available_envs, env_class
from envs.spec import EnvFactory, EnvSpec
from envs.tasks import TaskFileError, load_tasks
from envs.users import UserConfig
from flows.console import console, err_console, fail, read_config_mapping
from flows.progress import RichProgress

app = typer.Typer(help="Environments: list them, check one before a run.", no_args_is_help=False,
                  invoke_without_command=True, add_completion=False)


@app.callback()
def envs(ctx: typer.Context) -> None:
    """List the environments and what they offer (restore by snapshot or replay, user, evaluation)."""
    if ctx.invoked_subcommand is not None:
        return
    table = Table(title="environments")
    for column in ("environment", "restore", "user", "evaluation"):
        table.add_column(column)
    for name in available_envs():
        caps = capabilities(name)
        table.add_row(name, caps.restore, caps.user, caps.evaluation)
    console.print(table)


def capabilities(name: str) -> Capabilities:
    """An environment's capabilities; those that need settings to exist (a server, a tool list) from their class."""
    cls: Any = env_class(name)
    try:
        return cls().capabilities()
    except (TypeError, ValueError):
        user = getattr(cls, "default_user", "per config")
        return Capabilities("snapshot" if cls.can_snapshot else "replay", user, cls.evaluation)


@app.command("check")
def check(
    config: Annotated[Path, typer.Option("--config", "-c", help="YAML with env, env_config, tasks (and user).")],
    tasks: Annotated[Optional[int], typer.Option("--tasks", "-n", min=1, help="Check only the first N tasks.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes at once in the second pass.")] = 4,
    with_user: Annotated[bool, typer.Option("--with-user", help="Answer messages with the config's user "
                                                                "(default: no user).")] = False,
) -> None:
    """Replay each task's reference solution and a do-nothing agent; exit 1 unless the environment is healthy."""
    data = read_config_mapping(config)
    try:
        spec = EnvSpec.model_validate({k: data[k] for k in ("env", "env_config", "tasks", "user") if k in data})
    except ValidationError as exc:
        fail(f"{config}: {exc}".replace("\n", "; "))
    # Checking trains nothing: every split may be checked.
    task_source = spec.tasks.model_copy(update={"allow_test_split": True, **({"n": tasks} if tasks else {})})
    spec = spec.model_copy(update={"tasks": task_source, "user": spec.user if with_user else UserConfig(kind="none")})
    try:
        report = asyncio.run(_run(spec, data.get("llm"), concurrency))
    except TaskFileError as exc:
        fail(f"{exc} (tasks of {config})")
    except (EnvError, ValueError, KeyError) as exc:
        fail(f"{config}: {exc}")
    if as_json:
        typer.echo(json.dumps(report.as_dict(), indent=2))
    else:
        _print(report)
    if not report.healthy:
        raise typer.Exit(1)


async def _run(spec: EnvSpec, llm_config: Any, concurrency: int) -> CheckReport:
    llm = None
    if llm_config is not None and _needs_method_llm(spec):
        from backends.registry import make_llm

        llm = make_llm(llm_config)
    factory = EnvFactory(spec, llm)
    try:
        task_list = load_tasks(spec.tasks, spec.env, factory.make() if spec.tasks.source == "env" else None)
        if not task_list:
            raise ValueError("the task source gave no tasks")
        with RichProgress(f"envs check {spec.env}", console=err_console) as progress:
            return await check_env(factory, task_list, concurrency=concurrency, progress=progress)
    finally:
        await factory.aclose()
        if llm is not None:
            await llm.aclose()


def _needs_method_llm(spec: EnvSpec) -> bool:
    """Whether a part of the world uses the method's model (the config's `llm`): a user, a judge, a simulator."""
    judge = spec.env_config.get("judge")
    return ((spec.user.kind == "llm" and spec.user.llm is None)
            or (isinstance(judge, dict) and judge.get("llm") is None)
            or (getattr(env_class(spec.env), "needs_llm", False) and spec.env_config.get("llm") is None))


def _print(report: CheckReport) -> None:
    table = Table(title=f"envs check {report.env}: {'healthy' if report.healthy else 'NOT healthy'}")
    table.add_column("what")
    table.add_column("value", justify="right")
    for what, value in summary_rows(report):
        table.add_row(what, value)
    console.print(table)
    for result in report.results:
        if result.reference is False or result.env_error:
            console.print(f"[red]reference failed[/] {result.task}: {result.env_error or result.reference_reason}",
                          highlight=False)
    for error in report.tool_errors:
        console.print(f"[red]tool error[/] {error.task} step {error.index} {error.tool}: {error.error}", highlight=False)
    passed = [r.task for r in report.results if r.do_nothing]
    if passed:
        console.print(f"do-nothing passed: {', '.join(passed)}", highlight=False)
