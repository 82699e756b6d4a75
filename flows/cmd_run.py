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

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "pipeline_demo.yaml"


def _prefect_defaults(config: Path, output: Path | None = None) -> None:
    """Default Prefect settings; must run before prefect is imported."""
    home = None
    try:
        from flows.pipeline_config import load_pipeline_config

        home = load_pipeline_config(config, str(output) if output else None).root / "_prefect"
    except Exception:  # noqa: BLE001 - the flow reports a bad config properly
        home = Path.home() / ".trajforge" / "prefect"
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
) -> None:
    """Serve the pipeline flow on a schedule (a long-running process; Ctrl-C stops it)."""
    if (cron is None) == (interval is None):
        fail("give exactly one of --cron or --interval")
    config = _check(config)
    _prefect_defaults(config)
    from flows.pipeline import pipeline_flow

    kwargs: dict[str, Any] = {"cron": cron} if cron is not None else {"interval": interval}
    console.print(f"serving {name} ({'cron ' + cron if cron else f'every {interval}s'}) for {config}")
    pipeline_flow.serve(name=name, parameters={"config_path": str(config)}, **kwargs)
