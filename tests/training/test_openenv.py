"""`trajforge envs serve`: a trajforge world served with OpenEnv's own server classes, driven by OpenEnv's own
clients (PyPI `openenv` 0.10.0, from its own venv: tests/server_venvs.py), on a PyPI MCP server (tau2-bench's mock
domain) and on a MiniWoB page in Chromium. Sessions run at once, each its own episode; rewards are the world's;
every episode is a trajectory (with the token ids its caller sent); SIGTERM leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from schemas.store import Dataset
from tests.conftest import REPO
from tests.server_venvs import server_venv

MOCK_CLIENT = r'''
import asyncio, json, sys
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

URL = sys.argv[1]

async def solves():
    async with GenericEnvClient(base_url=URL) as env:  # a raw action: its metadata carries the token ids
        opened = await env.reset(task="tau2-create_task_1", model="tiny")
        tools = [t["name"] for t in (await env.step({"type": "list_tools"})).observation["tools"]]
        made = await env.step({"type": "call_tool", "tool_name": "create_task",
                               "arguments": {"user_id": "user_1", "title": "Important Meeting"},
                               "metadata": {"prompt_ids": [1, 2, 3], "completion_ids": [7, 8], "logprobs": [-0.5, -1.0]}})
        end = await env.step({"type": "call_tool", "tool_name": "respond", "arguments": {"content": "Created."}})
        state = await env.state()
        return {"opening": opened.observation["text"], "tools": tools, "made": made.observation["result"],
                "made_done": made.done, "end": [end.done, end.reward], "state": state}

async def gives_up():
    async with MCPToolClient(base_url=URL) as env:
        await env.reset(task="tau2-create_task_1")
        listed = [t.name for t in await env.list_tools()]
        users = await env.call_tool("get_users")
        end = await env.step(CallToolAction(tool_name="respond", arguments={"content": "I cannot."}))
        unknown = await env.step(CallToolAction(tool_name="get_users", arguments={}))
        return {"listed": listed, "users": str(users)[:200], "end": [end.done, end.reward],
                "after_end": unknown.observation.result}

async def bad_task():
    async with GenericEnvClient(base_url=URL) as env:
        try:
            await env.reset(task="no-such-task")
        except Exception as exc:
            return str(exc)
        return "accepted"

async def main():
    solved, gave_up, refused = await asyncio.gather(solves(), gives_up(), bad_task())
    print(json.dumps({"solved": solved, "gave_up": gave_up, "refused": refused}, default=str))

asyncio.run(main())
'''

PAGE_CLIENT = r'''
import json, re, sys
from openenv.core.mcp_client import MCPToolClient

with MCPToolClient(base_url=sys.argv[1]).sync() as env:
    opened = env.reset()
    page = opened.observation.text
    label = re.search(r'Click on the "([^"]+)" button', page).group(1)
    bid = re.search(r"\[(\w+)\] button '" + re.escape(label) + "'", page).group(1)
    from openenv.core.env_server.mcp_types import CallToolAction
    clicked = env.step(CallToolAction(tool_name="click", arguments={"bid": bid}))
    print(json.dumps({"tools": [t.name for t in env.list_tools()], "done": clicked.done, "reward": clicked.reward,
                      "page": page[:300]}))
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_and_drive(tmp_path: Path, config: dict[str, Any], client: str) -> tuple[dict[str, Any], str, Path]:
    """Serve `config` with `trajforge envs serve`, run `client` (OpenEnv's clients) against it, stop it with
    SIGTERM; (the client's JSON, the command's output, the dataset)."""
    python = server_venv("openenv") / "bin" / "python"
    path, out, port = tmp_path / "world.yaml", tmp_path / "episodes", free_port()
    path.write_text(yaml.safe_dump(config))
    (tmp_path / "client.py").write_text(client)
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    serve = subprocess.Popen([sys.executable, "-m", "flows.cli", "envs", "serve", "--config", str(path), "--output",
                              str(out), "--port", str(port), "--openenv-python", str(python)], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and serve.poll() is None:
            if _ready(port):
                break
            time.sleep(0.5)
        assert serve.poll() is None, serve.communicate()[1][-3000:]
        helpers = psutil.Process(serve.pid).children(recursive=True)
        assert any("trajforge_openenv" in " ".join(p.cmdline()) for p in helpers)
        driven = subprocess.run([str(python), str(tmp_path / "client.py"), f"http://127.0.0.1:{port}"],
                                capture_output=True, text=True, timeout=180)
        assert driven.returncode == 0, driven.stderr[-3000:]
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
        stdout, stderr = serve.communicate(timeout=60)
    assert serve.returncode == 0, stderr[-3000:]
    assert not [p for p in helpers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # no orphan
    return json.loads(driven.stdout.strip().splitlines()[-1]), stdout + stderr, out


def _ready(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def test_openenv_clients_drive_a_pypi_mcp_server_in_concurrent_sessions(tmp_path):
    venv = server_venv("tau2-mock")
    config = {"env": "mcp", "user": {"kind": "none"}, "max_steps": 5, "env_config": {
        "server": {"command": ["tau2-mock-mcp"], "venv": str(venv), "handshake": "legacy",
                   "env": {"TAU2_MOCK_MCP_STATE_DIR": "{tmpdir}"}},
        "hidden_arguments": {"state_key": "trajforge/{episode}"}, "exclude": ["get_call_log"],
        "reset_tool": {"name": "reset_state", "arguments": {"task_id": "{task_id}", "state_key": "trajforge/{episode}"},
                       "initializes": True},
        "user_tools": ["check_notifications", "dismiss_notification"]},
        "tasks": {"source": "tau2", "path": "pkg://tau2_mock_mcp/data/tasks.json", "ids": ["tau2-create_task_1"]}}
    got, printed, out = serve_and_drive(tmp_path, config, MOCK_CLIENT)
    solved, gave_up = got["solved"], got["gave_up"]
    # reset gives the user's request and the tools (the user's own and the control tools hidden, `respond` last).
    assert "Important Meeting" in solved["opening"]
    assert solved["tools"] == gave_up["listed"] == ["get_users", "create_task", "update_task_status",
                                                    "transfer_to_human_agents", "respond"]
    # Each session its own episode at once: the world's own evaluation (tau2's criteria) rewards them apart.
    assert solved["made_done"] is False and "Important Meeting" in solved["made"]
    assert solved["end"] == [True, 1.0] and gave_up["end"] == [True, 0.0]
    assert solved["state"]["record"].startswith("rollout/tau2-create_task_1#") and solved["state"]["done"]
    assert gave_up["after_end"] == "Error: the episode is over"
    assert "is not one of the config's 1 tasks" in got["refused"]
    # Both episodes are trajectories; the caller's token ids are on the action that sent them.
    records = {r.reward: r for r in Dataset.open(out).iter_records()}
    assert sorted(records) == [0.0, 1.0]
    good = records[1.0]
    [tokens] = [s.usage.tokens for s in good.steps if s.usage is not None and s.usage.tokens is not None]
    assert (tokens.prompt_ids, tokens.completion_ids, tokens.logprobs) == ([1, 2, 3], [7, 8], [-0.5, -1.0])
    assert good.provenance.model == "openenv:tiny" and good.details["driver"]["kind"] == "openenv"
    assert [s.function for s in good.steps if s.kind == "api"] == ["create_task"]
    assert "served 2 episode(s): 2 trajectories (1 successful), 0 quarantined" in printed


def test_openenv_client_clicks_a_miniwob_page(tmp_path):
    config = {"env": "browser", "env_config": {"observe": ["axtree"], "actions": ["click"]}, "max_steps": 2,
              "tasks": {"source": "miniwob", "options": {"tasks": ["click-button"], "seeds": 1}}}
    got, printed, out = serve_and_drive(tmp_path, config, PAGE_CLIENT)
    assert got["tools"] == ["click", "respond"] and "URL: http://miniwob.localhost/" in got["page"]
    assert got["done"] is True and got["reward"] == 1.0  # the page's own reward
    [record] = list(Dataset.open(out).iter_records())
    assert record.reward == 1.0 and record.id == "rollout/miniwob/click-button/0#0"
    assert "episode 1: rollout/miniwob/click-button/0#0: reward 1 (1 actions, done)" in printed


def test_serve_refuses_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app
    from tests.cli_errors import one_error_line

    config = tmp_path / "world.yaml"
    config.write_text(yaml.safe_dump({"env": "retail", "tasks": {"source": "env", "n": 1}}))
    run = CliRunner().invoke(app, ["envs", "serve", "--config", str(config), "--output", str(tmp_path / "o"),
                                   "--openenv-python", str(tmp_path / "no-python")])
    one_error_line(run, "not an executable Python", "make openenv")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    run = CliRunner().invoke(app, ["envs", "serve", "--config", str(config), "--output", str(foreign),
                                   "--openenv-python", sys.executable])
    one_error_line(run, str(foreign))
    assert (foreign / "notes.txt").read_text() == "mine" and sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
