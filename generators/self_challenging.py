"""Self-challenging tasks (Code-as-Task): a challenger explores the tools and writes checkable tasks.

Per task (one challenge each, id `challenge-NNNN`):

1. **explore** — the challenger acts in the environment like an agent (`play_episode`, the one
   episode loop, with the challenger as the policy and no user): up to `explore_steps` tool calls,
   one at a time, each result read before the next call; it stops early by writing a note. It is
   shown the tools, a few example user requests (from the config's task source, for concrete ids to
   start from) and what a verifier can read.
2. **challenge** — from its exploration, the challenger writes (structured) an instruction, a
   Python function `verify(state) -> bool`, an example solution (a list of tool calls) and exactly
   three failure cases (lists of tool calls that must NOT satisfy the task).
3. **validation** — each call list runs in a fresh episode of the same world seed, then the
   state is read and goes to `verify` in the sandbox (`envs.sandbox.run_verifier`: a separate,
   confined process with CPU / memory / wall limits, no network, a scratch directory and a clean
   environment; generated code never runs in this process). The state is, by `state`:
   - `env` (default where the world offers it, e.g. retail): the env's `state()` JSON;
   - `calls` (any world, e.g. an MCP server): the task also declares `state_calls`, read-only
     tool calls run after the episode (`Environment.inspect`, outside the trajectory); `state` is
     the list of their results (JSON where the result is JSON, else the text). After the solution
     they run twice: different results mean they are not read-only (or not deterministic), and
     the task is rejected.
   The challenge is kept only if the solution's calls all succeed and `verify` returns exactly
   `True` for it, and returns anything but `True` for every failure case. A failure case whose
   state call fails (it reads a file the wrong solution never wrote) is "not done", as the paper's
   check wants, recorded with the reason (`details.checks`: `passed: false`, `error`); only after
   the solution must every state call succeed. Otherwise it is filtered
   by "challenge_check" with the precise reason: "solution call failed: ...", "state call N ...
   failed: ...", "state calls are not read-only: ...", "verifier rejected: ..." (static policy,
   below), "verifier crashed: ...", "sandbox: timeout: ..." (wall or CPU limit; also "sandbox:
   memory: ...", "sandbox: forbidden: ..." for a refused operation), "solution fails verifier: ...",
   "failure case N passes verifier".
   Before any run, a static policy (`verifier_lint`, default on) refuses verifier code that
   imports beyond a short list of pure modules, touches dunder/frame/module attributes, uses
   dynamic-code builtins or assigns attributes. The sandbox already seals its result against
   code it runs; the policy is a second layer that keeps verifiers to reading the state.
4. **dedup** — a valid task whose instruction near-duplicates a kept one (equal normalized words,
   or MinHash Jaccard of word 3-grams >= `dedup_threshold`; earlier runs' tasks count) is filtered
   by "dedup" with the kept task's id and the similarity (`counts.challenges_duplicate`).
5. **rollout** — the agent (`self.policy(draw=k)`, with the world's policy) attempts each kept task
   `rollouts` times, attempt k being draw k of the agent (sampling seed `seed + k`: its own cache
   entries, under the same prompt, so no attempt marker reaches a trained prompt); after each episode the state is read the same way and scored by the task's
   verifier in the sandbox (reward 1.0 only when it returns exactly True, else 0.0; a sandbox or
   state-read failure scores 0 with its reason).

Every verdict carries its reason: validation checks in `details.checks`, each rollout's verifier
verdict in `details.verifier` and `details.evaluation`. Kept tasks (instruction, verifier code,
solution, failure cases, state calls, world seed) are stored in every rollout's
`details["challenge"]` (and `details.task`, the solution as its reference actions, so step
verification can replay them) and in `tasks.jsonl` in the output directory (a side file, rewritten
atomically after each kept task, merged with what an earlier run wrote).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import tempfile
from pathlib import Path
from typing import Any, ClassVar, Iterable, Literal

from pydantic import BaseModel, Field, computed_field, model_validator

from backends.errors import LLMRequestError
from envs.base import Environment, Evaluation, Task
from envs.tasks import MAX_TASKS
from filters.dedup import NearDuplicateIndex
from generators._episode import play_episode
from generators.agent import AgentPolicy
from generators.base import MethodConfig, Role, TaskResult, TaskSpec
from generators.env_method import EnvMethod, EnvMethodConfig
from generators.registry import register_method
from schemas.models import ApiAction, Step, is_system_step
from schemas.store import Dataset

TASKS_FILE = "tasks.jsonl"

EXPLORE_SYSTEM = (
    "You are a challenger: you will invent a realistic, checkable task for an AI agent that uses the tools of "
    "the '{env}' environment. First explore: call the tools one at a time (at most {n} calls) to find concrete "
    "facts a task can rest on (ids, names, current states), reading each result before the next call. When you "
    "have seen enough, reply with a short note of what you found, without a tool call."
)
EXPLORE_USER = "EXPLORE FOR CHALLENGE #{index}\nExample requests users make here:\n{examples}\n\n{state_info}"
# The world's policy, as the agent that will attempt the task gets it: a task must be doable within it.
POLICY_BLOCK = (
    "\n\n# Policy\nThe agent that will attempt your task follows this policy. Only ask for what it allows: the "
    "solution must follow it step by step (the checks and confirmations it requires included), and a failure "
    "case may break it.\n{policy}"
)
CHALLENGE_SYSTEM = (
    "You are a challenger: you write one task for an AI agent in the '{env}' environment, with code that "
    "checks it. Answer with a JSON object with: \"instruction\" (what the user asks, self-contained, with "
    "the ids and details the agent needs), {state_calls}\"verifier\" (Python source defining `def verify(state) -> "
    "bool`, standard library only, returning True exactly when the task is done; {state_doc}), \"solution\" "
    "(the list of tool calls {{\"name\", \"arguments\"}} that does the task), \"failure_cases\" (exactly three "
    "lists of tool calls that look plausible but must NOT satisfy the task).\n\nTools (JSON, one per line):\n{tools}"
)
CHALLENGE_USER = (
    "WRITE CHALLENGE #{index}\n{state_info}\n\nYour exploration:\n{exploration}\n\n"
    "Write a task different from the example requests."
)
STATE_SHAPE = "State shape (what the verifier reads after the episode):\n{shape}"
STATE_BY_CALLS = (
    "This environment's state is read through its tools: your task names read-only tool calls (state calls) "
    "whose results, after the episode, are what the verifier reads."
)
STATE_ENV_DOC = "`state` is the environment state after the episode, shaped as shown"
STATE_CALLS_FIELD = (
    '"state_calls" (read-only tool calls {"name", "arguments"} run after the episode, whose results show '
    'whether the task was done, e.g. a lookup of what the task changes), '
)
STATE_CALLS_DOC = ("`state` is the list of the state calls' results in order, each parsed as JSON where it is JSON, "
                   "else the text")


class ToolCall(BaseModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    def action(self, call_id: str) -> ApiAction:
        return ApiAction(function=self.name, arguments=self.arguments, tool_call_id=call_id)


class Challenge(BaseModel):
    instruction: str = Field(min_length=1)
    verifier: str = Field(min_length=1)
    solution: list[ToolCall] = Field(min_length=1)
    failure_cases: list[list[ToolCall]] = Field(min_length=3, max_length=3)


class StateCallChallenge(Challenge):
    """A challenge in a world without `state()`: the verifier reads the results of these read-only calls."""

    state_calls: list[ToolCall] = Field(min_length=1)


class SandboxLimits(BaseModel):
    timeout_s: float = Field(5.0, gt=0, description="wall-clock limit per verifier run")
    cpu_s: int = Field(10, ge=1, description="CPU-seconds limit (reported as a timeout too)")
    memory_mb: int = Field(512, ge=32)
    unsafe_no_sandbox: bool = Field(False, description="run verifiers without bubblewrap where it is missing "
                                                       "(seccomp, rlimits and in-process guards only); warns each run")


class SelfChallengingConfig(EnvMethodConfig):
    runtime_fields: ClassVar[dict[str, Any]] = {**MethodConfig.runtime_fields, "sandbox": {"unsafe_no_sandbox": True}}

    method: Literal["self_challenging"] = "self_challenging"
    challenges: int = Field(8, ge=1, le=MAX_TASKS, description="challenges to write (one task each)")
    explore_steps: int = Field(3, ge=0, description="tool calls the challenger makes, one at a time, before writing")
    example_tasks: int = Field(2, ge=0, description="requests from the task source shown to the challenger as starting points")
    state: Literal["auto", "env", "calls"] = Field("auto", description="what the verifier reads: the env's state(), "
                                                   "or results of read-only calls the task declares (auto: env where offered)")
    max_observation_chars: int = Field(1500, ge=100)
    rollouts: int = Field(2, ge=0, description="agent attempts per kept task")
    max_steps: int = Field(15, ge=1)
    challenger_temperature: float | None = None
    keep_failed: bool = Field(True, description="keep rollouts the verifier rejects (reward 0)")
    dedup_threshold: float | None = Field(0.8, gt=0, le=1, description="drop a task whose instruction is this similar "
                                                                      "to a kept one (MinHash Jaccard); null: no dedup")
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    verifier_lint: bool = Field(True, description="refuse verifiers that import beyond a short list, touch "
                                                  "dunders/frames or assign attributes (before the sandbox)")

    @model_validator(mode="after")
    def _state_is_readable(self) -> SelfChallengingConfig:
        if self.state == "env":
            from envs.registry import env_class

            if "state" not in env_class(self.env).offers(self.env_config):
                raise ValueError(f"self_challenging with state: env needs a state a verifier can read (state()); "
                                 f"environment {self.env!r} does not offer it: use state: calls")
        return self

    def state_mode(self) -> Literal["env", "calls"]:
        if self.state != "auto":
            return self.state
        from envs.registry import env_class

        return "env" if "state" in env_class(self.env).offers(self.env_config) else "calls"


class Verdict(BaseModel):
    """What one sandboxed verifier run said: passed only when verify returned exactly True."""

    passed: bool
    error: str | None = None  # a reason when the run did not produce a verdict
    value: str | None = None  # repr of what verify returned

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reason(self) -> str:
        return self.error or f"verify returned {self.value}"


def env_state(env: Environment) -> Any:
    """The JSON state a verifier sees, from the env's public `state()`."""
    state = getattr(env, "state", None)
    if state is None:
        raise TypeError(f"environment {env.name!r} has no state() to verify against")
    return json.loads(json.dumps(state(), default=str))


def observation_value(step: Step) -> Any:
    """A tool result as a verifier sees it: parsed JSON where the text is JSON, else the text."""
    if step.kind == "json":
        return json.loads(json.dumps(step.content, default=str))
    text = step.content if step.kind == "text" else step.model_dump_json()
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"


def _state_shape(state: Any) -> str:
    if isinstance(state, dict):
        lines = []
        for key, value in state.items():
            if isinstance(value, list) and value and isinstance(value[0], dict):
                lines.append(f"state[{key!r}]: list of {len(value)} rows like {json.dumps(value[0], default=str)}")
            else:
                lines.append(f"state[{key!r}]: {type(value).__name__}")
        return "\n".join(lines)
    return f"state: {type(state).__name__}"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def verdict_from_sandbox(result: Any) -> Verdict:
    """Map a SandboxResult to a Verdict; anything but a clean, exact `True` is not a pass."""
    if not result.ok:
        kind = result.error_kind or "crash"
        message = _last_line(result.error or "") or kind
        if kind == "exception":
            return Verdict(passed=False, error=f"verifier crashed: {message}")
        if kind == "cpu":  # the CPU-time limit: a timeout too
            return Verdict(passed=False, error=f"sandbox: timeout: CPU time limit exceeded ({message})")
        return Verdict(passed=False, error=f"sandbox: {kind}: {message}")
    value = result.value
    return Verdict(passed=value is True, value=repr(value)[:200])


# ---- static policy for verifier code (defence in depth; the code still only runs in the sandbox) -----

# A verifier reads a JSON state; it needs no more than these modules. Left out on purpose:
# `operator` (attrgetter reaches attributes by string), `string` (Formatter.get_field does too),
# `typing` (get_type_hints evaluates string annotations).
ALLOWED_IMPORTS = frozenset({
    "json", "math", "re", "collections", "itertools", "functools", "datetime", "decimal", "fractions", "statistics",
})
# Builtins that reach the interpreter's internals, the file system or dynamic code.
FORBIDDEN_NAMES = frozenset({
    "eval", "exec", "compile", "open", "getattr", "setattr", "delattr", "vars", "globals", "locals", "dir",
    "breakpoint", "input", "help", "exit", "quit", "memoryview", "__import__", "__builtins__", "__loader__", "__spec__",
})
# Attributes that lead to frames, modules or process state (plus every name starting with "_").
FORBIDDEN_ATTRIBUTES = frozenset({
    "sys", "os", "gc", "io", "builtins", "modules", "subprocess", "importlib", "settrace", "setprofile",
    "f_locals", "f_globals", "f_builtins", "f_back", "f_code", "gi_frame", "gi_code", "cr_frame", "ag_frame",
    "tb_frame", "tb_next", "mro", "system", "popen", "fork",
})


def verifier_problem(code: str) -> str | None:
    """Why `code` is not an acceptable verifier (None if it is).

    A verifier only needs to read the state. Refusing imports beyond a short list, dunder and
    introspection attributes, dynamic-code builtins and any assignment to an attribute keeps a
    verifier to reading the state, a layer on top of the sandbox's own sealed result.
    """
    import ast

    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return f"syntax error: {exc.msg} (line {exc.lineno})"
    defines = any(isinstance(n, ast.FunctionDef) and n.name == "verify" for n in tree.body)
    if not defines:
        return "no top-level `def verify(state)`"
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                if name.split(".")[0] not in ALLOWED_IMPORTS or (isinstance(node, ast.ImportFrom) and node.level):
                    return f"import of {name!r} is not allowed"
            if isinstance(node, ast.ImportFrom) and any(a.name.startswith("_") for a in node.names):
                return "importing private names is not allowed"
        elif isinstance(node, ast.Name) and (node.id in FORBIDDEN_NAMES or node.id.startswith("__")):
            return f"use of {node.id!r} is not allowed"
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("_") or node.attr in FORBIDDEN_ATTRIBUTES:
                return f"attribute {node.attr!r} is not allowed"
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                return f"assigning attribute {node.attr!r} is not allowed"
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            return "global/nonlocal statements are not allowed"
    return None


def run_verifier(code: str, state: Any, limits: SandboxLimits | None = None, *, lint: bool = True) -> Verdict:
    """Run `verify(state)` defined by `code` in the sandbox, never in this process.

    Passed only when the code clears the static policy (`lint`), runs cleanly within the
    limits, and `verify` returns exactly `True` (a truthy non-bool is a failure).
    """
    from envs import sandbox

    if lint and (problem := verifier_problem(code)) is not None:
        return Verdict(passed=False, error=f"verifier rejected: {problem}")
    limits = limits or SandboxLimits()
    result = sandbox.run_verifier(code, state, timeout_s=limits.timeout_s, cpu_s=limits.cpu_s,
                                  memory_mb=limits.memory_mb, unsafe_no_sandbox=limits.unsafe_no_sandbox)
    return verdict_from_sandbox(result)


@register_method
class SelfChallenging(EnvMethod):
    """Code-as-Task: a challenger explores, writes tasks with sandbox-checked verifiers; agent rollouts."""

    name = "self_challenging"
    Config = SelfChallengingConfig
    templates = (EXPLORE_SYSTEM, EXPLORE_USER, CHALLENGE_SYSTEM, CHALLENGE_USER, STATE_SHAPE, STATE_BY_CALLS,
                 STATE_ENV_DOC, STATE_CALLS_FIELD, STATE_CALLS_DOC, POLICY_BLOCK)
    config: SelfChallengingConfig
    uses_task_source = False
    roles = (Role("challenger", "explores the tools and writes the tasks", (),
                  by_design="the paper's challenger is the agent itself, which then learns from its own tasks"),)

    def __init__(self, config: SelfChallengingConfig, llm: Any):
        super().__init__(config, llm)
        self.state_mode = config.state_mode()
        self._tasks_path: Path | None = None
        self._kept: dict[str, dict[str, Any]] = {}
        self._examples: list[str] | None = None
        self._start: dict[str, Any] = {}
        self._dedup = NearDuplicateIndex(config.dedup_threshold) if config.dedup_threshold is not None else None

    def tasks(self) -> Iterable[TaskSpec]:
        for i in range(self.config.challenges):
            yield TaskSpec(id=f"challenge-{i:04d}", payload={"index": i})

    def prepare(self, output: Dataset) -> None:
        from envs.sandbox import require_sandbox

        # Before any model call: verifiers are generated code and run only in the sandbox.
        require_sandbox(unsafe_no_sandbox=self.config.sandbox.unsafe_no_sandbox)
        super().prepare(output)
        self._tasks_path = Path(output.path) / TASKS_FILE
        if self._tasks_path.exists():
            for line in self._tasks_path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    self._kept[row["id"]] = row
                    if self._dedup is not None:
                        self._dedup.add(row["id"], row["instruction"])

    async def setup(self) -> None:
        await super().setup()
        if self._examples is None:
            try:
                source = self.envs.tasks()
            except NotImplementedError:
                source = []  # a world without a task generator, and no task file given
            self._examples = [t.instruction for t in source] if self.config.example_tasks else []
            # A world that opens on a page (a browser) needs one: challenges start where the source's first task does.
            self._start = {k: v for k, v in source[0].params.items() if k in ("start_url", "miniwob")} if source else {}

    # ---- environment helpers ------------------------------------------------------------------

    def _task(self, task_id: str, instruction: str, challenge: Challenge | None = None) -> Task:
        goal: dict[str, Any] = {}
        if challenge is not None:  # the solution as reference actions, for replays and step verification
            goal = {"actions": [c.model_dump() for c in challenge.solution], "verifier": challenge.verifier}
            if isinstance(challenge, StateCallChallenge):
                goal["state_calls"] = [c.model_dump() for c in challenge.state_calls]
        return Task(id=task_id, env=self.config.env, instruction=instruction, goal=goal, seed=self.config.seed,
                    params=dict(self._start))

    async def _read_state(self, env: Environment, challenge: Challenge) -> tuple[Any, str | None]:
        """(the state the verifier reads, or None and why it could not be read)."""
        if not isinstance(challenge, StateCallChallenge):
            return env_state(env), None
        values = []
        for n, call in enumerate(challenge.state_calls, 1):
            result = await env.inspect(call.action(f"state_{n}"))
            if result.info.get("error"):
                return None, f"state call {n} ({call.name}) failed: {result.info['error']}"
            values.append(observation_value(result.observation))
        return values, None

    async def _execute(self, calls: list[ToolCall], task: Task, challenge: Challenge, *,
                       check_reads: bool = False) -> tuple[list[Step], Any, list[str], str | None]:
        """Run `calls` in a fresh episode of the world seed: (steps, state, refused-call errors, state problem)."""
        async with self.make_env() as env:
            env.user = None  # scripted calls: no one to talk to
            steps: list[Step] = list(await env.reset(task))
            errors: list[str] = []
            for n, call in enumerate(calls, 1):
                action = call.action(f"call_{n}")
                res = await env.step(action)
                steps += [action, res.observation]
                if res.info.get("error"):
                    errors.append(f"call {n} ({call.name}): {res.info['error']}")
                if res.done:
                    break
            state, problem = await self._read_state(env, challenge)
            if check_reads and problem is None and isinstance(challenge, StateCallChallenge):
                again, problem = await self._read_state(env, challenge)
                if problem is None and again != state:
                    problem = "state calls are not read-only: a second read gave different results"
            return steps, state, errors, problem

    async def verify(self, code: str, state: Any) -> Verdict:
        """Run the verifier in the sandbox from a worker thread (it blocks on a child process)."""
        return await asyncio.to_thread(run_verifier, code, state, self.config.sandbox, lint=self.config.verifier_lint)

    # ---- the pipeline -------------------------------------------------------------------------

    async def run_task(self, task: TaskSpec) -> TaskResult:
        result = TaskResult()
        try:
            await self._run(task, result)
        except LLMRequestError as exc:
            result.fail(task.id, "llm", str(exc), task.model_dump(mode="json"))
        return result

    def _params(self) -> dict[str, Any]:
        t = self.config.challenger_temperature
        return {"temperature": t} if t is not None else {}

    async def _explore(self, index: int, challenge_id: str) -> tuple[list[Step], str]:
        """The challenger's exploration episode: (its steps, what a verifier can read, in words)."""
        async with self.make_env() as env:
            env.user = None  # the challenger explores the tools; no customer answers it
            state_info = STATE_BY_CALLS
            if self.state_mode == "env":
                await env.reset(self._task(f"{challenge_id}-explore", ""))
                state_info = STATE_SHAPE.format(shape=_state_shape(env_state(env)))
            if not self.config.explore_steps:
                return [], state_info
            instruction = EXPLORE_USER.format(index=index + 1, examples=self._example_text(index), state_info=state_info)
            challenger = AgentPolicy(self.model_for("challenger"), self.tools, mode=self.config.agent_mode,
                                     temperature=self.config.challenger_temperature,
                                     system=EXPLORE_SYSTEM.format(env=self.config.env, n=self.config.explore_steps)
                                     + self._policy_block())
            episode = await play_episode(env, challenger, self._task(f"{challenge_id}-explore", instruction),
                                         max_steps=self.config.explore_steps,
                                         max_parse_failures=self.config.max_parse_failures, evaluate=False)
        return episode.steps, state_info

    async def _run(self, task: TaskSpec, result: TaskResult) -> None:
        index = task.payload["index"]
        challenge_id = f"{self.config.env}-s{self.config.seed}-{task.id}"
        explore_steps, state_info = await self._explore(index, challenge_id)
        exploration = self._exploration_text(explore_steps) or "(no calls made)"
        result.counts["exploration_calls"] += sum(1 for s in explore_steps if s.kind == "api")
        calls_mode = self.state_mode == "calls"
        tools_text = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
                               for t in self.tools)
        system = CHALLENGE_SYSTEM.format(env=self.config.env, tools=tools_text,
                                         state_calls=STATE_CALLS_FIELD if calls_mode else "",
                                         state_doc=STATE_CALLS_DOC if calls_mode else STATE_ENV_DOC) + self._policy_block()
        challenge = await self.model_for("challenger").structured(
            [{"role": "system", "content": system},
             {"role": "user", "content": CHALLENGE_USER.format(index=index + 1, state_info=state_info,
                                                               exploration=exploration)}],
            StateCallChallenge if calls_mode else Challenge, **self._params())
        if challenge is None:
            result.fail(task.id, "challenger", "no valid challenge answer", {"exploration": exploration})
            return
        record = {"id": challenge_id, "env": self.config.env, "env_config": self.config.env_config,
                  "state": self.state_mode, **challenge.model_dump(),
                  "exploration": [{"name": s.function, "arguments": s.arguments} for s in explore_steps if s.kind == "api"]}
        env_task = self._task(challenge_id, challenge.instruction, challenge)
        # A near-duplicate of a kept task is dropped before its checks run, and again (no await in between
        # the check and the add) after them: another challenge may have been kept meanwhile.
        if self._drop_duplicate(env_task, record, [], result):
            return
        reason, checks, solution_steps = await self._validate(challenge, env_task)
        if reason is not None:
            scripted = self.scripted(solution_steps, "the challenger's solution, run by the check")
            result.reject(self.trajectory(env_task, "", solution_steps, None, challenge=record, checks=checks, **scripted),
                          "challenge_check", reason)
            result.counts["challenges_rejected"] += 1
            return
        if self._drop_duplicate(env_task, record, checks, result):
            return
        if self._dedup is not None:
            self._dedup.add(challenge_id, challenge.instruction)
        result.counts["challenges_kept"] += 1
        self._keep(record)
        await self._rollouts(env_task, challenge, record, result)

    def _drop_duplicate(self, task: Task, record: dict[str, Any], checks: list[dict[str, Any]], result: TaskResult) -> bool:
        """Filter the task (by "dedup") when its instruction near-duplicates a kept task's."""
        match = self._dedup.match(task.instruction, exclude=task.id) if self._dedup is not None else None
        if match is None:
            return False
        stub = self.trajectory(task, "", [], None, challenge=record, checks=checks, **self.scripted([], ""))
        result.reject(stub, "dedup", f"near-duplicate task: of {match[0]} (similarity {match[1]})")
        result.counts["challenges_duplicate"] += 1
        return True

    def _policy_block(self) -> str:
        """The world's policy for the challenger's prompts (empty where the world has none)."""
        return POLICY_BLOCK.format(policy=self._policy_text.strip()) if self._policy_text else ""

    def _example_text(self, index: int) -> str:
        pool = self._examples or []
        if not pool or not self.config.example_tasks:
            return "(none)"
        rng = random.Random(f"{self.config.seed}-{index}")
        return "\n".join(f"- {t}" for t in rng.sample(pool, min(self.config.example_tasks, len(pool))))

    def _exploration_text(self, steps: list[Step]) -> str:
        lines = []
        for step in steps:  # the challenger's own instructions (system and user text) are not results
            if step.kind == "api":
                lines.append(f"CALL {json.dumps({'name': step.function, 'arguments': step.arguments})}")
            elif step.kind == "message":
                lines.append(f"NOTE {step.content}")
            elif step.kind == "text" and step.source == "environment" and not is_system_step(step):
                lines.append(f"RESULT {_truncate(step.content, self.config.max_observation_chars)}")
        return "\n".join(lines)

    async def _validate(self, challenge: Challenge, task: Task) -> tuple[str | None, list[dict[str, Any]], list[Step]]:
        """(reject reason or None, the checks run with their verdicts, the solution's steps)."""
        checks: list[dict[str, Any]] = []
        steps, state, errors, problem = await self._execute(challenge.solution, task, challenge, check_reads=True)
        if errors:
            return f"solution call failed: {errors[0]}", checks, steps
        if problem is not None:
            return f"{problem} (after the solution)", checks, steps
        verdict = await self.verify(challenge.verifier, state)
        checks.append({"case": "solution", **verdict.model_dump()})
        if verdict.error:
            return verdict.error, checks, steps
        if not verdict.passed:
            return f"solution fails verifier: verify returned {verdict.value}", checks, steps
        for n, case in enumerate(challenge.failure_cases, 1):
            # Refused calls are fine: the state stays unchanged.
            _, case_state, _, problem = await self._execute(case, task, challenge)
            if problem is not None:  # the state the task asks for cannot even be read: not done
                checks.append({"case": f"failure {n}", **Verdict(passed=False, error=f"not done: {problem}").model_dump()})
                continue
            v = await self.verify(challenge.verifier, case_state)
            checks.append({"case": f"failure {n}", **v.model_dump()})
            if v.error:
                return v.error, checks, steps
            if v.passed:
                return f"failure case {n} passes verifier", checks, steps
        return None, checks, steps

    def _keep(self, record: dict[str, Any]) -> None:
        self._kept[record["id"]] = record
        if self._tasks_path is None:
            return
        self._tasks_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tasks-", suffix=".jsonl", dir=self._tasks_path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                for key in sorted(self._kept):
                    f.write(json.dumps(self._kept[key], default=str) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._tasks_path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    async def _rollouts(self, env_task: Task, challenge: Challenge, record: dict[str, Any], result: TaskResult) -> None:
        for k in range(self.config.rollouts):
            # Attempt k is draw k of the agent (its own sampling seed, so its own cache entries): the prompt, the
            # one a trainer sees, stays the task's.
            # A simulated user sees the draw too (as curriculum's attempts), so its answers are its own as well.
            attempt = env_task.model_copy(update={"params": {**env_task.params, "sample": k}}) if k else env_task
            async with self.make_env() as env:
                episode = await play_episode(env, self.policy(draw=k), attempt, max_steps=self.config.max_steps,
                                             max_parse_failures=self.config.max_parse_failures, evaluate=False)
                state, problem = await self._read_state(env, challenge)
            verdict = Verdict(passed=False, error=problem) if problem else await self.verify(challenge.verifier, state)
            evaluation = Evaluation(1.0 if verdict.passed else 0.0, verdict.passed, verdict.reason)
            trajectory = self.trajectory(env_task, f"#{k}", episode.steps, evaluation, parents=[f"{self.name}/{env_task.id}"],
                                         seed=k, challenge=record, verifier=verdict.model_dump(), **episode.details())
            result.counts[f"rollout_{'pass' if verdict.passed else 'fail'}"] += 1
            if not verdict.passed and not self.config.keep_failed:
                result.reject(trajectory, "verifier", verdict.error or f"verifier rejected the final state: {verdict.value}")
                continue
            result.trajectories.append(trajectory)
