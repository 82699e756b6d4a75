"""The settings of an MCP environment (`env_config` of `env: mcp`), validated with one-line errors.

    server: {command: [my-mcp-server], args: [], env: {STATE_DIR: "{tmpdir}"}}     # stdio
    server: {url: "http://127.0.0.1:8000/mcp", headers: {Authorization: "Bearer ${API_TOKEN}"}}
    server: {command: [mcp-server-sqlite, --db-path, "{tmpdir}/shop.db"], venv: ~/.venvs/sqlite}  # its own venv
    fixtures: {files: {shop.db: data/shop.db}, reset: process}   # copied into {tmpdir} before the server starts
    include / exclude: [tool names]          # which of the server's tools the agent sees
    hidden_arguments: {state_key: "trajforge/{episode}"}
    reset_tool: {name: reset_state, arguments: {state_key: "trajforge/{episode}"}}
    reset_tool: {name: reset_state, arguments: {task_id: "{task_id}"}, initializes: true}   # sets up the task itself
    state_digest: {name: db_hash, arguments: {...}, result_path: hash}     # a tool of the server, or
    state_digest: {command: [git, -C, "{tmpdir}/{episode}/repo", log, --format=%T]}   # a command, or
    state_digest: {sql: "SELECT * FROM orders ORDER BY id", database: "{tmpdir}/shop.db"}  # a query
    policy: policy.md | pkg://package/policy.md | the text itself
    result_path: message.content             # the observation inside a structured result
    write_tools / read_only_tools: [...]     # which calls change state (also MCP readOnlyHint)
    terminal_tools: [hand_over_to_a_person]  # a successful call ends the episode

Isolation: with `{episode}` in a hidden argument every episode has its own state on a shared
server session; with only a `reset_tool`, a session serves one episode at a time; with neither,
each episode gets a fresh server session (process) of its own, unless the server is declared
`stateless`.

Placeholders: `{tmpdir}` is a private directory made for each server process (stdio) and removed
when it stops (state files of different runs and processes never collide, and none are left
behind): it expands in the server's `args`, `env` and `cwd`, in hidden arguments, reset and digest
settings. `{episode}` is the environment's episode key, `{task}` the task id and `{task_id}` the
task's own id in its source (tau2's `id`, before trajforge's prefix), in hidden arguments, reset and
digest settings and fixture destinations; in a path (a value holding
`{tmpdir}`, a fixture destination) `{episode}` is the key made safe for a file name. `${NAME}` in
the server's `env` and `headers` is read from trajforge's own environment when the server starts,
so secrets stay out of configs, logs and records.

Fixtures: `fixtures.files` maps a destination inside `{tmpdir}` to a file or directory that is
copied there (the source is never opened for writing). Destinations without `{episode}` are copied
when the server process starts (`reset: episode`: again before every episode, for servers that
serve one episode at a time); destinations with `{episode}` are copied before each episode and
removed after it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from envs.tasks import Interpreter, TaskFileError, resolve_path

_SECRET = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
TMPDIR = "{tmpdir}"
EPISODE = "{episode}"
TASK_ID = "{task_id}"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
Isolation = Literal["key", "reset", "restart", "none"]


class ConfigError(ValueError):
    """An MCP environment setting that cannot work; the message names the key."""


class ServerConfig(BaseModel):
    """How to reach the server: a command to run (stdio) or a URL (streamable HTTP)."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] | str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    # A server with dependencies of its own (another mcp SDK, say) runs from its own environment:
    # `venv`'s bin/ is searched first for the command (`python` is its interpreter) and put first on
    # the server's PATH; `path` adds directories the same way (launchers such as uvx or npx).
    venv: str | None = None
    path: list[str] = Field(default_factory=list)
    # auto: ask `server/discover`, fall back to `initialize` (remembered for the pool's later sessions);
    # legacy: `initialize` at once (servers on the 1.x SDK).
    handshake: Literal["auto", "legacy"] = "auto"
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> ServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a stdio server) or url (a streamable HTTP server)")
        if self.command is not None and not self.argv:
            raise ValueError("command is empty")
        if self.url is not None and (self.args or self.env or self.cwd or self.venv or self.path):
            raise ValueError("args, env, cwd, venv and path are for stdio servers (command), not url")
        for where, value in (("command/args", " ".join(self.argv)), ("env", json.dumps(self.env)),
                             ("cwd", self.cwd or "")):
            for word in (EPISODE, "{task}", TASK_ID):
                if word in value:
                    raise ValueError(f"{word} in the server's {where}: a server process serves many episodes; "
                                     f"put {word} in hidden_arguments, reset or digest settings, or fixture paths")
        return self

    @property
    def argv(self) -> list[str]:
        command = [self.command] if isinstance(self.command, str) else list(self.command or [])
        return command + list(self.args)

    def search_path(self) -> list[str]:
        """Directories searched first for the command and put first on the server's PATH."""
        dirs = [os.path.expanduser(d) for d in self.path]
        if self.venv:
            venv = os.path.expanduser(self.venv)
            dirs.insert(0, os.path.join(venv, "Scripts" if os.name == "nt" else "bin"))
        return dirs

    def describe(self) -> str:
        """The server for messages: its URL without credentials, or its command line."""
        if self.url:
            parts = urlsplit(self.url)
            return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        return " ".join(self.argv)

    @property
    def short_name(self) -> str:
        """A name for files about the server (its log): the command's base name, or the URL's host."""
        word = os.path.basename(self.argv[0]) if self.command is not None else urlsplit(self.url or "").hostname
        return _UNSAFE.sub("_", word or "server")[:60]

    def interpreter(self) -> Interpreter | None:
        """The Python the server runs with where it is not trajforge's (its venv's, the interpreter its command
        names, or the one beside its console script), with the server's environment: `pkg://` paths resolve there."""
        if self.command is None:
            return None
        from mcp.client.stdio import get_default_environment

        from envs.base import EnvError
        from envs.mcp.server import resolve_command

        search = self.search_path()
        try:
            program = Path(resolve_command(self.argv[0], search))
        except EnvError:
            return None
        looks_like_python = re.fullmatch(r"python[0-9.]*", program.name) is not None
        candidates = [Path(search[0]) / "python"] if self.venv else []  # search[0]: the venv's bin/
        candidates.append(program if looks_like_python else program.parent / "python")
        python = next((p for p in candidates if p.is_file() and os.access(p, os.X_OK)), None)
        if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
            return None
        # The server's own variables (those without secrets or {tmpdir}: neither is known before it starts).
        env = {**get_default_environment(), **{k: v for k, v in self.env.items() if TMPDIR not in v
                                               and not _SECRET.search(v)}}
        if search:
            env.setdefault("PATH", os.pathsep.join([*search, os.environ.get("PATH", os.defpath)]))
        if self.venv:
            env.setdefault("VIRTUAL_ENV", os.path.expanduser(self.venv))
        return Interpreter(str(python), tuple(sorted(env.items())))


class ToolCallConfig(BaseModel):
    """A tool the environment itself calls (reset, state digest), with its arguments."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    result_path: str | None = Field(None, description="where the value sits in a structured result")
    initializes: bool = Field(False, description=(
        "a reset tool only: the call sets up the task itself (tau2's initial_state: initialization data, "
        "initialization actions, the calls of the message history), so trajforge applies none of it"))


class DigestConfig(BaseModel):
    """The state digest for the DB criterion, computed outside the agent's tools by one of:

    a tool of the server (`name`, `arguments`, `result_path`); a command run beside the server
    (`command`, its standard output is the digest); a SQL query over an SQLite file (`sql`,
    `database`: every row, in order, is the digest; the file is opened read-only).
    """

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    result_path: str | None = None
    command: list[str] | None = Field(None, min_length=1)
    sql: str | None = Field(None, min_length=1)
    database: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> DigestConfig:
        kinds = [k for k in ("name", "command", "sql") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("give one of name (a tool of the server), command, or sql (with database)")
        if self.sql is not None and not self.database:
            raise ValueError("sql needs database (an SQLite file, e.g. \"{tmpdir}/shop.db\")")
        if self.database is not None and self.sql is None:
            raise ValueError("database is for sql")
        if self.name is None and (self.arguments or self.result_path):
            raise ValueError("arguments and result_path are for a tool digest (name)")
        return self

    @property
    def tool(self) -> ToolCallConfig | None:
        if self.name is None:
            return None
        return ToolCallConfig(name=self.name, arguments=self.arguments, result_path=self.result_path)


class FixturesConfig(BaseModel):
    """Files and directories copied into the server's `{tmpdir}` (see the module doc)."""

    model_config = ConfigDict(extra="forbid")

    files: dict[str, str] = Field(min_length=1, description="destination inside {tmpdir} -> source path")
    reset: Literal["process", "episode"] = "process"

    @field_validator("files")
    @classmethod
    def _inside_tmpdir(cls, files: dict[str, str]) -> dict[str, str]:
        for dest in files:
            inner = dest.removeprefix(TMPDIR).lstrip("/")
            parts = inner.replace(EPISODE, "e").split("/")
            if not inner or os.path.isabs(inner) or ".." in parts or TMPDIR in inner:
                raise ValueError(f"{dest!r}: a destination is a relative path inside {{tmpdir}} (e.g. shop.db)")
        return {dest.removeprefix(TMPDIR).lstrip("/"): src for dest, src in files.items()}

    def per_episode(self) -> dict[str, str]:
        return {d: s for d, s in self.files.items() if EPISODE in d}

    def per_process(self) -> dict[str, str]:
        return {d: s for d, s in self.files.items() if EPISODE not in d}


class MCPConfig(BaseModel):
    """Everything `env_config` may say about an MCP environment."""

    model_config = ConfigDict(extra="forbid")

    server: ServerConfig
    include: list[str] | None = None
    exclude: list[str] = Field(default_factory=list)
    hidden_arguments: dict[str, Any] = Field(default_factory=dict)
    reset_tool: ToolCallConfig | None = None
    state_digest: DigestConfig | None = None
    fixtures: FixturesConfig | None = None
    policy: str | None = None
    result_path: str | None = None
    write_tools: list[str] | None = None
    read_only_tools: list[str] = Field(default_factory=list)
    terminal_tools: list[str] = Field(default_factory=list)
    user_tool_prefix: str | None = Field(None, min_length=1, description=(
        "server tools named <prefix><name> are the simulated user's (tau2's user tools, dual control): never "
        "listed to the agent; tau2's user-side set-up calls, reference actions and env assertions call them"))
    user_tools: list[str] = Field(default_factory=list, description=(
        "server tools that are the simulated user's under their plain names (as user_tool_prefix, named one by one)"))
    initialization_tool: str | None = Field(None, description=(
        "the server tool that applies tau2's initialization_data (called with agent_data and user_data)"))
    stateless: bool = Field(False, description="the server keeps no state: episodes may share sessions freely")
    sessions: int = Field(1, ge=1, description="server sessions (processes) episodes are spread over")
    recycle_after: int | None = Field(None, ge=1, description="restart a server session after this many episodes")
    call_timeout_s: float = Field(60.0, gt=0)
    start_timeout_s: float = Field(60.0, gt=0)

    @field_validator("result_path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is not None and not all(value.split(".")):
            raise ValueError(f"{value!r} is not a dotted path (e.g. message.content)")
        return value

    @model_validator(mode="after")
    def _placeholders_fit(self) -> MCPConfig:
        if self.server.url is not None:
            for key in ("hidden_arguments", "reset_tool", "state_digest"):
                if TMPDIR in json.dumps(self.model_dump(mode="json")[key]):
                    raise ValueError(f"{key}: {{tmpdir}} is the directory of a server process trajforge runs "
                                     "(stdio); an HTTP server has none")
            if self.fixtures is not None or (self.state_digest is not None and self.state_digest.name is None):
                raise ValueError("fixtures and command or sql digests are for stdio servers (command), not url")
        if self.reset_tool is not None and self.reset_tool.initializes and self.initialization_tool is not None:
            raise ValueError("reset_tool: initializes says the reset tool sets up the task; initialization_tool "
                             "would apply its initialization_data a second time: give one of them")
        if self.fixtures is not None and self.fixtures.reset == "episode" and self.isolation() in ("key", "none"):
            raise ValueError("fixtures: reset: episode copies into the server's {tmpdir} before every episode, but "
                             "episodes share a server session at once here: put {episode} in the destination instead")
        return self

    @classmethod
    def parse(cls, data: dict[str, Any]) -> MCPConfig:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "env_config"
            raise ConfigError(f"mcp env_config: {where}: {first['msg']}") from None

    def isolation(self) -> Isolation:
        """How episodes are kept apart on the server.

        `key`: every call carries a per-episode key (`{episode}` in a hidden argument), so episodes
        share sessions, at once; `reset`: a session serves one episode at a time and the reset tool
        starts each afresh; `restart`: each episode gets a server session of its own, stopped after
        it; `none`: the server is declared stateless.
        """
        if "{episode}" in json.dumps(self.hidden_arguments):
            return "key"
        if self.reset_tool is not None:
            return "reset"
        return "none" if self.stateless else "restart"

    def control_tools(self) -> set[str]:
        """Tools the environment calls itself; never shown to the agent."""
        digest = self.state_digest.tool if self.state_digest is not None else None
        return {c.name for c in (self.reset_tool, digest) if c is not None}


# ---- placeholders -------------------------------------------------------------------------------


def safe_name(key: str) -> str:
    """An episode key as one file name: every run of characters outside [A-Za-z0-9._-] becomes `_`."""
    return _UNSAFE.sub("_", key).strip(".") or "_"


def bind(value: Any, *, episode: str, task: str, tmpdir: str | None = None, task_id: str | None = None) -> Any:
    """`value` with `{episode}`, `{task}`, `{task_id}` (default: `task`) and `{tmpdir}` filled in every string,
    however deeply nested.

    In a string that holds `{tmpdir}` (a path), `{episode}` is the path-safe form of the key.
    """
    if isinstance(value, str):
        if tmpdir is not None and TMPDIR in value:
            value = value.replace(TMPDIR, tmpdir).replace(EPISODE, safe_name(episode))
        return value.replace(EPISODE, episode).replace(TASK_ID, task if task_id is None else task_id).replace("{task}", task)
    if isinstance(value, dict):
        return {k: bind(v, episode=episode, task=task, tmpdir=tmpdir, task_id=task_id) for k, v in value.items()}
    if isinstance(value, list):
        return [bind(v, episode=episode, task=task, tmpdir=tmpdir, task_id=task_id) for v in value]
    return value


def expand_secrets(values: dict[str, str], where: str) -> dict[str, str]:
    """`${NAME}` read from the environment; a missing variable is named (its value never is)."""
    out: dict[str, str] = {}
    for key, value in values.items():
        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(f"mcp server {where} {key!r} needs the environment variable {name}, which is not set")
            return os.environ[name]

        out[key] = _SECRET.sub(sub, value)
    return out


def at_path(data: Any, path: str) -> Any:
    """The value at a dotted path (`a.b.0.c`) in JSON-like data; KeyError when it is not there."""
    for part in path.split("."):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            raise KeyError(path)
    return data


# ---- policy -------------------------------------------------------------------------------------

_TEXT_SUFFIXES = (".md", ".txt", ".rst", ".markdown")


def load_policy(value: str | None, interpreter: Interpreter | None = None) -> str | None:
    """The policy text: `value` itself, or the file it names (a path, or pkg://package/path, looked up in
    `interpreter`'s environment first: the server's)."""
    if value is None or not value.strip():
        return None
    single = "\n" not in value.strip()
    looks_like_file = single and (value.startswith("pkg://") or value.strip().lower().endswith(_TEXT_SUFFIXES)
                                  or os.path.isfile(value))
    if not looks_like_file:
        return value.strip()
    try:
        return resolve_path(value.strip(), interpreter).read_text(encoding="utf-8").strip()
    except (TaskFileError, OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"mcp env_config: policy: cannot read {value.strip()} ({reason})") from None


# ---- paths a server is given --------------------------------------------------------------------

_CODE_SUFFIXES = (".py", ".pyz", ".js", ".mjs", ".cjs", ".ts", ".sh", ".jar", ".rb", ".pl")


def shared_paths(config: MCPConfig) -> list[str]:
    """Paths outside `{tmpdir}` the server is handed (arguments, env, cwd, hidden, reset and digest tool
    arguments) that name an existing file or directory, or one it would create: state an episode could
    change that outlives the run. Programs (executables, scripts) and fixture sources (only copied) are
    not counted; `{tmpdir}` paths are trajforge's own."""
    server = config.server
    values: list[tuple[str, Any]] = [("server.args", server.argv[1:]), ("server.env", list(server.env.values())),
                                     ("server.cwd", server.cwd), ("hidden_arguments", config.hidden_arguments)]
    if config.reset_tool is not None:
        values.append(("reset_tool.arguments", config.reset_tool.arguments))
    if config.state_digest is not None and config.state_digest.name is not None:
        values.append(("state_digest.arguments", config.state_digest.arguments))
    found: list[str] = []
    for where, value in values:
        for text in _strings(value):
            candidate = text.partition("=")[2] if text.startswith("-") and "=" in text else text
            if _names_a_state_path(candidate):
                found.append(f"{where}: {candidate}")
    return found


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _names_a_state_path(text: str) -> bool:
    if not text or TMPDIR in text or "://" in text or "\n" in text or len(text) > 4096:
        return False
    path = os.path.expanduser(text)
    if os.path.isfile(path):
        return not (os.access(path, os.X_OK) or path.lower().endswith(_CODE_SUFFIXES))
    if os.path.exists(path):
        return True
    looks_like_path = text.startswith(("/", "./", "../", "~"))
    return looks_like_path and os.path.isdir(os.path.dirname(os.path.abspath(path)) or ".")
