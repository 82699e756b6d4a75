"""MCPEnv: any Model Context Protocol server as an environment, through the official SDK.

    env = make_env("mcp", server={"command": ["my-mcp-server"]}, hidden_arguments={"state_key": "run/{episode}"},
                   exclude=["admin_reset"], policy="policy.md")

The agent sees the server's tools (from `list_tools`, filtered by `include`/`exclude`, without
the hidden arguments and the tools the environment calls itself). A call is checked against the
tool's JSON Schema first: an invalid one is an `Error:` observation and never reaches the server.
Hidden arguments (e.g. a per-episode state key) are added to every call that declares them. A
result with `is_error` is an `Error:` observation; the observation is the result's content
(images and blobs stored as files under `output_dir`: envs/mcp/content.py), or the field
`result_path` names in its structured content. A server that dies or does not answer
within `call_timeout_s` raises `EnvError` (the run quarantines the episode), and the next
episode gets a new server session.

The world cannot copy itself, so branching restores by replay. Evaluation follows the task's
tau2-style criteria (envs/criteria.py) over the calls this environment recorded, with the DB
criterion decided by the server's `state_digest` tool where one is configured; a task without
criteria is judged by the configured judge model.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult
from mcp_types import Tool as MCPTool
from pydantic import ValidationError

from backends.base import LLM
from backends.config import LLMConfig
from envs.base import (EnvError, Environment, Evaluation, StepResult, Task, UnrunnableTask, UserSimulator, refused,
                       unsupported)
from envs.criteria import CallRecord, evaluate_criteria, has_criteria, reference_actions
from envs.episode_files import EpisodeFiles
from envs.judge import judge_outcome
from envs.mcp.config import (ConfigError, DigestConfig, MCPConfig, ToolCallConfig, at_path, bind, load_policy,
                             shared_paths)
from envs.mcp.content import result_text, tool_observation
from envs.mcp.server import ServerPool, ServerSession, acquire_pool, release_pool
from envs.tasks import Interpreter
from schemas.models import Action, ApiAction, MessageAction, Observation, Step, TextObservation, Tool
from schemas.toolcalls import call_problem


def agent_tools(config: MCPConfig, listed: Sequence[MCPTool]) -> list[Tool]:
    """The server's tools as the agent sees them: filtered, control tools and hidden arguments removed."""
    names = {t.name for t in listed}
    for key in ("include", "exclude", "write_tools", "read_only_tools", "terminal_tools"):
        unknown = sorted(set(getattr(config, key) or []) - names)
        if unknown:
            raise ConfigError(f"mcp env_config: {key} names tools the server does not have: {', '.join(unknown)}"
                              f" (it has: {', '.join(sorted(names))})")
    for control in (config.reset_tool, config.state_digest.tool if config.state_digest else None):
        if control is not None and control.name not in names:
            raise ConfigError(f"mcp env_config: the server has no tool {control.name!r}")
    if config.initialization_tool is not None and config.initialization_tool not in names:
        raise ConfigError(f"mcp env_config: initialization_tool: the server has no tool {config.initialization_tool!r}")
    unknown = sorted(set(config.user_tools) - names)
    if unknown:
        raise ConfigError(f"mcp env_config: user_tools names tools the server does not have: {', '.join(unknown)}")
    hidden = set(config.hidden_arguments)
    skip = set(config.exclude) | config.control_tools() | ({config.initialization_tool} - {None})
    out = []
    for tool in listed:
        if tool.name in skip or (config.include is not None and tool.name not in config.include):
            continue
        if user_tool_name(config, tool.name) is not None:
            continue  # the user's tool
        out.append(visible(tool, hidden))
    return out


def user_tool_name(config: MCPConfig, server_name: str) -> str | None:
    """The user's name for a server tool that is the simulated user's (`user_tools`, or `user_tool_prefix` removed);
    None for any other tool."""
    if server_name in config.user_tools:
        return server_name
    if config.user_tool_prefix is not None and server_name.startswith(config.user_tool_prefix):
        return server_name.removeprefix(config.user_tool_prefix)
    return None


def source_id(task: Task) -> str:
    """The task's own id in its source (`{task_id}`): tau2's id before trajforge's prefix, else the task id."""
    return str(task.metadata.get("upstream_id") or task.id)


def visible(tool: MCPTool, hidden: set[str], name: str | None = None) -> Tool:
    """`tool` as a model sees it: the hidden arguments out of its schema."""
    schema = copy.deepcopy(tool.input_schema) if tool.input_schema else {"type": "object", "properties": {}}
    props = schema.get("properties")
    if isinstance(props, dict):
        for key in hidden:
            props.pop(key, None)
    if isinstance(schema.get("required"), list):
        schema["required"] = [r for r in schema["required"] if r not in hidden]
    return Tool(name=name or tool.name, description=tool.description, parameters=schema)


def _takes(tool: MCPTool | None, key: str) -> bool:
    """Whether a call of `tool` may carry `key`: it declares it, or accepts arguments it does not list."""
    if tool is None:
        return False
    schema = tool.input_schema or {}
    return key in (schema.get("properties") or {}) or schema.get("additionalProperties", True) is not False


class MCPEnv(Environment):
    """Any MCP server (stdio or streamable HTTP) as an environment; see the module doc."""

    name = "mcp"
    can_snapshot = False
    writes_files = True  # EnvFactory passes the run's dataset directory: server logs go to <output_dir>/logs
    default_user = "none (user.kind llm: a persona)"
    evaluation = ("task criteria, tau2-style (DB by state digest or reference writes, ACTION, COMMUNICATE, "
                  "NL_ASSERTION by a judge), else a judge")

    def __init__(
        self,
        server: dict[str, Any],
        include: list[str] | None = None,
        exclude: list[str] | None = None,
        hidden_arguments: dict[str, Any] | None = None,
        reset_tool: dict[str, Any] | None = None,
        state_digest: dict[str, Any] | None = None,
        policy: str | None = None,
        result_path: str | None = None,
        write_tools: list[str] | None = None,
        read_only_tools: list[str] | None = None,
        terminal_tools: list[str] | None = None,
        user_tool_prefix: str | None = None,
        user_tools: list[str] | None = None,
        initialization_tool: str | None = None,
        stateless: bool = False,
        sessions: int = 1,
        recycle_after: int | None = None,
        call_timeout_s: float = 60.0,
        start_timeout_s: float = 60.0,
        fixtures: dict[str, Any] | None = None,
        output_dir: str | Path | None = None,
        judge: LLM | dict[str, Any] | None = None,
        max_steps: int = 50,
        user: UserSimulator | None = None,
    ) -> None:
        settings = {k: v for k, v in dict(
            server=server, include=include, exclude=exclude, hidden_arguments=hidden_arguments, reset_tool=reset_tool,
            state_digest=state_digest, policy=policy, result_path=result_path, write_tools=write_tools,
            read_only_tools=read_only_tools, terminal_tools=terminal_tools, user_tool_prefix=user_tool_prefix,
            user_tools=user_tools, initialization_tool=initialization_tool, stateless=stateless, sessions=sessions,
            recycle_after=recycle_after, call_timeout_s=call_timeout_s, start_timeout_s=start_timeout_s,
            fixtures=fixtures).items() if v is not None}
        self.config = MCPConfig.parse(settings)
        policy_file = self.config.policy is not None and self.config.policy.startswith("pkg://")
        super().__init__(max_steps=max_steps, user=user, policy=load_policy(
            self.config.policy, self.config.server.interpreter() if policy_file else None))
        self.judge, self._own_judge = self._make_judge(judge)
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.log_dir = self.output_dir / "logs" / "mcp" if self.output_dir is not None else None
        self._files: EpisodeFiles | None = None  # where the episode's images and blobs go
        self._pool: ServerPool | None = None
        self._session: ServerSession | None = None
        self._staged: str | None = None  # the episode whose fixtures lie in the session's {tmpdir}
        self._listed: dict[str, MCPTool] = {}
        self._tools: list[Tool] = []
        self._writes: set[str] = set()
        self.calls: list[CallRecord] = []  # the episode's tool calls, for evaluation
        self.answer: str | None = None  # the agent's final message where there is no user

    @classmethod
    def shared_paths(cls, env_config: dict[str, Any]) -> list[str]:
        """Files outside the server's {tmpdir} it is handed (what `envs check` would change); see config.shared_paths."""
        return shared_paths(MCPConfig.parse({k: v for k, v in env_config.items() if k in MCPConfig.model_fields}))

    @classmethod
    def package_interpreter(cls, env_config: dict[str, Any]) -> Interpreter | None:
        """The server's Python, where `pkg://` task paths resolve first (a server run from its own venv)."""
        try:
            config = MCPConfig.parse({k: v for k, v in env_config.items() if k in MCPConfig.model_fields})
        except ConfigError:
            return None  # the environment itself names the problem when it is made
        return config.server.interpreter()

    @staticmethod
    def _make_judge(judge: LLM | dict[str, Any] | None) -> tuple[LLM | None, bool]:
        if judge is None or isinstance(judge, LLM):
            return judge, False
        if not isinstance(judge, dict) or set(judge) - {"llm"}:
            raise ConfigError("mcp env_config: judge: give {llm: {...}} (or {} for the method's model in a run)")
        if judge.get("llm") is None:
            raise ConfigError("mcp env_config: judge: {} means the method's model, which only a run config has;"
                              " give judge.llm")
        from backends.registry import make_llm

        return make_llm(LLMConfig.model_validate(judge["llm"])), True

    # ---- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._pool is not None:
            return
        pool = await acquire_pool(self.config, self.log_dir)
        try:
            self._tools = agent_tools(self.config, pool.tools)
        except ConfigError:
            await release_pool(pool)
            raise
        self._pool = pool
        self._listed = {t.name: t for t in pool.tools}
        self._writes = {t.name for t in pool.tools if self._is_write(t)}

    def _is_write(self, tool: MCPTool) -> bool:
        """State-changing unless declared read-only (config, MCP readOnlyHint) or left out of write_tools."""
        if tool.name in self.config.read_only_tools:
            return False
        if self.config.write_tools is not None:
            return tool.name in self.config.write_tools
        return not (tool.annotations is not None and tool.annotations.read_only_hint is True)

    async def close(self) -> None:
        self._release_session()
        pool, self._pool = self._pool, None
        if pool is not None:
            await release_pool(pool)
        if self._own_judge and self.judge is not None:
            judge, self.judge = self.judge, None
            await judge.aclose()

    def _release_session(self) -> None:
        session, self._session = self._session, None
        staged, self._staged = self._staged, None
        if session is not None and staged is not None:
            session.drop_episode(staged)
        if session is not None and self._pool is not None:
            self._pool.release(session)

    @property
    def state_changing_tools(self) -> frozenset[str]:
        """The tools whose calls count as writes (see `write_tools`, `read_only_tools`, readOnlyHint)."""
        return frozenset(self._writes)

    def tools(self) -> list[Tool]:
        if self._pool is None:
            raise RuntimeError("the mcp environment lists its tools after start()")
        return list(self._tools)

    @property
    def sessions_started(self) -> int:
        """Server sessions the pool started so far (after crashes, hangs, recycling, for isolation)."""
        return self._pool.started if self._pool is not None else 0

    # ---- episodes -------------------------------------------------------------------------------

    async def _reset(self, task: Task) -> Observation | None:
        await self.start()
        assert self._pool is not None
        self._release_session()
        self._session = await self._pool.lease()
        self.calls = []
        self.answer = None
        self._staged = self.episode_key
        self._files = (EpisodeFiles(self.output_dir, "mcp_content", task.id, self.episode_key)
                       if self.output_dir is not None else None)
        await self._prepare(self.episode_key, task)
        if self.user is not None:
            self.user.tools = self.user_tools()
        return None

    async def _prepare(self, episode: str, task: Task, session: ServerSession | None = None) -> None:
        """The episode's fixtures, the reset tool, then the task's initial tool calls, on the state of `episode`."""
        target = session or self._session
        if target is not None:
            await target.stage_episode(episode)
        if self.config.reset_tool is not None:
            await self._control(self.config.reset_tool, episode, task, session)
            if self.config.reset_tool.initializes:
                return  # the reset tool set the task up (tau2's initial_state) itself
        data = task.params.get("initialization_data")
        if data:
            if self.config.initialization_tool is None:
                raise UnrunnableTask(f"task {task.id} sets initialization_data, and the server has no tool to apply "
                                     "it (env_config.initialization_tool)")
            await self._setup_call(self.config.initialization_tool, {k: data.get(k) for k in ("agent_data", "user_data")},
                                   "initialization_data", episode, task, session)
        for call in task.params.get("initial_actions") or []:
            name = self.side_tool(call.get("name") or call.get("function"), call.get("side"), task)
            await self._setup_call(name, call.get("arguments") or {}, "initial action", episode, task, session)

    def side_tool(self, name: str, side: str | None, task: Task) -> str:
        """The server tool behind `name` on `side` (tau2's env_type / requestor): the user's carry the prefix."""
        if side != "user":
            return name
        if name in self.config.user_tools:
            return name
        if self.config.user_tool_prefix is None:
            raise UnrunnableTask(f"task {task.id} calls the user's tool {name!r}, and this server has no user tools "
                                 "(env_config.user_tools or user_tool_prefix)")
        return self.config.user_tool_prefix + name

    async def _setup_call(self, name: str, arguments: dict[str, Any], what: str, episode: str, task: Task,
                          session: ServerSession | None) -> None:
        if name not in self._listed:
            raise UnrunnableTask(f"task {task.id}: {what} {name} names a tool the server does not have")
        try:
            result = await self._call(name, arguments, episode, task, session)
        except MCPError as exc:
            raise EnvError(f"{what} {name} of task {task.id} failed: {exc.message}") from None
        if result.is_error:
            raise EnvError(f"{what} {name} of task {task.id} failed: {self._text(result)[:300]}")

    def user_tools(self) -> list[Tool]:
        """The simulated user's tools (`user_tools`, `user_tool_prefix`), under their own names, hidden arguments
        removed."""
        if self._pool is None:
            return []
        hidden = set(self.config.hidden_arguments)
        return [visible(t, hidden, own) for t in self._pool.tools
                if (own := user_tool_name(self.config, t.name)) is not None and t.name not in self.config.exclude]

    async def _user_act(self, name: str, arguments: dict[str, Any]) -> str:
        """A user tool call on the episode's world (recorded for the criteria like the agent's, by its own name)."""
        task = self.task
        assert task is not None
        if not any(t.name == name for t in self.user_tools()):
            return f"Error: you have no tool {name!r}"
        try:
            result = await self._call(self.side_tool(name, "user", task), arguments, self.episode_key, task)
        except (MCPError, ValidationError) as exc:
            self.calls.append(CallRecord(name, dict(arguments), False, True))
            return f"Error: {exc.message if isinstance(exc, MCPError) else 'not a valid MCP result'}"
        self.calls.append(CallRecord(name, dict(arguments), not result.is_error, True))
        return self._text(result)

    async def _act(self, action: Action) -> StepResult:
        if isinstance(action, MessageAction):
            # Without a user, a message is the agent's final answer.
            self.answer = action.content
            return StepResult(TextObservation(content="The answer was submitted.", source="environment"), done=True,
                              info={"answer": action.content})
        if not isinstance(action, ApiAction):
            return unsupported(action)
        if action.extra.get("requestor") == "user":  # a reference's user-side action, played on the user's tools
            text = await self._user_act(action.function, action.arguments)
            return StepResult(TextObservation(content=text, source="user", name=action.function,
                                              tool_call_id=action.tool_call_id),
                              info={"error": text} if text.startswith("Error") else {})
        problem = call_problem(self._tools, action.function, action.arguments)
        if problem is not None:
            return refused(action, problem)
        task = self.task
        assert task is not None
        try:
            result = await self._call(action.function, action.arguments, self.episode_key, task)
        except (MCPError, ValidationError) as exc:  # the server answered with a protocol error, or a malformed result
            self.calls.append(CallRecord(action.function, dict(action.arguments), False, action.function in self._writes))
            why = exc.message if isinstance(exc, MCPError) else f"its answer is not a valid MCP result ({exc.error_count()} errors)"
            return refused(action, f"the server rejected the call: {why}")
        ok = not result.is_error
        self.calls.append(CallRecord(action.function, dict(action.arguments), ok, action.function in self._writes))
        if not ok:
            return refused(action, self._text(result).removeprefix("Error:").strip() or "the tool failed")
        picked = self._picked(result)
        obs = (TextObservation(content=picked, source="environment", name=action.function,
                               tool_call_id=action.tool_call_id) if picked is not None
               else tool_observation(result, self._files, action.function, action.tool_call_id))
        return StepResult(obs, done=action.function in self.config.terminal_tools)

    async def _call(self, name: str, arguments: dict[str, Any], episode: str, task: Task,
                    session: ServerSession | None = None) -> CallToolResult:
        """A call with the hidden arguments of `episode` added, on `session` (default: this episode's)."""
        session = session or self._session
        if session is None:
            raise RuntimeError("call reset(task) first")
        hidden = bind(self.config.hidden_arguments, episode=episode, task=task.id, tmpdir=session.tmpdir,
                      task_id=source_id(task))
        tool = self._listed.get(name)
        extra = {k: v for k, v in hidden.items() if _takes(tool, k)}
        return await session.call(name, {**arguments, **extra}, self.config.call_timeout_s)

    async def _control(self, spec: ToolCallConfig, episode: str, task: Task, session: ServerSession | None = None) -> str:
        """Call a tool the environment uses itself (reset, digest); its failure is the world's failure."""
        tmpdir = (session or self._session).tmpdir if (session or self._session) is not None else None
        arguments = bind(spec.arguments, episode=episode, task=task.id, tmpdir=tmpdir, task_id=source_id(task))
        try:
            result = await self._call(spec.name, arguments, episode, task, session)
        except MCPError as exc:
            raise EnvError(f"{spec.name} failed: {exc.message}") from None
        if result.is_error:
            raise EnvError(f"{spec.name} failed: {self._text(result)[:300]}")
        return self._text(result, spec.result_path)

    async def _digest(self, spec: DigestConfig, episode: str, task: Task, session: ServerSession | None = None) -> str:
        """The state digest of `episode`: the server's tool, or a command or SQL query run here on its files."""
        if spec.tool is not None:
            return await self._control(spec.tool, episode, task, session)
        session = session or self._session
        assert session is not None
        fill = lambda v: bind(v, episode=episode, task=task.id, tmpdir=session.tmpdir, task_id=source_id(task))  # noqa: E731
        timeout_s = self.config.call_timeout_s
        if spec.command is not None:
            return await run_digest_command(fill(spec.command), session.tmpdir, timeout_s)
        assert spec.sql is not None and spec.database is not None
        try:
            return await asyncio.wait_for(asyncio.to_thread(sql_digest, fill(spec.database), fill(spec.sql)), timeout_s)
        except asyncio.TimeoutError:
            raise EnvError(f"state_digest: the query did not finish within {timeout_s:g} s") from None

    def _text(self, result: CallToolResult, path: str | None = None) -> str:
        """The result as text: the structured field at `path` (default: result_path), else the content."""
        picked = self._picked(result, path)
        return picked if picked is not None else result_text(result)

    def _picked(self, result: CallToolResult, path: str | None = None) -> str | None:
        """The structured field at `path` (default: result_path) as text, where there is one."""
        path = path or self.config.result_path
        if path is None or result.structured_content is None:
            return None
        try:
            value = at_path(result.structured_content, path)
        except KeyError:
            return None
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    # ---- evaluation -----------------------------------------------------------------------------

    async def _evaluate(self, task: Task, history: Sequence[Step]) -> Evaluation:
        if has_criteria(task.goal):
            reference = await self._reference_run(task)

            async def by_digest() -> dict[str, Any]:
                assert self.config.state_digest is not None and reference.digest is not None
                now = await self._digest(self.config.state_digest, self.episode_key, task)
                passed = now == reference.digest
                return {"passed": passed, "method": "state digest", "digest": now, "reference_digest": reference.digest,
                        "note": "state matches the reference" if passed
                        else "state differs from the state after the reference actions"}

            return await evaluate_criteria(task.goal, history, self.calls, is_write=lambda n: n in self._writes,
                                           db_check=by_digest if reference.digest is not None else None,
                                           reference_ok=reference.ok, judge=self.judge, policy=self.policy,
                                           env_check=lambda: self._env_assertions(task))
        if self.judge is not None:
            verdict = await judge_outcome(self.judge, task, history, self.policy)
            return Evaluation.of(verdict.reward, verdict.reasoning, judge="llm")
        return Evaluation(0.0, False, "the task states no criteria and no judge is configured (env_config.judge)")

    async def _env_assertions(self, task: Task) -> dict[str, Any]:
        """tau2's env_assertions, each a server tool called on the episode's world; its answer (JSON) must equal
        `assert_value`. Unchecked where the server lacks one of them (named)."""
        results = []
        for a in task.goal.get("env_assertions") or []:
            user_side = a.get("side") == "user"
            has_user_tools = self.config.user_tool_prefix is not None or a["name"] in self.config.user_tools
            name = self.side_tool(a["name"], "user", task) if user_side and has_user_tools else a["name"]
            if name not in self._listed or (user_side and not has_user_tools):
                return {"passed": None, "unchecked": True, "note": f"the server has no assertion tool {name!r}"}
            try:
                result = await self._call(name, a.get("arguments") or {}, self.episode_key, task)
                text = self._text(result)
                value: Any = json.loads(text) if not result.is_error else None
            except (MCPError, ValidationError, ValueError):
                value = text = None
            wanted = a.get("assert_value", True)
            results.append({"assertion": name, "arguments": a.get("arguments") or {}, "expected": wanted,
                            "got": value, "passed": value == wanted})
        failed = [r for r in results if not r["passed"]]
        return {"passed": not failed, "assertions": results,
                "note": "; ".join(f"{r['assertion']} gave {r['got']!r}, not {r['expected']!r}" for r in failed)
                or "every environment assertion holds"}

    async def _reference_run(self, task: Task) -> ReferenceRun:
        """The task's reference actions replayed once on a fresh state (cached): which succeed, and the digest."""
        assert self._pool is not None
        key = hashlib.sha256(json.dumps([self._pool.key, self.config.model_dump(mode="json", include={
            "reset_tool", "state_digest"}), task.id, task.params, reference_actions(task.goal)], sort_keys=True,
            default=str).encode()).hexdigest()
        async with self._pool.lock(key):  # episodes of one task evaluated at once replay its reference once
            run = _REFERENCE_RUNS.get(key)
            if run is None:
                run = _REFERENCE_RUNS[key] = await self._replay_reference(task)
        return run

    async def _replay_reference(self, task: Task) -> ReferenceRun:
        """Replay on a state of its own: beside the episode's (a key of its own), else on another session."""
        assert self._pool is not None
        episode = f"{self.episode_key}/reference"
        session = self._session if self.config.isolation() in ("key", "none") else await self._pool.lease()
        try:
            await self._prepare(episode, task, session)
            ok = []
            for action in reference_actions(task.goal):
                try:
                    name = self.side_tool(action["name"], action.get("requestor"), task)
                    result = await self._call(name, action["arguments"], episode, task, session)
                    ok.append(not result.is_error)
                except (MCPError, ValidationError):
                    ok.append(False)
            digest = None
            if self.config.state_digest is not None:
                digest = await self._digest(self.config.state_digest, episode, task, session)
        finally:
            if session is not None:
                session.drop_episode(episode)
            if session is not self._session and session is not None:
                self._pool.release(session)
        if len(_REFERENCE_RUNS) >= MAX_REFERENCE_RUNS:
            _REFERENCE_RUNS.clear()
        return ReferenceRun(tuple(ok), digest)


async def run_digest_command(argv: list[str], cwd: str | None, timeout_s: float) -> str:
    """A digest command's standard output (hashed: records keep 64 characters, not a dump)."""
    from envs.mcp.server import resolve_command

    try:
        proc = await asyncio.create_subprocess_exec(resolve_command(argv[0]), *argv[1:], cwd=cwd,
                                                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise EnvError(f"state_digest: cannot run {argv[0]!r}: {exc.strerror or exc}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise EnvError(f"state_digest: {' '.join(argv)} did not finish within {timeout_s:g} s") from None
    if proc.returncode != 0:
        last = (err.decode("utf-8", "replace").strip().splitlines() or [""])[-1][:300]
        raise EnvError(f"state_digest: {' '.join(argv)} exited with status {proc.returncode}: {last}")
    return hashlib.sha256(out).hexdigest()


def sql_digest(database: str, sql: str) -> str:
    """Every row the query returns, in order, hashed; the database is opened read-only."""
    if not Path(database).is_file():
        raise EnvError(f"state_digest: no database at {database}")
    try:
        conn = sqlite3.connect(f"{Path(database).resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = conn.execute(sql).fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise EnvError(f"state_digest: the query failed on {database}: {exc}") from None
    return hashlib.sha256(json.dumps(rows, default=repr).encode()).hexdigest()


@dataclass(frozen=True)
class ReferenceRun:
    """A task's reference actions on a fresh state: which calls succeeded, and the state digest after them."""

    ok: tuple[bool, ...]
    digest: str | None


MAX_REFERENCE_RUNS = 100_000
_REFERENCE_RUNS: dict[str, ReferenceRun] = {}
