"""MCP server sessions, pooled and shared by every environment of a run that names the same server.

A `ServerSession` is one connection through the official SDK (one process for a stdio server).
It is owned by a task of its own: the SDK's transports are anyio task groups that must be exited
by the task that entered them, and environments are made, used and closed by many tasks. Calls
from any task go through the session; a closed connection or a call past its timeout marks the
session broken and raises `EnvError`, and the pool starts a new session for the next episode.
Every wait is bounded: the start and handshake and `list_tools` by `start_timeout_s`, a call by
`call_timeout_s`, closing by the SDK's own bounded shutdown.

A stdio server runs under the guard (`_guard.py`), from its own environment where the config
names one (`venv`, `path`), in a private `{tmpdir}` that holds its fixtures. Its stderr goes to a
log file of its own (`<output>/logs/mcp/` of the run, else a folder under the system's temp dir): a
server that fails to start is reported in one line with its exit status and the last lines of
that log. The first session of a pool learns whether the server speaks the 2026 `server/discover`
handshake or only the SDK 1.x `initialize` one; later sessions go straight to the one it speaks.

A `ServerPool` leases a session to each episode, from reset to evaluation, as the server's
isolation allows (`MCPConfig.isolation`): per-episode keys spread episodes over up to `sessions`
shared sessions; a reset tool gives each episode a session of its own for its duration; neither
gives each episode a fresh session, stopped after it. It restarts a session after `recycle_after`
episodes (servers that keep every episode's state in memory), and is shared through
`acquire_pool` / `release_pool`: the last environment to release it stops every server it started.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
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
from envs.mcp._guard import EXIT_MARK
from envs.mcp.config import (EPISODE, TMPDIR, ConfigError, FixturesConfig, MCPConfig, ServerConfig, expand_secrets,
                             safe_name)

GUARD = Path(__file__).with_name("_guard.py")
STOP_TIMEOUT_S = 10.0  # the SDK's own shutdown is bounded (stdin close, 2 s, SIGTERM, 2 s, SIGKILL)
EXIT_WAIT_S = 2.0  # after a failed start: how long the guard may take to write the server's exit status
TAIL_LINES = 5  # stderr lines quoted when a server fails to start
TAIL_CHARS = 600


def resolve_command(word: str, search: list[str] | None = None) -> str:
    """The executable for a command word: `python` is the interpreter of the server's venv, else
    trajforge's own; a bare name is looked up in `search` (the server's venv and path), then on PATH,
    then beside trajforge's interpreter (console scripts of packages installed with it)."""
    search = search or []
    if word in ("python", "python3"):
        for folder in search:
            found = shutil.which(word, path=folder)
            if found:
                return found
        return sys.executable
    if os.sep in word:
        return os.path.expanduser(word)
    found = ((shutil.which(word, path=os.pathsep.join(search)) if search else None) or shutil.which(word)
             or shutil.which(word, path=os.path.dirname(sys.executable)))
    if found is None:
        where = ", ".join([*search, "PATH"]) if search else "PATH"
        raise EnvError(f"cannot start MCP server: command {word!r} not found in {where} or beside {sys.executable}")
    return found


def default_log_dir() -> Path:
    """Where server logs go when the run has no output directory: one folder per trajforge process."""
    global _LOG_DIR
    if _LOG_DIR is None:
        _LOG_DIR = Path(tempfile.mkdtemp(prefix=f"trajforge-mcp-logs-{time.strftime('%Y%m%d-%H%M%S')}-"))
    return _LOG_DIR


_LOG_DIR: Path | None = None
_LOG_NUMBERS = itertools.count(1)  # log files of one process never share a name, whichever pool


def _tail(path: Path | None, lines: int = TAIL_LINES) -> tuple[str, int | None]:
    """The last lines of a server's log (without the guard's exit line), and the exit status it wrote."""
    if path is None:
        return "", None
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return "", None
    status = None
    kept = []
    for line in text.splitlines():
        if line.startswith(EXIT_MARK):
            digits = line[len(EXIT_MARK):].split()[0] if line[len(EXIT_MARK):].split() else ""
            status = int(digits) if digits.isdigit() else None
        elif line.strip():
            kept.append(line.strip())
    quoted = " | ".join(kept[-lines:])
    return (quoted[-TAIL_CHARS:] if len(quoted) > TAIL_CHARS else quoted), status


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups: what a one-line message should name."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _copy(source: str, dest: Path) -> None:
    """Copy a fixture (file or directory, symlinks as links) to `dest`, replacing what is there."""
    src = Path(os.path.expanduser(source))
    if not src.exists():
        raise ConfigError(f"mcp env_config: fixtures: {source} does not exist")
    if dest.is_dir() and not dest.is_symlink():
        shutil.rmtree(dest)
    elif dest.exists() or dest.is_symlink():
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dest, symlinks=True)
    else:
        shutil.copy2(src, dest)


class ServerSession:
    """One live connection to the server, owned by its own task."""

    def __init__(self, config: ServerConfig, *, start_timeout_s: float, number: int,
                 fixtures: FixturesConfig | None = None, log_dir: Path | None = None,
                 handshake: str | None = None) -> None:
        self.config = config
        self.start_timeout_s = start_timeout_s
        self.number = number
        self.fixtures = fixtures
        self.log_dir = log_dir
        self.handshake = handshake or config.handshake
        self.client: Client | None = None
        self.tmpdir: str | None = None  # the server process's private directory ({tmpdir})
        self.log_path: Path | None = None
        self.legacy = False  # the server answered the initialize handshake (an SDK 1.x era server)
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
        self._ready = ready = loop.create_future()
        # Whoever stops waiting (a timeout) must not leave the failure unretrieved ("never retrieved").
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._task = asyncio.create_task(self._run(), name=f"mcp-session-{self.number}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.start_timeout_s)
        except asyncio.TimeoutError:
            await self.close()
            raise EnvError(await self._start_failure(f"did not answer within {self.start_timeout_s:g} s of starting",
                                                     exited=False)) from None
        except (EnvError, ConfigError):
            await self.close()
            raise
        except Exception as exc:  # the SDK's handshake or transport failed (often: the server exited)
            await self.close()
            leaf = _leaf(exc)
            raise EnvError(await self._start_failure(f"{type(leaf).__name__}: {leaf}", exited=True)) from None

    async def _start_failure(self, what: str, *, exited: bool) -> str:
        """One line: the server, its exit status, the last lines of its stderr, where its log is."""
        tail, status = _tail(self.log_path)
        deadline = time.monotonic() + (EXIT_WAIT_S if exited and self.log_path is not None else 0)
        while status is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            tail, status = _tail(self.log_path)
        head = f"it exited with status {status}" if status is not None else what
        line = f"cannot start {self.label}: {head}"
        if tail:
            line += f"; its stderr ends: {tail}"
        if self.log_path is not None:
            line += f" (log: {self.log_path})"
        return line

    async def _run(self) -> None:
        assert self._ready is not None
        log = None
        try:
            async with AsyncExitStack() as stack:
                transport: Any
                if self.config.url is not None:
                    headers = expand_secrets(self.config.headers, "header")
                    http = await stack.enter_async_context(
                        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)))
                    transport = streamable_http_client(self.config.url, http_client=http)
                else:
                    env = expand_secrets(self.config.env, "env")
                    self.tmpdir = tmpdir = tempfile.mkdtemp(prefix="trajforge-mcp-")
                    if self.fixtures is not None:
                        await asyncio.to_thread(self._copy_fixtures, self.fixtures.per_process(), "")
                    argv = [a.replace(TMPDIR, tmpdir) for a in self.config.argv]
                    env = {k: v.replace(TMPDIR, tmpdir) for k, v in env.items()}
                    cwd = self.config.cwd.replace(TMPDIR, tmpdir) if self.config.cwd else None
                    search = self.config.search_path()
                    command = [resolve_command(argv[0], search), *argv[1:]]
                    if search:
                        env.setdefault("PATH", os.pathsep.join([*search, os.environ.get("PATH", os.defpath)]))
                    if self.config.venv:
                        env.setdefault("VIRTUAL_ENV", os.path.expanduser(self.config.venv))
                    log_dir = self.log_dir or default_log_dir()
                    log_dir.mkdir(parents=True, exist_ok=True)
                    self.log_path = log_dir / f"{self.config.short_name}-{os.getpid()}-{next(_LOG_NUMBERS)}.log"
                    log = self.log_path.open("a", encoding="utf-8")
                    # The guard ends the server (and its helpers) when this process dies, even by SIGKILL.
                    params = StdioServerParameters(command=sys.executable, env=env, cwd=cwd,
                                                   args=["-I", str(GUARD), str(os.getpid()), "--", *command])
                    transport = stdio_client(params, errlog=log)
                client = Client(transport, mode="legacy" if self.handshake == "legacy" else "auto",
                                read_timeout_seconds=self.start_timeout_s)
                self.client = await stack.enter_async_context(client)
                self.legacy = client.session.initialize_result is not None
                self._ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to whoever waits, never lost
            if not self._ready.done():
                self._ready.set_exception(exc if isinstance(exc, Exception) else EnvError(str(exc)))
            elif self.broken is None:
                leaf = _leaf(exc)
                self.broken = f"{self.label} connection failed: {type(leaf).__name__}: {leaf}"
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.client = None
            if self.broken is None and not self._stop.is_set():
                self.broken = f"{self.label} closed its connection"
            if log is not None:
                log.close()
            if self.tmpdir is not None:
                shutil.rmtree(self.tmpdir, ignore_errors=True)

    # ---- fixtures -------------------------------------------------------------------------------

    def _copy_fixtures(self, files: dict[str, str], episode: str) -> None:
        assert self.tmpdir is not None
        for dest, source in files.items():
            _copy(source, Path(self.tmpdir) / dest.replace(EPISODE, safe_name(episode)))

    async def stage_episode(self, episode: str) -> None:
        """Copy the fixtures of an episode into this server's {tmpdir} (and, with reset: episode, the
        process's fixtures afresh)."""
        if self.fixtures is None or self.tmpdir is None:
            return
        files = self.fixtures.per_episode()
        if self.fixtures.reset == "episode":
            files = {**self.fixtures.per_process(), **files}
        if files:
            await asyncio.to_thread(self._copy_fixtures, files, episode)

    def drop_episode(self, episode: str) -> None:
        """Remove an episode's own fixture copies (the top folder of each destination that names it)."""
        if self.fixtures is None or self.tmpdir is None:
            return
        for dest in self.fixtures.per_episode():
            parts = dest.split("/")
            top = next(i for i, p in enumerate(parts) if EPISODE in p)
            target = Path(self.tmpdir, *parts[:top + 1]).as_posix().replace(EPISODE, safe_name(episode))
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target, ignore_errors=True)
            elif os.path.lexists(target):
                os.unlink(target)

    # ---- calls ----------------------------------------------------------------------------------

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

    async def list_tools(self, timeout_s: float | None = None) -> list[MCPTool]:
        """Every page of the server's tools, all within `timeout_s` (default: the start timeout)."""
        client = self.client
        if client is None:
            raise EnvError(self.broken or f"{self.label} is not running")
        timeout_s = timeout_s or self.start_timeout_s
        tools: list[MCPTool] = []
        cursor: str | None = None
        try:
            async with asyncio.timeout(timeout_s):
                for _ in range(1000):  # a paginator that never ends cannot hang a start
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if cursor is None:
                        break
        except (TimeoutError, asyncio.TimeoutError):
            self.broken = f"{self.label} did not answer list_tools within {timeout_s:g} s"
            raise EnvError(self.broken) from None
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                self.broken = f"{self.label} did not answer list_tools within {timeout_s:g} s"
                raise EnvError(self.broken) from None
            raise
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

    def __init__(self, config: MCPConfig, log_dir: Path | None = None) -> None:
        self.config = config
        self.log_dir = log_dir
        self.handshake: str | None = None  # what the first session found: later ones skip the discover probe
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
        session = ServerSession(self.config.server, start_timeout_s=self.config.start_timeout_s, number=self.started,
                                fixtures=self.config.fixtures, log_dir=self.log_dir, handshake=self.handshake)
        await session.start()
        if self.handshake is None:
            self.handshake = "legacy" if session.legacy else self.config.server.handshake
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
                    self.sessions.remove(session)
                    await session.close()
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
        "server", "sessions", "recycle_after", "start_timeout_s", "stateless", "hidden_arguments", "reset_tool",
        "fixtures"}),
                      sort_keys=True)


async def acquire_pool(config: MCPConfig, log_dir: Path | None = None) -> ServerPool:
    """The pool of `config`'s server in this event loop, started on first use (server logs in `log_dir`)."""
    pools = _POOLS.setdefault(asyncio.get_running_loop(), {})
    key = pool_key(config)
    pool = pools.get(key)
    if pool is None:
        pool = pools[key] = ServerPool(config, log_dir)
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
