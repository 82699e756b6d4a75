"""SimulatedEnv: an LLM plays the environment (tool results, user turns, page states) for any tool list.

Simia-RL / UI-Simulator style. The environment is given tool specs (`Tool`s or OpenAI-style
function dicts), a policy text (the rules the simulated world enforces, e.g. a tau-bench
policy, or a site description in web mode) and optional seed trajectories (examples of
realistic outputs). Users can so simulate their own APIs without implementing them:

    env = make_env("simulated", tools=[...], policy="...", llm=LLMConfig(...) | llm, seeds=[...])

Each `astep` sends the task, the history and the agent's action to the model and asks
(structured output) for `{observation, done}` — in `mode="web"` for the next page
`{url, axtree, done}`, returned as a `WebObservation`. What never needs a model call does
not get one: an api action naming an unknown tool or with arguments that fail the tool's
JSON Schema gets an error observation at once (the state is unchanged); code actions are
refused. The episode ends when the model says `done`, when a simulated user turn carries the
`###STOP###` marker, after `max_steps` actions, or (web mode) when the agent answers with a
message. The reward is an LLM judge's `{reasoning, reward}` over the transcript, from the
async `aevaluate()` (drivers call it once at the end; the sync `evaluate()` returns the last
judged reward and raises if there is none). The env is async only: `reset`/`step` raise.
A snapshot is the (immutable) task + history, so restoring is cheap and repeatable.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from backends.base import LLM
from backends.config import LLMConfig
from envs.base import Environment, Snapshot, StepResult, Task, action_kind, error_observation
from envs.simulated import prompts as P
from schemas.models import Action, ApiAction, MessageAction, Observation, Step, TextObservation, Tool, Trajectory, WebObservation
from schemas.toolcalls import call_problem

Mode = Literal["tool", "web"]


class SimulationError(RuntimeError):
    """The simulator model gave no usable answer (invalid output or a failed request; see the LLM ledger)."""


class ToolTurn(BaseModel):
    """The simulator's answer in tool mode: a tool result or a user turn, and whether the episode ends."""

    observation: str
    done: bool


class PageTurn(BaseModel):
    """The simulator's answer in web mode: the next page state."""

    url: str
    axtree: str = Field(description="the accessibility tree as JSON text")
    done: bool


class Judgement(BaseModel):
    reasoning: str
    reward: float


@dataclass(frozen=True)
class _State:
    """Everything an episode is; immutable, so a snapshot shares it safely."""

    task: Task | None = None
    history: tuple[Step, ...] = ()
    actions: int = 0
    done: bool = False


def _as_tool(value: Tool | dict[str, Any]) -> Tool:
    if isinstance(value, Tool):
        return value
    if value.get("type") == "function" and isinstance(value.get("function"), dict):
        value = value["function"]  # the OpenAI `tools=[...]` wire format
    return Tool(name=value["name"], description=value.get("description"), parameters=value.get("parameters"))


def _load_seeds(seeds: list[Any]) -> list[Trajectory]:
    """Seeds as Trajectory objects, dicts, or paths (a dataset directory or an interlingua JSONL file)."""
    out: list[Trajectory] = []
    for seed in seeds:
        if isinstance(seed, Trajectory):
            out.append(seed)
        elif isinstance(seed, dict):
            out.append(Trajectory.model_validate(seed))
        else:
            path = Path(seed)
            if path.is_dir():
                from schemas.store import Dataset

                out.extend(Dataset.open(path).iter_records())
            else:
                out.extend(Trajectory.model_validate_json(line) for line in path.read_text().splitlines() if line.strip())
    return out


def _as_axtree(text: str) -> str:
    """Compact JSON when the model wrote valid JSON (the usual case), else its text unchanged."""
    try:
        return json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
    except (ValueError, TypeError):
        return text


class SimulatedEnv(Environment):
    """An environment whose every reaction is written by an LLM under a policy; works for any tool list."""

    name = "simulated"

    def __init__(
        self,
        tools: list[Tool | dict[str, Any]] | None = None,
        policy: str = "",
        llm: LLM | LLMConfig | dict[str, Any] | None = None,
        seeds: list[Any] | None = None,
        mode: Mode = "tool",
        tasks: list[str | dict[str, Any]] | None = None,
        start_page: dict[str, str] | None = None,
        max_steps: int = 30,
        max_history_chars: int = 12_000,
        max_example_chars: int = 6_000,
        seed: int = 0,
    ) -> None:
        if mode not in ("tool", "web"):
            raise ValueError(f"mode must be 'tool' or 'web', not {mode!r}")
        if mode == "tool" and not tools:
            raise ValueError("a simulated tool environment needs tools=[...] (Tool objects or JSON Schema dicts)")
        self.mode: Mode = mode
        self._tools = [_as_tool(t) for t in tools] if tools else list(P.DEFAULT_WEB_TOOLS)
        self.policy = policy.strip() or "(no special rules)"
        self.seeds = _load_seeds(list(seeds or []))
        self.task_pool = list(tasks or [])
        self.start_page = start_page
        self.max_steps = max_steps
        self.max_history_chars = max_history_chars
        self.seed = seed
        self._own_llm = llm is not None and not isinstance(llm, LLM)
        self._llm_source = llm
        self._llm: LLM | None = llm if isinstance(llm, LLM) else None
        self._state = _State()
        # The last judgement: (history length it judged, reward, reasoning); evaluate() returns it.
        self._judged: tuple[int, float, str] | None = None
        template = P.WEB_SYSTEM if mode == "web" else P.TOOL_SYSTEM
        self._system = template.format(policy=self.policy, tools=P.tools_block(self._tools),
                                       examples=P.examples_block(self.seeds, max_example_chars))

    # ---- configuration ------------------------------------------------------------------------

    @property
    def llm(self) -> LLM:
        if self._llm is None:
            if self._llm_source is None:
                raise ValueError("the simulated environment needs llm=LLMConfig(...) or an LLM instance")
            from backends.registry import make_llm

            self._llm = make_llm(self._llm_source)  # type: ignore[arg-type]
        return self._llm

    def tools(self) -> list[Tool]:
        return list(self._tools)

    @property
    def task(self) -> Task | None:
        return self._state.task

    @property
    def history(self) -> list[Step]:
        return list(self._state.history)

    @property
    def done(self) -> bool:
        return self._state.done

    def generate_tasks(self, n: int, seed: int = 0) -> list[Task]:
        """`n` tasks cycled from the configured `tasks=[...]` (strings or Task-like dicts), shuffled by `seed`."""
        if not self.task_pool:
            raise NotImplementedError("the simulated environment generates tasks only from tasks=[...] in its config")
        pool = list(self.task_pool)
        random.Random(f"simulated-tasks-{seed}").shuffle(pool)
        out: list[Task] = []
        for i in range(n):
            item = pool[i % len(pool)]
            data = {"instruction": item} if isinstance(item, str) else dict(item)
            data.setdefault("id", f"simulated-s{seed}-{i:04d}")
            data["env"] = self.name
            data.setdefault("seed", seed)
            out.append(Task.model_validate(data))
        return out

    # ---- the sync API is refused: every reaction is a model call -------------------------------

    def reset(self, task: Task) -> Observation:
        raise RuntimeError("SimulatedEnv is async (its reactions are model calls): use `await env.areset(task)`")

    def step(self, action: Action) -> StepResult:
        raise RuntimeError("SimulatedEnv is async (its reactions are model calls): use `await env.astep(action)`")

    def evaluate(self) -> float:
        if self._judged is None or self._judged[0] != len(self._state.history):
            raise RuntimeError("SimulatedEnv's reward comes from an LLM judge: use `await env.aevaluate()`")
        return self._judged[1]

    # ---- episodes -----------------------------------------------------------------------------

    async def areset(self, task: Task) -> Observation:
        self._judged = None
        if self.mode == "tool":
            # The user's first message is the task's request itself: no model call needed.
            first: Observation = TextObservation(content=task.instruction, source="user")
        else:
            first = await self._start_page(task)
        self._state = _State(task=task, history=(first,))
        return first

    async def _start_page(self, task: Task) -> WebObservation:
        page = task.params.get("start_page") or self.start_page
        if page:
            return WebObservation(url=page.get("url"), axtree=_as_axtree(page.get("axtree", "")))
        answer = await self._ask(P.WEB_START.format(task=P.task_block(task)), PageTurn)
        return WebObservation(url=answer.url, axtree=_as_axtree(answer.axtree))

    async def astep(self, action: Action) -> StepResult:
        state = self._state
        if state.task is None:
            raise RuntimeError("call `await env.areset(task)` before astep()")
        if state.done:
            return StepResult(error_observation("the episode is over"), 0.0, True, {"error": "the episode is over"})
        result = await self._react(state, action)
        actions = state.actions + 1
        if not result.done and actions >= self.max_steps:
            result.done = True
            result.info["truncated"] = True
        self._state = replace(state, history=state.history + (action, result.observation), actions=actions,
                              done=result.done)
        return result

    async def _react(self, state: _State, action: Action) -> StepResult:
        if isinstance(action, ApiAction):
            ids = {"tool_call_id": action.tool_call_id}
            problem = call_problem(self._tools, action.function, action.arguments)
            if problem is not None:
                # Checked locally: a schema violation needs no model call and changes nothing.
                return StepResult(error_observation(problem, name=action.function, **ids), info={"error": problem})
            if self.mode == "web":
                return await self._page(state, action)
            answer = await self._ask(self._tool_prompt(state, action, "the tool's output (JSON or text)"), ToolTurn)
            obs = TextObservation(content=answer.observation, source="environment", name=action.function, **ids)
            return StepResult(obs, done=answer.done)
        if isinstance(action, MessageAction):
            if self.mode == "web":
                # A message is the agent's final answer on a web task (WebArena's `stop`).
                return StepResult(TextObservation(content="The answer was submitted.", source="environment"),
                                  done=True, info={"answer": action.content})
            answer = await self._ask(self._tool_prompt(state, action, "the user's reply"), ToolTurn)
            done = answer.done or P.STOP in answer.observation
            return StepResult(TextObservation(content=answer.observation, source="user"), done=done)
        reason = f"{action_kind(action)} actions are not supported here; call a tool or send a message"
        return StepResult(error_observation(reason), info={"error": reason})

    def _tool_prompt(self, state: _State, action: Action, what: str) -> str:
        assert state.task is not None
        return P.TOOL_USER.format(task=P.task_block(state.task), history=self._history_text(state.history),
                                  action=P.step_line(action), what=what)

    async def _page(self, state: _State, action: ApiAction) -> StepResult:
        assert state.task is not None
        prompt = P.WEB_USER.format(task=P.task_block(state.task), history=self._history_text(state.history),
                                   action=P.step_line(action))
        answer = await self._ask(prompt, PageTurn)
        obs = WebObservation(url=answer.url, axtree=_as_axtree(answer.axtree), tool_call_id=action.tool_call_id)
        return StepResult(obs, done=answer.done)

    def _history_text(self, history: tuple[Step, ...]) -> str:
        return P.history_block(history, self.max_history_chars)

    async def _ask(self, prompt: str, schema: type[BaseModel]) -> Any:
        answer = await self.llm.structured([{"role": "system", "content": self._system},
                                            {"role": "user", "content": prompt}], schema)
        if answer is None:
            raise SimulationError(f"no valid {schema.__name__} from the simulator model (invalid output or failed request)")
        return answer

    # ---- reward -------------------------------------------------------------------------------

    async def aevaluate(self) -> float:
        """The judge's reward in [0, 1] for the episode so far (one model call, reused until the history grows)."""
        state = self._state
        if state.task is None:
            return 0.0
        if self._judged is not None and self._judged[0] == len(state.history):
            return self._judged[1]
        prompt = P.JUDGE_USER.format(task=P.task_block(state.task), history=self._history_text(state.history))
        verdict = await self.llm.structured([{"role": "system", "content": P.JUDGE_SYSTEM.format(policy=self.policy)},
                                             {"role": "user", "content": prompt}], Judgement)
        if verdict is None:
            raise SimulationError("no valid judgement from the judge model (invalid output or failed request)")
        reward = min(1.0, max(0.0, float(verdict.reward)))
        self._judged = (len(state.history), reward, verdict.reasoning)
        return reward

    @property
    def judgement(self) -> dict[str, Any] | None:
        """The last judge verdict, for trajectory details."""
        if self._judged is None:
            return None
        return {"reward": self._judged[1], "reasoning": self._judged[2]}

    # ---- state --------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        return Snapshot(self.name, self._state)

    def restore(self, snapshot: Snapshot) -> None:
        self._check_snapshot(snapshot)
        assert isinstance(snapshot.payload, _State)
        self._state = snapshot.payload
        self._judged = None

    async def aclose(self) -> None:
        if self._own_llm and self._llm is not None:
            llm, self._llm = self._llm, None
            await llm.aclose()

    def close(self) -> None:
        """Close an LLM this env made itself (a passed-in LLM belongs to the caller)."""
        if not (self._own_llm and self._llm is not None):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run(self.aclose())
            return
        self._closing = loop.create_task(self.aclose())  # keep a reference until it finishes
