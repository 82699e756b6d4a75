"""`trajforge run CONFIG`, `trajforge demo` and `trajforge serve CONFIG`: the Prefect pipeline flow from the command line.

Prefect is imported only inside the commands, after its settings have defaults: PREFECT_HOME
under the pipeline's output (`<output>/_prefect`), analytics off, a long ephemeral-server
startup timeout. Set PREFECT_API_URL to use a real Prefect server instead of the ephemeral one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.console import console, fail
from flows.run_summary import print_run_summary

REPO = Path(__file__).resolve().parents[1]  # the checkout a work pool's workers run the flow from
DEMO_CONFIG = REPO / "configs" / "pipeline_demo.yaml"


def _prefect_defaults(config: Path, output: Path | None = None) -> None:
    """Default Prefect settings for a pipeline config; must run before prefect is imported."""
    home = None
    try:
        from flows.pipeline_config import load_pipeline_config

        home = load_pipeline_config(config, str(output) if output else None).root / "_prefect"
    except Exception:  # noqa: BLE001 - the flow reports a bad config properly
        home = Path.home() / ".trajforge" / "prefect"
    prefect_defaults(home)


def prefect_defaults(home: Path) -> None:
    """PREFECT_HOME (unless set), analytics off, a long ephemeral-server start; before prefect is imported."""
    # Prefect's SQLite database cannot be created in a folder that does not exist yet.
    home = home.resolve()
    if "PREFECT_HOME" not in os.environ:
        home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(home))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def _check(config: Path) -> Path:
    if not config.is_file():
        fail(f"{config}: no such config file")
    from flows.config_file import ConfigFileError
    from flows.pipeline_config import load_pipeline_config
    from flows.preflight import check_generate_config
    from generators.runner import load_config

    try:
        cfg = load_pipeline_config(config)
    except ConfigFileError as exc:
        fail(str(exc))
    except Exception as exc:  # noqa: BLE001
        fail(f"{config}: {exc}".replace("\n", "; "))
    for path in cfg.decontaminate.references:
        if not Path(path).is_file():
            fail(f"{config}: decontaminate.references: {path}: no such file")
    for entry in cfg.generate:  # checked now: a stage would otherwise fail after the stages before it ran
        try:
            method_config = load_config(entry.method_config(cfg.llm))
        except (KeyError, ValueError):
            continue  # the flow reports a bad method config itself, as the stage that has it
        try:
            check_generate_config(method_config, f"{config} (generate {entry.name})")
        except ConfigFileError as exc:
            fail(str(exc))
    return config.resolve()


OutputOption = Annotated[Path | None, typer.Option("--output", "-o", help="Output root (replaces the config's).")]


def run(config: Annotated[Path, typer.Argument(help="Pipeline config (YAML).")], output: OutputOption = None) -> None:
    """Run the whole pipeline (convert, generate, filter, dedup, mix, export) as a Prefect flow."""
    config = _check(config)
    _prefect_defaults(config, output)
    from flows.pipeline import pipeline_flow

    print_run_summary(pipeline_flow(str(config), str(output) if output else None))


def demo(output: OutputOption = None) -> None:
    """The main job on the embedded model: `trajforge run configs/pipeline_demo.yaml` (run it from the repository)."""
    run(DEMO_CONFIG, output)


def serve(
    config: Annotated[Path, typer.Argument(help="Pipeline config (YAML).")],
    cron: Annotated[str | None, typer.Option(help="Cron schedule, e.g. '0 3 * * *'.")] = None,
    interval: Annotated[float | None, typer.Option(help="Run every N seconds.")] = None,
    name: Annotated[str, typer.Option(help="Deployment name.")] = "trajforge-pipeline",
    pool: Annotated[str | None, typer.Option(help="Deploy to this Prefect work pool (its workers run the flow "
                                                  "runs) instead of serving from this process.")] = None,
) -> None:
    """Serve the pipeline flow on a schedule (a long-running process; Ctrl-C stops it), or deploy it to a work pool."""
    if pool is None and (cron is None) == (interval is None):
        fail("give exactly one of --cron or --interval")
    if cron is not None and interval is not None:
        fail("give --cron or --interval, not both")
    config = _check(config)
    _prefect_defaults(config)
    from flows.pipeline import pipeline_flow

    schedule: dict[str, Any] = {"cron": cron} if cron is not None else {"interval": interval} if interval else {}
    when = f"cron {cron}" if cron else f"every {interval}s" if interval else "on demand"
    if pool is None:
        console.print(f"serving {name} ({when}) for {config}")
        pipeline_flow.serve(name=name, parameters={"config_path": str(config)}, **schedule)
        return
    deploy_to_pool(pool, name, config, schedule)
    console.print(f"deployed trajforge-pipeline/{name} ({when}) to work pool {pool!r} for {config}\n"
                  f"  workers:  prefect worker start --pool {pool}\n"
                  f"  a run:    prefect deployment run 'trajforge-pipeline/{name}' "
                  "[--param config_path=OTHER.yaml]", highlight=False)


def deploy_to_pool(pool: str, name: str, config: Path, schedule: dict[str, Any]) -> None:
    """Register the flow as a deployment of work pool `pool`; its workers run it from this checkout."""
    from flows.pipeline import pipeline_flow

    try:
        pipeline_flow.from_source(source=str(REPO), entrypoint="flows/pipeline.py:pipeline_flow").deploy(
            name=name, work_pool_name=pool, parameters={"config_path": str(config)}, build=False, push=False,
            print_next_steps=False, ignore_warnings=True, **schedule,
        )
    except ValueError as exc:
        if "Could not find work pool" not in str(exc):
            raise
        fail(f"no work pool {pool!r}; create it with: prefect work-pool create {pool} --type process")
