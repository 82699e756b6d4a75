"""`trajforge agent-r CONFIG`: Agent-R's self-training rounds (search and splice with each round's model)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cmd_run import OutputOption, prefect_defaults
from flows.console import console, fail
from flows.run_summary import print_run_summary


def agent_r(config: Annotated[Path, typer.Argument(help="Agent-R config (YAML).")], output: OutputOption = None) -> None:
    """Run Agent-R's rounds: each generates with its round's model; a hook trains and serves the next one."""
    if not config.is_file():
        fail(f"{config}: no such config file")
    from flows.agent_r_config import load_agent_r_config

    try:
        cfg = load_agent_r_config(config, str(output) if output else None)
    except Exception as exc:  # noqa: BLE001 - one line for any unusable config
        fail(f"{config}: {exc}".replace("\n", "; "))
    prefect_defaults(cfg.root / "_prefect")
    from flows.agent_r import HookError, agent_r_flow

    try:
        result = agent_r_flow(str(config.resolve()), str(output) if output else None)
    except HookError as exc:
        fail(str(exc))
    for entry, res in zip(result["rounds"], result["results"]):
        console.rule(f"[bold]round {entry['round']}", align="left")
        print_run_summary(res)
    console.print(f"Agent-R: {len(result['rounds'])} round(s); summary in {result['output']}/agent_r.json",
                  highlight=False)
