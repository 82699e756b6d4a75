"""Self-challenging tasks (Code-as-Task): a challenger explores the tools and writes checkable tasks.

Per task (one challenge each, id `challenge-NNNN`):

1. **explore** — the challenger sees the tools, the shape of the environment state and a few
   example user requests (from the env's task generator, for concrete ids to start from), and
   picks up to `explore_calls` tool calls; they run in the environment and the results are
   shown back.
2. **challenge** — the challenger writes (structured) an instruction, a Python function
   `verify(state) -> bool`, an example solution (a list of tool calls) and exactly three
   failure cases (lists of tool calls that must NOT satisfy the task).
3. **validation** — each call list runs in a fresh environment from the same world seed; the
   resulting state (`env.state()`: for retail, `{table: [row, ...]}` of the tables tools can
   change) goes to `verify` in the sandbox (`envs.sandbox.run_python`: separate process,
   CPU/memory/wall limits, no network, scratch dir, clean environment — generated code never
   runs in this process). The challenge is kept only if the solution's calls all succeed and
   `verify` returns exactly `True` for it, and returns anything but `True` for every failure
   case. Otherwise it is filtered by "challenge_check" with the precise reason:
   "solution call failed: ...", "verifier rejected: ..." (static policy, below), "verifier
   crashed: ...", "sandbox: timeout: ..." (wall or CPU limit; also "sandbox: memory: ...",
   "sandbox: forbidden: ..." for a refused operation), "solution fails verifier: ...",
   "failure case N passes verifier".
   Before any run, a static policy (`verifier_lint`, default on) refuses verifier code that
   imports beyond a short list of pure modules, touches dunder/frame/module attributes, uses
   dynamic-code builtins or assigns attributes. The sandbox already seals its result against
   code it runs; the policy is a second layer that keeps verifiers to reading the state.
4. **rollout** — the agent (`AgentPolicy`) attempts each kept task `rollouts` times; the final
   state of each episode is scored by the task's verifier in the sandbox (reward 1.0 only
   when it returns exactly True, else 0.0; a sandbox failure scores 0 and is recorded).

Kept tasks (instruction, verifier code, solution, failure cases, world seed) are stored in
every rollout's `details["challenge"]` and in `tasks.jsonl` in the output directory (a side
file, rewritten atomically after each kept task, merged with what an earlier run wrote).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import tempfile
from pathlib import Path
from typing import Any, ClassVar, Iterable, Literal

from pydantic import BaseModel, Field

from backends.errors import LLMRequestError
from envs.base import Environment, Task
from generators.agent import AgentPolicy
from generators.base import MAX_TASKS, MethodConfig, TaskResult, TaskSpec
from generators.env_method import EnvMethod, EnvMethodConfig
from generators.registry import register_method
from generators._episode import play_episode
from schemas.models import ApiAction, Step, Tool, Trajectory
from schemas.store import Dataset

TASKS_FILE = "tasks.jsonl"

EXPLORE_SYSTEM = (
    "You are a challenger: you invent realistic, checkable tasks for an AI agent that uses the tools of "
    "the '{env}' environment. First explore the environment. Choose up to {n} tool calls whose results "
    "would help you write a good task (look up users, orders, products). Answer with a JSON object "
    "{{\"thoughts\": str, \"calls\": [{{\"name\": str, \"arguments\": {{...}}}}]}}.\n\nTools (JSON, one per line):\n{tools}"
)
EXPLORE_USER = "EXPLORE FOR CHALLENGE #{index}\nExample requests users make here:\n{examples}\n\nState shape:\n{state_shape}"
CHALLENGE_SYSTEM = (
    "You are a challenger: you write one task for an AI agent in the '{env}' environment, with code that "
    "checks it. Answer with a JSON object with: \"instruction\" (what the user asks, self-contained, with "
    "the ids and details the agent needs), \"verifier\" (Python source defining `def verify(state) -> bool`, "
    "standard library only, returning True exactly when the task is done; `state` is the environment state "
    "after the episode, shaped as shown), \"solution\" (the list of tool calls {{\"name\", \"arguments\"}} "
    "that does the task), \"failure_cases\" (exactly three lists of tool calls that look plausible but must "
    "NOT satisfy the task).\n\nTools (JSON, one per line):\n{tools}"
)
CHALLENGE_USER = (
    "WRITE CHALLENGE #{index}\nState shape:\n{state_shape}\n\nYour exploration:\n{exploration}\n\n"
    "Write a task different from the example requests."
)


class ToolCall(BaseModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Exploration(BaseModel):
    thoughts: str = ""
    calls: list[ToolCall] = Field(default_factory=list)


class Challenge(BaseModel):
    instruction: str = Field(min_length=1)
    verifier: str = Field(min_length=1)
    solution: list[ToolCall] = Field(min_length=1)
    failure_cases: list[list[ToolCall]] = Field(min_length=3, max_length=3)


class SandboxLimits(BaseModel):
    timeout_s: float = Field(5.0, gt=0, description="wall-clock limit per verifier run")
    cpu_s: int = Field(10, ge=1, description="CPU-seconds limit (reported as a timeout too)")
    memory_mb: int = Field(512, ge=32)
    unsafe_no_sandbox: bool = Field(False, description="run verifiers without bubblewrap where it is missing "
                                                       "(seccomp, rlimits and in-process guards only); warns each run")


class SelfChallengingConfig(EnvMethodConfig):
    runtime_fields: ClassVar[dict[str, Any]] = {**MethodConfig.runtime_fields, "sandbox": {"unsafe_no_sandbox": True}}

    method: Literal["self_challenging"] = "self_challenging"
    requires: ClassVar[frozenset[str]] = frozenset({"state"})
    challenges: int = Field(8, ge=1, le=MAX_TASKS, description="challenges to write (one task each)")
    explore_calls: int = Field(3, ge=0)
    example_tasks: int = Field(2, ge=0, description="generated requests shown to the challenger as starting points")
    max_observation_chars: int = Field(1500, ge=100)
    rollouts: int = Field(2, ge=0, description="agent attempts per kept task")
    max_steps: int = Field(15, ge=1)
    challenger_temperature: float | None = None
    keep_failed: bool = Field(True, description="keep rollouts the verifier rejects (reward 0)")
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    verifier_lint: bool = Field(True, description="refuse verifiers that import beyond a short list, touch "
                                                  "dunders/frames or assign attributes (before the sandbox)")


class Verdict(BaseModel):
    """What one sandboxed verifier run said: passed only when verify returned exactly True."""

    passed: bool
    error: str | None = None  # a reason when the run did not produce a verdict
    value: str | None = None  # repr of what verify returned


def env_state(env: Environment) -> Any:
    """The JSON state a verifier sees, from the env's public `state()`."""
    state = getattr(env, "state", None)
    if state is None:
        raise TypeError(f"environment {env.name!r} has no state() to verify against")
    return json.loads(json.dumps(state(), default=str))


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
    from envs.sandbox import run_python

    if lint and (problem := verifier_problem(code)) is not None:
        return Verdict(passed=False, error=f"verifier rejected: {problem}")
    limits = limits or SandboxLimits()
    result = run_python(code, entry="verify", args=[state], timeout_s=limits.timeout_s, cpu_s=limits.cpu_s,
                        memory_mb=limits.memory_mb, unsafe_no_sandbox=limits.unsafe_no_sandbox)
    return verdict_from_sandbox(result)


@register_method
class SelfChallenging(EnvMethod):
    """Code-as-Task: challenger-written tasks with sandbox-checked verifiers, then agent rollouts."""

    name = "self_challenging"
    Config = SelfChallengingConfig
    templates = (EXPLORE_SYSTEM, EXPLORE_USER, CHALLENGE_SYSTEM, CHALLENGE_USER)
    config: SelfChallengingConfig
    uses_task_source = False

    def __init__(self, config: SelfChallengingConfig, llm: Any):
        super().__init__(config, llm)
        self._tasks_path: Path | None = None
        self._kept: dict[str, dict[str, Any]] = {}

    def tasks(self) -> Iterable[TaskSpec]:
        for i in range(self.config.challenges):
            yield TaskSpec(id=f"challenge-{i:04d}", payload={"index": i})

    def prepare(self, output: Dataset) -> None:
        from envs.sandbox import require_sandbox

        # Before any model call: verifiers are generated code and run only in the sandbox.
        require_sandbox(unsafe_no_sandbox=self.config.sandbox.unsafe_no_sandbox)
        self._tasks_path = Path(output.path) / TASKS_FILE
        if self._tasks_path.exists():
            for line in self._tasks_path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    self._kept[row["id"]] = row

    # ---- environment helpers ------------------------------------------------------------------

    def _env(self) -> Environment:
        return self.make_env()

    def _task(self, task_id: str, instruction: str) -> Task:
        return Task(id=task_id, env=self.config.env, instruction=instruction, seed=self.config.seed)

    async def _execute(self, calls: list[ToolCall], task: Task) -> tuple[list[Step], Any, list[str]]:
        """Run `calls` in a fresh env from the world seed: (steps, final state, refused-call errors)."""
        async with self._env() as env:
            steps: list[Step] = list(await env.reset(task))
            errors: list[str] = []
            for n, call in enumerate(calls, 1):
                action = ApiAction(function=call.name, arguments=call.arguments, tool_call_id=f"call_{n}")
                res = await env.step(action)
                steps += [action, res.observation]
                if res.info.get("error"):
                    errors.append(f"call {n} ({call.name}): {res.info['error']}")
                if res.done:
                    break
            return steps, env_state(env), errors

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

    async def _run(self, task: TaskSpec, result: TaskResult) -> None:
        index = task.payload["index"]
        params = {"temperature": self.config.challenger_temperature} if self.config.challenger_temperature is not None else {}
        env = self._env()
        tools = env.tools()
        state_shape = _state_shape(env_state(env))
        examples = self._examples(env, index)
        tools_text = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
                               for t in tools)
        plan = await self.llm.structured(
            [{"role": "system", "content": EXPLORE_SYSTEM.format(env=self.config.env, n=self.config.explore_calls,
                                                                 tools=tools_text)},
             {"role": "user", "content": EXPLORE_USER.format(index=index + 1, examples=examples, state_shape=state_shape)}],
            Exploration, **params)
        if plan is None:
            result.fail(task.id, "challenger", "no valid exploration answer", task.model_dump(mode="json"))
            return
        calls = plan.calls[: self.config.explore_calls]
        explore_steps, _, _ = await self._execute(calls, self._task(f"{task.id}-explore", "(exploration)"))
        exploration = self._exploration_text(explore_steps) or "(no calls made)"
        challenge = await self.llm.structured(
            [{"role": "system", "content": CHALLENGE_SYSTEM.format(env=self.config.env, tools=tools_text)},
             {"role": "user", "content": CHALLENGE_USER.format(index=index + 1, state_shape=state_shape,
                                                               exploration=exploration)}],
            Challenge, **params)
        if challenge is None:
            result.fail(task.id, "challenger", "no valid challenge answer", {"exploration": exploration})
            return
        challenge_id = f"{self.config.env}-s{self.config.seed}-{task.id}"
        record = {"id": challenge_id, "env": self.config.env, "env_config": self.config.env_config,
                  **challenge.model_dump(), "exploration": [c.model_dump() for c in calls]}
        reason, checks, solution_steps = await self._validate(challenge, self._task(challenge_id, challenge.instruction))
        if reason is not None:
            stub = Trajectory(id=f"{self.name}/{challenge_id}", source=self.name, steps=solution_steps, tools=tools,
                              provenance=self.provenance(task.id),
                              details={"challenge": record, "checks": checks})
            result.reject(stub, "challenge_check", reason)
            result.counts["challenges_rejected"] += 1
            return
        result.counts["challenges_kept"] += 1
        self._keep(record)
        await self._rollouts(task, challenge_id, challenge, record, tools, result)

    def _examples(self, env: Environment, index: int) -> str:
        if not self.config.example_tasks:
            return "(none)"
        try:
            pool = env.generate_tasks(max(7, self.config.example_tasks), seed=self.config.seed)
        except NotImplementedError:
            return "(none)"
        rng = random.Random(f"{self.config.seed}-{index}")
        return "\n".join(f"- {t.instruction}" for t in rng.sample(pool, min(self.config.example_tasks, len(pool))))

    def _exploration_text(self, steps: list[Step]) -> str:
        lines = []
        for step in steps[1:]:
            if step.kind == "api":
                lines.append(f"CALL {json.dumps({'name': step.function, 'arguments': step.arguments})}")
            elif step.kind == "text":
                lines.append(f"RESULT {_truncate(step.content, self.config.max_observation_chars)}")
        return "\n".join(lines)

    async def _validate(self, challenge: Challenge, task: Task) -> tuple[str | None, list[dict[str, Any]], list[Step]]:
        """(reject reason or None, the checks run, the solution's steps)."""
        checks: list[dict[str, Any]] = []
        steps, state, errors = await self._execute(challenge.solution, task)
        if errors:
            return f"solution call failed: {errors[0]}", checks, steps
        verdict = await self.verify(challenge.verifier, state)
        checks.append({"case": "solution", **verdict.model_dump()})
        if verdict.error:
            return verdict.error, checks, steps
        if not verdict.passed:
            return f"solution fails verifier: verify returned {verdict.value}", checks, steps
        for n, case in enumerate(challenge.failure_cases, 1):
            _, case_state, _ = await self._execute(case, task)  # refused calls are fine: the state stays unchanged
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

    async def _rollouts(self, task: TaskSpec, challenge_id: str, challenge: Challenge, record: dict[str, Any],
                        tools: list[Tool], result: TaskResult) -> None:
        policy = AgentPolicy(self.llm, tools, mode=self.config.agent_mode, temperature=self.config.agent_temperature)
        env_task = self._task(challenge_id, challenge.instruction)
        for k in range(self.config.rollouts):
            # Later attempts vary the prompt, so cached samples are not simply repeated.
            guidance = None if k == 0 else f"(Attempt {k + 1}.)"
            async with self._env() as env:
                episode = await play_episode(env, policy, env_task, max_steps=self.config.max_steps, guidance=guidance,
                                             evaluate=False)
                state = env_state(env)
            verdict = await self.verify(challenge.verifier, state)
            reward = 1.0 if verdict.passed else 0.0
            trajectory = Trajectory(
                id=f"{self.name}/{challenge_id}#{k}", source=self.name, steps=episode.steps, tools=tools,
                reward=reward, success=verdict.passed,
                provenance=self.provenance(task.id, parents=[f"{self.name}/{challenge_id}"], seed=k),
                details={"challenge": record, "verifier": verdict.model_dump(), "stop_reason": episode.stop_reason,
                         "episode_done": episode.done, "action_errors": episode.action_errors},
            )
            result.counts[f"rollout_{'pass' if verdict.passed else 'fail'}"] += 1
            if not verdict.passed and not self.config.keep_failed:
                result.reject(trajectory, "verifier", verdict.error or f"verifier rejected the final state: {verdict.value}")
                continue
            result.trajectories.append(trajectory)

