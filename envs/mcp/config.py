"""The settings of an MCP environment (`env_config` of `env: mcp`), validated with one-line errors.

    server: {command: [my-mcp-server], args: [], env: {STATE_DIR: "{tmpdir}"}}     # stdio
    server: {url: "http://127.0.0.1:8000/mcp", headers: {Authorization: "Bearer ${API_TOKEN}"}}
    include / exclude: [tool names]          # which of the server's tools the agent sees
    hidden_arguments: {state_key: "trajforge/{episode}"}
    reset_tool: {name: reset_state, arguments: {state_key: "trajforge/{episode}"}}
    state_digest: {name: db_hash, arguments: {...}, result_path: hash}
    policy: policy.md | pkg://package/policy.md | the text itself
    result_path: message.content             # the observation inside a structured result
    write_tools / read_only_tools: [...]     # which calls change state (also MCP readOnlyHint)
    terminal_tools: [hand_over_to_a_person]  # a successful call ends the episode

Isolation: with `{episode}` in a hidden argument every episode has its own state on a shared
server session; with only a `reset_tool`, a session serves one episode at a time; with neither,
each episode gets a fresh server session (process) of its own, unless the server is declared
`stateless`.

Placeholders: `{episode}` is the environment's episode key, `{task}` the task id (in hidden
arguments, reset and digest arguments); `{tmpdir}` in the server's `env`, `args` or `cwd` is a
private directory made for each server process and removed when it stops (state files of
different runs and processes never collide, and none are left behind). `${NAME}` in the server's
`env` and `headers` is read from trajforge's own environment when the server starts, so secrets
stay out of configs, logs and records.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from envs.tasks import TaskFileError, resolve_path

_SECRET = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
TMPDIR = "{tmpdir}"
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
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> ServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a stdio server) or url (a streamable HTTP server)")
        if self.command is not None and not self.argv:
            raise ValueError("command is empty")
        if self.url is not None and (self.args or self.env or self.cwd):
            raise ValueError("args, env and cwd are for stdio servers (command), not url")
        return self

    @property
    def argv(self) -> list[str]:
        command = [self.command] if isinstance(self.command, str) else list(self.command or [])
        return command + list(self.args)

    def describe(self) -> str:
        """The server for messages: its URL without credentials, or its command line."""
        if self.url:
            parts = urlsplit(self.url)
            return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        return " ".join(self.argv)


class ToolCallConfig(BaseModel):
    """A tool the environment itself calls (reset, state digest), with its arguments."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    result_path: str | None = Field(None, description="where the value sits in a structured result")


class MCPConfig(BaseModel):
    """Everything `env_config` may say about an MCP environment."""

    model_config = ConfigDict(extra="forbid")

    server: ServerConfig
    include: list[str] | None = None
    exclude: list[str] = Field(default_factory=list)
    hidden_arguments: dict[str, Any] = Field(default_factory=dict)
    reset_tool: ToolCallConfig | None = None
    state_digest: ToolCallConfig | None = None
    policy: str | None = None
    result_path: str | None = None
    write_tools: list[str] | None = None
    read_only_tools: list[str] = Field(default_factory=list)
    terminal_tools: list[str] = Field(default_factory=list)
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
        return {c.name for c in (self.reset_tool, self.state_digest) if c is not None}


# ---- placeholders -------------------------------------------------------------------------------


def bind(value: Any, *, episode: str, task: str) -> Any:
    """`value` with `{episode}` and `{task}` filled in every string, however deeply nested."""
    if isinstance(value, str):
        return value.replace("{episode}", episode).replace("{task}", task)
    if isinstance(value, dict):
        return {k: bind(v, episode=episode, task=task) for k, v in value.items()}
    if isinstance(value, list):
        return [bind(v, episode=episode, task=task) for v in value]
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


def load_policy(value: str | None) -> str | None:
    """The policy text: `value` itself, or the file it names (a path, or pkg://package/path)."""
    if value is None or not value.strip():
        return None
    single = "\n" not in value.strip()
    looks_like_file = single and (value.startswith("pkg://") or value.strip().lower().endswith(_TEXT_SUFFIXES)
                                  or os.path.isfile(value))
    if not looks_like_file:
        return value.strip()
    try:
        return resolve_path(value.strip()).read_text(encoding="utf-8").strip()
    except (TaskFileError, OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"mcp env_config: policy: cannot read {value.strip()} ({reason})") from None
