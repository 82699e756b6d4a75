"""`trajforge envs`: list the environments; `envs check`: validate one before a run; `envs tasks` and
`envs episode`: a config's tasks and one episode of one, as JSON, for a trainer outside trajforge (verifiers);
`envs serve`: a config's world as an OpenEnv environment server."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from envs.base import EnvError
from envs.tasks import TaskFileError
from flows.console import console, err_console, fail, read_config_mapping
from flows.progress import RichProgress

if TYPE_CHECKING:
    from envs.check import CheckReport
    from envs.spec import EnvSpec

app = typer.Typer(help="Environments: list them, check one before a run.", no_args_is_help=False,
                  invoke_without_command=True, add_completion=False)


@app.callback()
def envs(ctx: typer.Context) -> None:
    """List the environments and what they offer (restore by snapshot or replay, user, evaluation)."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.table import Table

    from flows.listing import env_rows

    table = Table(title="environments")
    for column in ("environment", "restore", "user", "evaluation"):
        table.add_column(column)
    for row in env_rows():
        table.add_row(*row)
    console.print(table)


@app.command("check")
def check(
    config: Annotated[Path, typer.Option("--config", "-c", help="YAML with env, env_config, tasks (and user): an env "
                                                                "config or any generation config.")],
    tasks: Annotated[Optional[int], typer.Option("--tasks", "-n", min=1, help="Check only the first N tasks.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes at once in the second pass.")] = 4,
    with_user: Annotated[bool, typer.Option("--with-user", help="Answer messages with the config's user "
                                                                "(default: no user).")] = False,
    allow_shared_state: Annotated[bool, typer.Option(
        "--allow-shared-state", help="Check even where the server is handed files outside its {tmpdir} (the check "
                                     "replays writes: they change those files); warns instead of refusing.")] = False,
) -> None:
    """Replay each task's reference solution and a do-nothing agent; exit 1 unless the environment is healthy."""
    import tempfile

    from pydantic import ValidationError

    from envs.spec import EnvSpec
    from envs.users import UserConfig

    data = read_config_mapping(config)
    try:
        spec = EnvSpec.model_validate({k: data[k] for k in ("env", "env_config", "tasks", "user") if k in data})
    except ValidationError as exc:
        fail(f"{config}: " + "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors()))
    try:
        shared = _shared_state(spec)
    except ValueError as exc:  # a setting that cannot work (the environment's own one-line message)
        fail(f"{config}: {exc}")
    if shared and not allow_shared_state:
        fail(f"{config}: the check would change files outside trajforge's temp directories ({'; '.join(shared)}): "
             "copy them in with env_config.fixtures and point the server at {tmpdir} (docs/environments.md, "
             "Fixtures), or pass --allow-shared-state", code=2)
    if shared:
        err_console.print(f"[bold yellow]warning:[/] the check replays writes on files outside trajforge's temp "
                          f"directories: {'; '.join(shared)}", highlight=False)
    if spec.env_config.get("judge") == {}:
        # The judge role is a method's (its `judge:` model): the check grades no NL assertion (reported unchecked).
        spec = spec.model_copy(update={"env_config": {k: v for k, v in spec.env_config.items() if k != "judge"}})
    # Checking trains nothing: every split may be checked.
    task_source = spec.tasks.model_copy(update={"allow_test_split": True, **({"n": tasks} if tasks else {})})
    spec = spec.model_copy(update={"tasks": task_source, "user": spec.user if with_user else UserConfig(kind="none")})
    # What the world writes (screenshots, server logs) goes to a folder of the check's own: kept only when
    # something failed and it holds files, and then named.
    scratch = Path(tempfile.mkdtemp(prefix="trajforge-envs-check-"))
    report, error = None, None
    try:
        report = asyncio.run(_run(spec, data.get("llm"), concurrency, scratch, _max_steps(data)))
    except TaskFileError as exc:
        error = f"{exc} (tasks of {config})"
    except (EnvError, ValueError, KeyError) as exc:
        error = f"{config}: {exc}"
    finally:
        kept = _kept(scratch, failed=report is None or not report.healthy)
    if error is not None or report is None:
        fail((error or f"{config}: the check did not finish") + (f" (server logs: {kept})" if kept else ""))
    if as_json:
        typer.echo(json.dumps({**report.as_dict(), **({"files": str(kept)} if kept else {})}, indent=2))
    else:
        _print(report, kept)
    if not report.healthy:
        raise typer.Exit(1)


@app.command("tasks")
def tasks_cmd(
    config: Annotated[Path, typer.Option("--config", "-c", help="A rollout config (env, env_config, tasks, llm).")],
) -> None:
    """Print the config's tasks, one JSON object (id, instruction) a line."""
    from training.episodes import config_tasks

    data = read_config_mapping(config)
    try:
        rows = config_tasks(data)
    except TaskFileError as exc:
        fail(f"{exc} (tasks of {config})")
    except (EnvError, ValueError) as exc:
        fail(f"{config}: {exc}")
    if not rows:
        fail(f"{config}: the task source gave no tasks")
    for row in rows:
        typer.echo(json.dumps(row))


@app.command("episode")
def episode_cmd(
    config: Annotated[Path, typer.Option("--config", "-c", help="A rollout config (env, env_config, tasks, llm).")],
    task: Annotated[str, typer.Option("--task", help="The task id (`trajforge envs tasks`).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="A new dataset directory for the trajectory.")],
    sample: Annotated[int, typer.Option(min=0, help="The draw: sampling seed = the config's seed + this.")] = 0,
    base_url: Annotated[Optional[str], typer.Option(help="An OpenAI-compatible endpoint instead of the config's "
                                                         "model (its sampling settings are kept).")] = None,
    model: Annotated[str, typer.Option(help="The model name sent to --base-url.")] = "default",
    api_key_env: Annotated[Optional[str], typer.Option(help="The variable holding --base-url's key.")] = None,
) -> None:
    """Play one task once through the rollout method; print the environment's evaluation as JSON."""
    from training.episodes import play

    data = read_config_mapping(config)
    if output.exists() and any(output.iterdir()):
        fail(f"{output}: not empty; an episode writes a new dataset directory")
    endpoint = (base_url, model, api_key_env) if base_url else None
    try:
        result = asyncio.run(play(data, task, output, sample=sample, endpoint=endpoint))
    except TaskFileError as exc:
        fail(f"{exc} (tasks of {config})")
    except (EnvError, ValueError) as exc:
        fail(f"{config}: {exc}")
    typer.echo(json.dumps(result))


@app.command("serve")
def serve_cmd(
    config: Annotated[Path, typer.Option("--config", "-c", help="A rollout config (env, env_config, tasks, user, "
                                                                "max_steps; llm only where a user or judge needs it).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The dataset the episodes go to (new, or one this "
                                                                "command wrote for the same config).")],
    host: Annotated[str, typer.Option(help="The address to serve on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="The port to serve on.")] = 8000,
    max_sessions: Annotated[int, typer.Option(min=1, help="OpenEnv sessions at once.")] = 8,
    message_tool: Annotated[str, typer.Option(help="The tool through which the agent speaks to the user (or gives "
                                                   "its final answer).")] = "respond",
    openenv_python: Annotated[Optional[str], typer.Option(help="The OpenEnv venv's python (default: "
                                                               "$TRAJFORGE_OPENENV_PYTHON, else .venv-openenv/bin/python)")] = None,
) -> None:
    """Serve the config's world as an OpenEnv environment (reset / step / state, tool calls as MCP actions), each
    episode a trajectory in OUTPUT; until Ctrl-C or SIGTERM, then a summary."""
    from schemas.store import StoreError
    from training.openenv_serve import openenv_python as find_python
    from training.openenv_serve import serve

    data = read_config_mapping(config)
    try:
        python = find_python(openenv_python)
        counts = asyncio.run(serve(data, output, host=host, port=port, max_sessions=max_sessions, python=python,
                                   message_tool=message_tool, say=lambda line: err_console.print(line, highlight=False, markup=False)))
    except TaskFileError as exc:
        fail(f"{exc} (tasks of {config})")
    except StoreError as exc:
        fail(str(exc))
    except (EnvError, ValueError, OSError) as exc:
        fail(f"{config}: {exc}")
    episodes = counts.get("tasks", 0)
    console.print(f"served {episodes} episode(s): {counts.get('trajectories', 0)} trajectories "
                  f"({counts.get('successes', 0)} successful), {counts.get('quarantine', 0)} quarantined; "
                  f"dataset {output}", highlight=False)


def _kept(scratch: Path, failed: bool) -> Path | None:
    """The check's folder where it is worth keeping (a failure left files in it: server logs); else removed."""
    if failed and any(p.is_file() for p in scratch.rglob("*")):
        return scratch
    shutil.rmtree(scratch, ignore_errors=True)
    return None


def _shared_state(spec: Any) -> list[str]:
    """Files outside trajforge's temp directories the world is handed (where the environment can tell)."""
    from envs.registry import env_class

    finder = getattr(env_class(spec.env), "shared_paths", None)
    return finder(spec.env_config) if finder is not None else []


def _max_steps(data: dict[str, Any]) -> int | None:
    value = data.get("max_steps")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def _run(spec: EnvSpec, llm_config: Any, concurrency: int, scratch: Path, max_steps: int | None) -> CheckReport:
    from envs.check import check_env
    from envs.spec import EnvFactory, uses_method_model

    llm = None
    if llm_config is not None and uses_method_model(spec):
        from backends.registry import make_llm

        llm = make_llm(llm_config)
    factory = EnvFactory(spec, llm, output=scratch)
    factory.max_steps = max_steps
    try:
        task_list = factory.tasks()
        if not task_list:
            raise ValueError("the task source gave no tasks")
        with RichProgress(f"envs check {spec.env}", console=err_console) as progress:
            return await check_env(factory, task_list, concurrency=concurrency, progress=progress)
    finally:
        await factory.aclose()
        if llm is not None:
            await llm.aclose()




def _print(report: CheckReport, kept: Path | None) -> None:
    from rich.table import Table

    from envs.check import summary_rows

    table = Table(title=f"envs check {report.env}: {'healthy' if report.healthy else 'NOT healthy'}")
    table.add_column("what")
    table.add_column("value", justify="right")
    for what, value in summary_rows(report):
        table.add_row(what, value)
    console.print(table)
    # A reference call made and refused in both passes: the refusal says why (under its task's failure, if any).
    refused: dict[str, list[str]] = {e.task: [] for e in report.reference_errors}
    for error in report.reference_errors:
        refused[error.task].append(f"step {error.index} {error.tool} was refused: {error.error}")
    for result in report.results:
        if result.reference is False or result.env_error:
            console.print(f"[red]reference failed[/] {result.task}: {result.env_error or result.reference_reason}",
                          highlight=False)
            for line in refused.pop(result.task, []):
                console.print(f"  {line}", highlight=False)
    for task, lines in refused.items():
        for line in lines:
            console.print(f"[yellow]reference call[/] {task} {line}", highlight=False)
    for error in report.tool_errors:
        console.print(f"[red]tool error[/] {error.task} step {error.index} {error.tool}: {error.error}", highlight=False)
    passed = [r.task for r in report.results if r.do_nothing]
    if passed:
        console.print(f"do-nothing passed: {', '.join(passed)}", highlight=False)
    for problem in report.problems:
        console.print(f"[red]not healthy:[/] {problem}", highlight=False)
    if kept is not None:
        console.print(f"files of the check (server logs, screenshots): {kept}", highlight=False)
