"""`trajforge improve CONFIG`: baseline eval, training data, training, eval again, report (one Prefect flow)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cmd_run import OutputOption, prefect_defaults
from flows.console import console, fail


def improve(config: Annotated[Path, typer.Argument(help="Improve config (YAML).")], output: OutputOption = None) -> None:
    """Measure a model on the test split, generate and export training data from the train split, train, measure
    again on the same tasks, and report the difference with its interval; resumable per stage."""
    if not config.is_file():
        fail(f"{config}: no such config file")
    from flows.config_file import ConfigFileError
    from flows.improve_config import load_improve_config

    try:
        cfg = load_improve_config(config, str(output) if output else None)
    except ConfigFileError as exc:
        fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - one line for any unusable config
        fail(f"{config}: {exc}".replace("\n", "; "))
    from envs.tasks import TaskFileError
    from flows.improve_checks import STATE_DIR, ImproveError, preflight

    try:  # before Prefect starts a server: a wrong output, base or task split is one line, at once
        preflight(cfg)
    except (ImproveError, TaskFileError) as exc:
        fail(str(exc))
    (cfg.root / STATE_DIR).mkdir(parents=True, exist_ok=True)  # marks the output as improve's own
    prefect_defaults(cfg.root / "_prefect")
    from flows.hooks import HookError
    from flows.improve import improve_flow
    from training.trainer import TrainError

    try:
        report = improve_flow(str(config.resolve()), str(output) if output else None)
    except (ImproveError, HookError, TrainError, TaskFileError) as exc:
        fail(str(exc))
    delta = report["comparison"]["delta"]
    if delta is not None:
        console.print(f"pass@1 {100 * (report['before']['pass@1'] or 0):.1f}% -> {100 * (report['after']['pass@1'] or 0):.1f}%"
                      f" ({100 * delta['mean']:+.1f} points, {int(100 * delta['level'])}% interval "
                      f"[{100 * delta['low']:+.1f}, {100 * delta['high']:+.1f}]) in {report['seconds']:.0f} s",
                      highlight=False)
    if len(report["rounds"]) > 1:
        for r in report["rounds"]:
            prev = r["vs_previous"]
            console.print(f"  round {r['round']}: pass@1 {100 * (r['pass@1'] or 0):.1f}%"
                          + ("" if prev is None else f" ({100 * prev['mean']:+.1f} points on the round before)")
                          + f", rows {sum(r['rows'].values())}", highlight=False)
