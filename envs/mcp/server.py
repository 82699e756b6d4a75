"""MCP server sessions, pooled and shared by every environment of a run that names the same server.

A `ServerSession` is one connection through the official SDK (one process for a stdio server).
It is owned by a task of its own: the SDK's transports are anyio task groups that must be exited
by the task that entered them, and environments are made, used and closed by many tasks. Calls
from any task go through the session; a closed connection or a call past its timeout marks the
session broken and raises `EnvError`, and the pool starts a new session for the next episode.

A `ServerPool` leases a session to each episode, from reset to evaluation, as the server's
isolation allows (`MCPConfig.isolation`): per-episode keys spread episodes over up to `sessions`
shared sessions; a reset tool gives each episode a session of its own for its duration; neither
gives each episode a fresh session, stopped after it. It restarts a session after `recycle_after`
episodes (servers that keep every episode's state in memory), and is shared through
`acquire_pool` / `release_pool`: the last environment to release it stops every server it started.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import weakref
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult
from mcp_types import Tool as MCPTool

from envs.base import EnvError
from envs.mcp.config import TMPDIR, ConfigError, MCPConfig, ServerConfig, expand_secrets

GUARD = Path(__file__).with_name("_guard.py")
STOP_TIMEOUT_S = 10.0  # the SDK's own shutdown is bounded (stdin close, 2 s, SIGTERM, 2 s, SIGKILL)


def resolve_command(word: str) -> str:
    """The executable for a command word: `python` is trajforge's own interpreter; a bare name is
    looked up on PATH, then beside that interpreter (console scripts of packages installed with it)."""
    if word in ("python", "python3"):
        return sys.executable
    if os.sep in word:
        return word
    found = shutil.which(word) or shutil.which(word, path=os.path.dirname(sys.executable))
    if found is None:
        raise EnvError(f"cannot start MCP server: command {word!r} not found on PATH or beside {sys.executable}")
    return found


_DEVNULL: list[Any] = []


def _errlog() -> Any:
    """Where a stdio server's stderr goes: ours, or nowhere when ours has no file descriptor (captured)."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):
        if not _DEVNULL:
            _DEVNULL.append(open(os.devnull, "w"))  # noqa: SIM115 - one for the process, like stderr itself
        return _DEVNULL[0]


class ServerSession:
    """One live connection to the server, owned by its own task."""

    def __init__(self, config: ServerConfig, *, start_timeout_s: float, number: int) -> None:
        self.config = config
        self.start_timeout_s = start_timeout_s
        self.number = number
        self.client: Client | None = None
        self.leases = 0  # episodes in flight on this session
        self.episodes = 0  # episodes it has served
        self.retiring = False
        self.broken: str | None = None
        self._stop = asyncio.Event()
        self._ready: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def label(self) -> str:
        return f"MCP server {self.config.describe()!r}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._task = asyncio.create_task(self._run(), name=f"mcp-session-{self.number}")
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), self.start_timeout_s)
        except asyncio.TimeoutError:
            await self.close()
            raise EnvError(f"{self.label} did not answer within {self.start_timeout_s:g} s of starting") from None
        except (EnvError, ConfigError):
            await self.close()
            raise
        except Exception as exc:  # the SDK's handshake or transport failed: say so in one line
            await self.close()
            raise EnvError(f"cannot start {self.label}: {type(exc).__name__}: {exc}") from None

    async def _run(self) -> None:
        assert self._ready is not None
        tmpdir: str | None = None
        try:
            async with AsyncExitStack() as stack:
                transport: Any
                if self.config.url is not None:
                    headers = expand_secrets(self.config.headers, "header")
                    http = await stack.enter_async_context(
                        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)))
                    transport = streamable_http_client(self.config.url, http_client=http)
                else:
                    argv, env, cwd = self.config.argv, expand_secrets(self.config.env, "env"), self.config.cwd
                    if any(TMPDIR in v for v in [*argv, *env.values(), cwd or ""]):
                        tmpdir = tempfile.mkdtemp(prefix="trajforge-mcp-")
                        argv = [a.replace(TMPDIR, tmpdir) for a in argv]
                        env = {k: v.replace(TMPDIR, tmpdir) for k, v in env.items()}
                        cwd = cwd.replace(TMPDIR, tmpdir) if cwd else None
                    command = [resolve_command(argv[0]), *argv[1:]]
                    # The guard ends the server (and its helpers) when this process dies, even by SIGKILL.
                    params = StdioServerParameters(command=sys.executable, env=env, cwd=cwd,
                                                   args=["-I", str(GUARD), str(os.getpid()), "--", *command])
                    transport = stdio_client(params, errlog=_errlog())
                self.client = await stack.enter_async_context(Client(transport))
                self._ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to whoever waits, never lost
            if not self._ready.done():
                self._ready.set_exception(exc if isinstance(exc, Exception) else EnvError(str(exc)))
            elif self.broken is None:
                self.broken = f"{self.label} connection failed: {type(exc).__name__}: {exc}"
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.client = None
            if self.broken is None and not self._stop.is_set():
                self.broken = f"{self.label} closed its connection"
            if tmpdir is not None:
                shutil.rmtree(tmpdir, ignore_errors=True)

    async def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> CallToolResult:
        """One tool call. EnvError when the server is gone or hangs; MCPError when it answered with an error."""
        client = self.client
        if self.broken is not None or client is None:
            raise EnvError(self.broken or f"{self.label} is not running")
        try:
            return await client.call_tool(name, arguments, read_timeout_seconds=timeout_s)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                self.broken = f"{self.label} did not answer {name} within {timeout_s:g} s"
            elif exc.code == CONNECTION_CLOSED:
                self.broken = f"{self.label} closed the connection during {name} (did it crash?)"
            else:
                raise
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
            self.broken = f"{self.label} connection failed during {name}: {type(exc).__name__}"
        raise EnvError(self.broken)

    async def list_tools(self) -> list[MCPTool]:
        client = self.client
        if client is None:
            raise EnvError(self.broken or f"{self.label} is not running")
        tools: list[MCPTool] = []
        cursor: str | None = None
        for _ in range(1000):  # a paginator that never ends cannot hang a start
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    async def close(self) -> None:
        self._stop.set()
        task, self._task = self._task, None
        if task is None:
            return
        if self._ready is not None and not self._ready.done():
            task.cancel()  # still starting: nothing to wind down gently
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT_S)
        except asyncio.TimeoutError:
            task.cancel()
        except BaseException:  # noqa: BLE001 - the failure was recorded as `broken`; closing goes on
            pass


class ServerPool:
    """The sessions of one server, shared by every environment that names it."""

    def __init__(self, config: MCPConfig) -> None:
        self.config = config
        self.sessions: list[ServerSession] = []
        self.tools: list[MCPTool] = []
        self.refs = 0
        self.started = 0  # sessions started so far (restarts included)
        self.key = pool_key(config)
        self._lock = asyncio.Lock()
        self._locks: dict[str, asyncio.Lock] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def lock(self, key: str) -> asyncio.Lock:
        """A lock per key, for work the pool's environments should do once (e.g. a task's reference run)."""
        return self._locks.setdefault(key, asyncio.Lock())

    async def _new_session(self) -> ServerSession:
        self.started += 1
        session = ServerSession(self.config.server, start_timeout_s=self.config.start_timeout_s, number=self.started)
        await session.start()
        self.sessions.append(session)
        return session

    async def open(self) -> None:
        """Start the first session and read the server's tools."""
        async with self._lock:
            if not self.sessions:
                session = await self._new_session()
                try:
                    self.tools = await session.list_tools()
                except (MCPError, EnvError) as exc:
                    raise EnvError(f"{session.label} could not list its tools: {exc}") from None

    async def lease(self) -> ServerSession:
        """A session for one episode: the least busy live one, or a new one while the pool has room."""
        async with self._lock:
            for dead in [s for s in self.sessions if s.broken is not None and s.leases == 0]:
                self._retire(dead)
            live = [s for s in self.sessions if s.broken is None and not s.retiring]
            isolation = self.config.isolation()
            if isolation == "reset":  # one episode at a time on a session
                live = [s for s in live if s.leases == 0]
            elif isolation == "restart":  # a fresh session for every episode
                live = [s for s in live if s.episodes == 0 and s.leases == 0]
            best = min(live, key=lambda s: s.leases, default=None)
            if best is None or (best.leases > 0 and len(live) < self.config.sessions):
                best = await self._new_session()
            best.leases += 1
            best.episodes += 1
            limit = 1 if isolation == "restart" else self.config.recycle_after
            if limit is not None and best.episodes >= limit:
                best.retiring = True
            return best

    def release(self, session: ServerSession) -> None:
        session.leases -= 1
        if session.leases == 0 and (session.retiring or session.broken is not None):
            self._retire(session)

    def _retire(self, session: ServerSession) -> None:
        """Stop a session in the background (a hung server takes seconds to stop; nobody waits on it)."""
        if session in self.sessions:
            self.sessions.remove(session)
            task = asyncio.create_task(session.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        sessions, self.sessions = self.sessions, []
        await asyncio.gather(*(s.close() for s in sessions), *list(self._closing), return_exceptions=True)


# ---- sharing ------------------------------------------------------------------------------------

_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, ServerPool]] = weakref.WeakKeyDictionary()


def pool_key(config: MCPConfig) -> str:
    return json.dumps(config.model_dump(mode="json", include={
        "server", "sessions", "recycle_after", "start_timeout_s", "stateless", "hidden_arguments", "reset_tool"}),
                      sort_keys=True)


async def acquire_pool(config: MCPConfig) -> ServerPool:
    """The pool of `config`'s server in this event loop, started on first use."""
    pools = _POOLS.setdefault(asyncio.get_running_loop(), {})
    key = pool_key(config)
    pool = pools.get(key)
    if pool is None:
        pool = pools[key] = ServerPool(config)
    pool.refs += 1
    try:
        await pool.open()
    except BaseException:
        await release_pool(pool)
        raise
    return pool


async def release_pool(pool: ServerPool) -> None:
    """Drop one reference; the last one stops every server of the pool."""
    pool.refs -= 1
    if pool.refs > 0:
        return
    pools = _POOLS.get(asyncio.get_running_loop(), {})
    if pools.get(pool.key) is pool:
        del pools[pool.key]
    await pool.close()
