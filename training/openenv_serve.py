"""`trajforge envs serve`: any environment config served as an OpenEnv environment server.

OpenEnv's server classes (PyPI `openenv` 0.10.0, `openenv.core`) run in a venv of their own: `openenv` needs
fastmcp 3, which pins the mcp SDK below 2, and trajforge's MCP worlds need SDK 2. So the command runs two
processes. This one holds the world (`DrivenWorld`: its tasks, its MCP servers or browser, the dataset the episodes
go to) and answers on a Unix socket; the OpenEnv server (integrations/openenv, `python -m trajforge_openenv` from
that venv, started under the guard MCP servers run under, so it never outlives this process) serves HTTP and
WebSocket sessions with `openenv.core`'s `HTTPEnvServer`, each session one connection to the socket: one
`DrivenSession`, its episodes isolated from the others', many at once.

The socket speaks JSON lines, one request and one answer at a time per connection:

    {"op": "info"}                                   -> {"ok": true, "tools": [...], "tasks": [...], "system_prompt"}
    {"op": "reset", "task"?, "index"?, "seed"?, "model"?} -> {"ok": true, "text", "done", "reward", "success", ...}
    {"op": "step", "tool", "arguments", "tokens"?}   -> the same
    {"op": "state"}                                  -> {"ok": true, "state": {...}}

A closed connection ends its episode (evaluated as it stands, recorded). Errors a caller made come back as
`{"ok": false, "error": "..."}`, one line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from envs.base import EnvError
from training.driven import CallerError, DrivenSession, DrivenWorld, Turn

REPO = Path(__file__).resolve().parents[1]
OPENENV_PACKAGE = REPO / "integrations" / "openenv"
# The guard's file, not its module: importing the envs.mcp package would load the MCP SDK.
GUARD = REPO / "envs" / "mcp" / "_guard.py"
DEFAULT_VENV = Path(".venv-openenv")
START_TIMEOUT_S = 60.0


def openenv_python(given: str | None) -> str:
    """The OpenEnv venv's interpreter: `given`, else $TRAJFORGE_OPENENV_PYTHON, else .venv-openenv (make openenv)."""
    for candidate in (given, os.environ.get("TRAJFORGE_OPENENV_PYTHON"), str(DEFAULT_VENV / "bin" / "python")):
        if candidate:
            path = Path(candidate).expanduser()
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
            if given or candidate == os.environ.get("TRAJFORGE_OPENENV_PYTHON"):
                raise ValueError(f"{candidate}: not an executable Python (the OpenEnv venv's: make openenv)")
    raise ValueError("OpenEnv's server runs from a venv of its own, and there is none at .venv-openenv: run "
                     "`make openenv`, or give --openenv-python")


async def answer(session: DrivenSession, world: DrivenWorld, request: dict[str, Any]) -> dict[str, Any]:
    """One request of a connection's session; a caller's mistake is an error answer, never an exception."""
    op = request.get("op")
    try:
        if op == "info":
            return {"ok": True, "tools": [t.model_dump(mode="json") for t in world.tools()],
                    "tasks": [{"id": t.id, "instruction": t.instruction} for t in world.tasks],
                    "system_prompt": world.system_prompt(), "env": world.config.env}
        if op == "reset":
            index = request.get("index")
            turn = await session.reset(task=request.get("task"), index=int(index) if index is not None else None,
                                       seed=request.get("seed"), model=request.get("model"))
            return {"ok": True, **turn.as_dict(), "system_prompt": world.system_prompt()}
        if op == "step":
            turn = await session.step(str(request.get("tool") or ""), request.get("arguments") or {},
                                      request.get("tokens"))
            return {"ok": True, **turn.as_dict()}
        if op == "state":
            return {"ok": True, "state": session.state()}
        return {"ok": False, "error": f"unknown op {op!r}"}
    except (CallerError, ValueError, TypeError) as exc:
        return {"ok": False, "error": str(exc)}


async def serve_socket(world: DrivenWorld, path: str) -> Any:
    """The Unix socket server: one `DrivenSession` per connection."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = world.session()
        try:
            while line := await reader.readline():
                try:
                    request = json.loads(line)
                except json.JSONDecodeError as exc:
                    reply = {"ok": False, "error": f"not JSON ({exc.msg})"}
                else:
                    reply = await answer(session, world, request if isinstance(request, dict) else {})
                writer.write(json.dumps(reply, default=str).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            await session.end()  # the caller left: its episode ends where it stands, recorded
            writer.close()

    return await asyncio.start_unix_server(connection, path=path, limit=64 * 1024 * 1024)


def launch_openenv(python: str, socket_path: str, host: str, port: int, max_sessions: int, log: Path) -> subprocess.Popen:
    """The OpenEnv server in its own process group under the guard (it dies with this process, even by SIGKILL)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(OPENENV_PACKAGE),
                                                                     os.environ.get("PYTHONPATH", "")]))}
    argv = [python, "-m", "trajforge_openenv", "--socket", socket_path, "--host", host, "--port", str(port),
            "--max-sessions", str(max_sessions)]
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-I", str(GUARD), str(os.getpid()), "--quiet", "--", *argv],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


async def wait_ready(host: str, port: int, child: subprocess.Popen, log: Path) -> None:
    """Until the OpenEnv server answers /health; its exit or a timeout is an error naming its log."""
    import aiohttp

    deadline = time.monotonic() + START_TIMEOUT_S
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if child.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                raise EnvError(f"the OpenEnv server exited with status {child.returncode}: {' | '.join(tail)} "
                               f"(log: {log})")
            try:
                async with http.get(f"http://{host}:{port}/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.2)
    raise EnvError(f"the OpenEnv server did not answer within {START_TIMEOUT_S:g}s (log: {log})")


async def serve(config: dict[str, Any], output: Path, *, host: str, port: int, max_sessions: int, python: str,
                say: Callable[[str], None], message_tool: str = "respond",
                stop: asyncio.Event | None = None) -> dict[str, Any]:
    """Serve `config`'s world over OpenEnv until SIGINT / SIGTERM (or `stop`); the dataset's counts."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    world = DrivenWorld(config, output, driver="openenv", message_tool=message_tool)
    child: subprocess.Popen | None = None
    scratch = tempfile.TemporaryDirectory(prefix="trajforge-serve-")
    try:
        await world.start()
        socket_path = os.path.join(scratch.name, "world.sock")
        seen = {"episodes": 0}

        def on_episode(turn: Turn) -> None:
            seen["episodes"] += 1
            info = turn.info
            outcome = f"reward {turn.reward:g}" if turn.reward is not None else f"failed: {info.get('error')}"
            say(f"episode {seen['episodes']}: {info.get('record') or info.get('task')}: {outcome} "
                f"({info.get('actions', 0)} actions, {info.get('stop_reason') or 'error'})")

        world.on_episode = on_episode
        server = await serve_socket(world, socket_path)
        log = output / "logs" / "openenv.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        child = launch_openenv(python, socket_path, host, port, max_sessions, log)
        await wait_ready(host, port, child, log)
        say(f"serving {world.config.env} ({len(world.tasks)} tasks) as an OpenEnv environment at http://{host}:{port} "
            f"(up to {max_sessions} sessions); episodes to {output}")
        while not stop.is_set():
            if child.poll() is not None:
                raise EnvError(f"the OpenEnv server exited with status {child.returncode} (log: {log})")
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.5)
            except asyncio.TimeoutError:
                pass
        server.close()
    finally:
        if child is not None and child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        counts = await world.close()
        scratch.cleanup()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return counts
