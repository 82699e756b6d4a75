"""A tau2 domain whose server sets each task up itself, as a new user would run it: PyPI `tau2-mock-mcp-eval`
(tau2-bench's mock domain, from a venv of its own) applies a task's initial_state (initialization data, actions,
the calls of its message history) when its reset tool names the task by its own id, and serves the user's tools
(notifications) under their plain names. Every task of the domain runs unedited through `trajforge envs check`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from envs.mcp.config import ConfigError, MCPConfig
from flows.cli import app
from tests.server_venvs import server_venv

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("scratch")  # a failing check's folder goes to the test's tmp_path
TASKS = "pkg://tau2_mock_mcp/data/tasks.json"


def mock_config(venv: Path, **env_config: Any) -> dict[str, Any]:
    return {"env": "mcp", "tasks": {"source": "tau2", "path": TASKS}, "env_config": {
        "server": {"command": ["tau2-mock-mcp"], "venv": str(venv), "handshake": "legacy",
                   "env": {"TAU2_MOCK_MCP_STATE_DIR": "{tmpdir}"}},
        "hidden_arguments": {"state_key": "trajforge/{episode}"},
        "exclude": ["get_call_log"], **env_config}}


def check(tmp_path: Path, config: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / "mock.yaml"
    path.write_text(yaml.safe_dump(config))
    result = runner.invoke(app, ["envs", "check", "--config", str(path), "--json"])
    return json.loads(result.stdout)


def test_every_task_runs_unedited_when_the_reset_tool_sets_it_up(tmp_path):
    venv = server_venv("tau2-mock")
    reset = {"name": "reset_state", "arguments": {"domain": "mock", "task_id": "{task_id}",
                                                  "state_key": "trajforge/{episode}"}}
    report = check(tmp_path, mock_config(venv, reset_tool={**reset, "initializes": True},
                                         user_tools=["check_notifications", "dismiss_notification"]))
    assert report["healthy"], report["problems"]
    # All ten, the tasks with initialization data, initialization actions, message history and a user-side
    # reference action among them; ids keep trajforge's prefix, the reset tool got the task's own id.
    assert report["tasks"] == 10 and report["reference"]["passed"] == report["reference"]["total"] == 10, report
    assert not report["env_errors"] and not report["tool_errors"]

    # As before: `{task}` (trajforge's id) names no task the server knows, and without `initializes` and the user's
    # tools named, the two tasks that set data and act on the user's side cannot run (8 of 10, each with its reason).
    report = check(tmp_path, mock_config(venv, reset_tool={**reset, "arguments": {**reset["arguments"],
                                                                                    "task_id": "{task}"}}))
    assert report["reference"]["passed"] == 8 and set(report["env_errors"]) == {
        "tau2-update_task_with_initialization_data", "tau2-update_task_with_user_tools"}
    assert "sets initialization_data, and the server has no tool" in \
        report["env_errors"]["tau2-update_task_with_initialization_data"]
    assert "has no user tools" in report["env_errors"]["tau2-update_task_with_user_tools"]


def test_settings_that_cannot_work_are_named_in_one_line():
    server = {"command": ["tau2-mock-mcp"]}
    reset = {"name": "reset_state", "initializes": True}
    with pytest.raises(ConfigError, match="initialization_tool would apply its initialization_data a second time"):
        MCPConfig.parse({"server": server, "reset_tool": reset, "initialization_tool": "apply"})
    with pytest.raises(ConfigError, match=r"\{task_id\} in the server's command/args"):
        MCPConfig.parse({"server": {**server, "args": ["--task", "{task_id}"]}})
