"""Episodes an outside agent drives one action at a time: what the OpenEnv server and the TRL environment class
share.

A trainer outside trajforge (OpenEnv's clients, TRL's `environment_factory`) has its own model act; trajforge's
world answers. Each episode is an episode of the `rollout` method played through the one episode loop
(generators/_episode.py) with a `CallerAgent` as its policy: where the loop asks for the next action, the agent
hands the caller what happened since its last action and waits for the caller's next one. So the world, its user,
its step cap, its evaluation and its record are a rollout's: each episode is committed to a trajforge dataset
(`rollout/<task>#<k>`, k counting that task's episodes, on from those the dataset holds), with the token ids the
caller sent with each action (`Usage.tokens`), or quarantined with its reason (a world that broke). An episode the
caller leaves before it ends (a new reset, a closed session, a TRL rollout that ends in text) is evaluated as it
stands (`details.stop_reason: ended`).

The caller speaks to the user (without a user: gives its final answer) through one tool more, `respond`
(`message_tool`), recorded as the agent's message. Records say who acted (`details.driver`); trajforge did not
render the caller's prompts (`details.render` is None), and their system step is the system prompt offered to the
caller (`system_prompt`: the agent instructions and the world's policy), which it may or may not have used.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from backends.registry import make_llm
from converters.export.render import RenderOptions, observation_text
from envs.base import ACTION_KINDS, Task
from envs.spec import uses_method_model
from generators.agent import MAX_HISTORY_CHARS, Proposal
from generators.base import RunSummary, TaskResult, TaskSpec, llm_config_for
from generators.rollout import Rollout
from schemas.models import (ApiAction, MessageAction, Step, TextObservation, Tokens, Tool, Trajectory, Usage,
                            is_system_step, system_step)
from schemas.store import Dataset
from training.episodes import rollout_config

MESSAGE_TOOL = "respond"
INSTRUCTIONS = ("You are an agent that completes the user's task by calling the available tools, one at a time. "
                "To speak to the user, or to give your final answer, call `{tool}`.")
# The opening and each observation as the caller reads them: trajforge's own rendering, pages cut as its agent's.
RENDER = RenderOptions(reasoning=False, web_max_chars=MAX_HISTORY_CHARS)
_CURRENT: contextvars.ContextVar[CallerAgent] = contextvars.ContextVar("caller_agent")


class CallerError(ValueError):
    """A request the caller cannot make (an unknown task, arguments that are not an object): one line."""


@dataclass
class Turn:
    """What the caller gets back: what happened since its last action, and how the episode stands."""

    text: str
    done: bool = False
    reward: float | None = None
    success: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "done": self.done, "reward": self.reward, "success": self.success, **self.info}


class CallerAgent:
    """The episode loop's policy for an outside caller: each proposal is the caller's next action."""

    def __init__(self, system: TextObservation, model: str | None) -> None:
        self.system = system
        self.model = model
        self.actions: asyncio.Queue[ApiAction | MessageAction | None] = asyncio.Queue()
        self.turns: asyncio.Queue[list[Step]] = asyncio.Queue()

    def system_step(self, guidance: str | None = None) -> TextObservation:
        return self.system

    async def propose(self, history: list[Step], *, n: int = 1) -> list[Proposal]:
        self.turns.put_nowait(list(history))  # the caller's turn: what happened so far
        action = await self.actions.get()
        if action is None:  # the caller stopped acting
            return [Proposal(None, "", end=True)]
        return [Proposal(action, "", usage=action.usage)]


class _Driven(Rollout):
    """The rollout method, with the caller of the running episode as its agent."""

    driver = "outside"
    message_tool = MESSAGE_TOOL

    def policy(self, temperature: float | None = None, *, llm: Any = None, draw: int | None = None) -> Any:
        return _CURRENT.get()

    def provenance(self, task_id: str, **kwargs: Any) -> Any:
        agent = _CURRENT.get(None)
        model = agent.model if agent is not None and agent.model else "unknown"
        return super().provenance(task_id, **kwargs).model_copy(update={"model": f"{self.driver}:{model}"})

    def trajectory(self, task: Task, key: str, steps: list[Step], evaluation: Any, **details: Any) -> Trajectory:
        record = super().trajectory(task, key, steps, evaluation, **details)
        # The caller rendered its own prompts: exporters render these records from their steps.
        record.details["render"] = None
        record.details["driver"] = {"kind": self.driver, "system_prompt": "offered to the caller",
                                    "message_tool": self.message_tool}
        return record


class DrivenWorld:
    """One rollout config's world served to outside callers; episodes go to the dataset `output`."""

    def __init__(self, config: dict[str, Any], output: str | Path, *, driver: str,
                 message_tool: str = MESSAGE_TOOL) -> None:
        self.config = rollout_config(config, samples_per_task=2, concurrency=1, unit_tasks=1)
        self.output = Path(output)
        self.driver = driver
        self.message_tool = message_tool
        self.method: _Driven | None = None
        self.store: Dataset | None = None
        self.summary = RunSummary("rollout", env=self.config.env)
        self.episodes: Counter[str] = Counter()  # per task: its episodes so far (the next one's k)
        self.sessions: weakref.WeakSet[DrivenSession] = weakref.WeakSet()
        # Told of each episode that ended (its last turn): progress lines.
        self.on_episode: Callable[[Turn], None] | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Open the dataset, load the tasks, start the world (an MCP server lists its tools)."""
        store = Dataset.create(self.output, stage=f"envs:{self.driver}", config_hash=self.config.output_hash())
        store.recover()
        llm = make_llm(llm_config_for(self.config, self.output)) if uses_method_model(self.config) else None
        method = _Driven(self.config, llm)
        method.driver, method.message_tool = self.driver, self.message_tool
        method.prepare(store)
        await method.setup()
        self.method, self.store = method, store
        if not method.env_tasks():
            raise ValueError("the config's task source gave no tasks")
        if any(t.name == self.message_tool for t in method.tools):
            raise ValueError(f"the world has a tool named {self.message_tool!r}, the name of the message tool: "
                             "choose another (--message-tool, message_tool=)")
        for unit in store.finished_units().values():  # a dataset served before: k goes on from its episodes
            for spec_id in unit.get("meta", {}).get("task_ids", []):
                task_id, _, k = spec_id.rpartition("#")
                if k.isdigit():
                    self.episodes[task_id] = max(self.episodes[task_id], int(k) + 1)
        if llm is not None:
            self.summary.roles = method.roles_report()

    @property
    def tasks(self) -> list[Task]:
        assert self.method is not None, "start() first"
        return list(self.method.env_tasks().values())

    def tools(self) -> list[Tool]:
        """The world's tools as the caller sees them, the message tool last."""
        assert self.method is not None, "start() first"
        return [*self.method.tools, self.message_tool_spec()]

    def message_tool_spec(self) -> Tool:
        assert self.method is not None
        has_user = self.config.user.kind != "none" and self.method._user_kind is not None
        what = ("Send a message to the user; the result is the user's answer." if has_user else
                "Give your final answer; this ends the episode.")
        return Tool(name=self.message_tool, description=what, parameters={
            "type": "object", "properties": {"content": {"type": "string", "description": "the message"}},
            "required": ["content"]})

    def system_prompt(self) -> str:
        """The system prompt offered to callers: how to act here, then the world's policy where it has one."""
        assert self.method is not None
        instructions = INSTRUCTIONS.format(tool=self.message_tool)
        policy = self.method._policy_text
        return f"{instructions}\n\n# Policy\n{policy}" if policy else instructions

    def task(self, *, task: str | None = None, index: int | None = None, seed: int | None = None) -> Task:
        """The task a reset asks for: by id, by index, by seed (index seed mod the task count), else the task with
        the fewest episodes so far."""
        tasks = self.tasks
        if task is not None:
            found = self.method.env_tasks().get(task) if self.method else None
            if found is None:
                raise CallerError(f"task {task!r} is not one of the config's {len(tasks)} tasks")
            return found
        if index is not None:
            if not 0 <= index < len(tasks):
                raise CallerError(f"task index {index} is out of range (0 to {len(tasks) - 1})")
            return tasks[index]
        if seed is not None:
            return tasks[seed % len(tasks)]
        return min(tasks, key=lambda t: self.episodes[t.id])

    def session(self, model: str | None = None) -> DrivenSession:
        session = DrivenSession(self, model)
        self.sessions.add(session)
        return session

    async def play(self, task: Task, agent: CallerAgent) -> TaskResult:
        """One episode of `task` with `agent` acting, committed when it ends."""
        assert self.method is not None and self.store is not None
        k = self.episodes[task.id]
        self.episodes[task.id] += 1
        spec = TaskSpec(id=f"{task.id}#{k}", instruction=task.instruction, payload={"task": task.id, "sample": k})
        _CURRENT.set(agent)  # this task's context: the method's policy() finds the caller
        result = await self.method._safe_run(spec)
        async with self._lock:
            self.method._commit(self.store, [(spec, result)], self.summary)
            self.summary.processed += 1
        return result

    async def close(self) -> dict[str, Any]:
        """End the episodes still running (evaluated as they stand), stop the world, mark the dataset complete;
        the counts."""
        for session in list(self.sessions):
            await session.end()
        if self.method is not None:
            await self.method.teardown()
            if self.method.llm is not None:
                await self.method.llm.aclose()
        counts = dict(self.store.unit_counts()) if self.store is not None else {}
        if self.store is not None:
            self.store.mark_complete(counts)
        return counts


class DrivenSession:
    """One caller's episodes, one at a time: reset, then actions until the episode ends."""

    def __init__(self, world: DrivenWorld, model: str | None = None) -> None:
        self.world = world
        self.model = model
        self.agent: CallerAgent | None = None
        self.episode: asyncio.Task[TaskResult] | None = None
        self.task: Task | None = None
        self.shown = 0  # steps of the history the caller has seen
        self.actions = 0
        self.last: Turn | None = None
        self._lock = asyncio.Lock()  # one request at a time: a reset, an action, the end

    @property
    def done(self) -> bool:
        return self.episode is None or self.episode.done()

    async def reset(self, *, task: str | None = None, index: int | None = None, seed: int | None = None,
                    model: str | None = None) -> Turn:
        """A fresh episode (the one running, if any, ends first); its opening: the user's request, a first page."""
        chosen = self.world.task(task=task, index=index, seed=seed)
        await self.end()
        async with self._lock:
            return await self._start(chosen, model)

    async def _start(self, chosen: Task, model: str | None) -> Turn:
        self.model = model or self.model
        self.agent = CallerAgent(system_step(self.world.system_prompt()), self.model)
        self.task, self.shown, self.actions = chosen, 0, 0
        self.episode = asyncio.create_task(self.world.play(chosen, self.agent))
        return await self._next()

    async def step(self, name: str, arguments: Any, tokens: dict[str, Any] | None = None) -> Turn:
        """One action: a call of one of the world's tools, or of the message tool; the world's answer."""
        async with self._lock:
            return await self._act(name, arguments, tokens)

    async def _act(self, name: str, arguments: Any, tokens: dict[str, Any] | None) -> Turn:
        if self.agent is None or self.task is None:
            raise CallerError("no episode: reset first")
        if self.done:
            assert self.last is not None
            return Turn("Error: the episode is over", True, self.last.reward, self.last.success,
                        {**self.last.info, "error": "the episode is over"})
        if not isinstance(arguments, dict):
            raise CallerError(f"the arguments of {name!r} are not a JSON object")
        usage = Usage(model=self.model, tokens=caller_tokens(tokens, self.model)) if tokens else None
        if name == self.world.message_tool:
            action: ApiAction | MessageAction = MessageAction(content=str(arguments.get("content") or ""), usage=usage)
        else:
            action = ApiAction(function=name, arguments=arguments, usage=usage)
        self.actions += 1
        self.agent.actions.put_nowait(action)
        return await self._next()

    async def end(self) -> Turn | None:
        """Stop acting: the running episode ends where it stands, evaluated and recorded; its last turn."""
        async with self._lock:
            if self.agent is None or self.done:
                return self.last
            self.agent.actions.put_nowait(None)
            return await self._next()

    def state(self) -> dict[str, Any]:
        """The episode's state: task, record, actions, done, reward, the world's tools."""
        info = dict(self.last.info) if self.last is not None else {}
        return {**info, "task": self.task.id if self.task else None, "actions": self.actions, "done": self.done,
                "reward": self.last.reward if self.last else None}

    async def _next(self) -> Turn:
        """The caller's next turn: the loop asks for an action again, or the episode ended."""
        assert self.agent is not None and self.episode is not None and self.task is not None
        waiting = asyncio.ensure_future(self.agent.turns.get())
        await asyncio.wait({waiting, self.episode}, return_when=asyncio.FIRST_COMPLETED)
        if waiting.done():
            history = waiting.result()
            turn = Turn(self._shown(history), info=self._info())
        else:
            waiting.cancel()
            turn = self._told(self._ended(self.episode.result()))
        self.last = turn
        return turn

    def _shown(self, steps: list[Step]) -> str:
        """The steps the caller has not seen yet as text (system step and the caller's own actions left out)."""
        new = [s for s in steps[self.shown:] if s.kind not in ACTION_KINDS and not is_system_step(s)]
        self.shown = len(steps)
        return "\n\n".join(observation_text(s, RENDER) for s in new)

    def _info(self) -> dict[str, Any]:
        assert self.task is not None
        return {"task": self.task.id, "actions": self.actions}

    def _ended(self, result: TaskResult) -> Turn:
        record = next(iter([*result.trajectories, *(f.record for f in result.filtered)]), None)
        info = self._info()
        if record is None:  # the world, its user or its judge failed: quarantined with the reason
            error = "; ".join(f"{q.stage}: {q.error}" for q in result.quarantined) or "no record"
            return Turn(f"Error: the episode failed ({error})", True, None, None, {**info, "error": error})
        info.update(record=record.id, stop_reason=record.details.get("stop_reason"),
                    reason=(record.details.get("evaluation") or {}).get("reason"))
        return Turn(self._shown(record.steps), True, record.reward, record.success, info)

    def _told(self, turn: Turn) -> Turn:
        if turn.done and self.world.on_episode is not None:
            self.world.on_episode(turn)
        return turn


def caller_tokens(tokens: dict[str, Any], model: str | None) -> Tokens:
    """The token ids a caller sent with an action (`prompt_ids`, `completion_ids`, optional `logprobs`)."""
    try:
        return Tokens(prompt_ids=list(tokens["prompt_ids"]), completion_ids=list(tokens["completion_ids"]),
                      logprobs=list(tokens["logprobs"]) if tokens.get("logprobs") is not None else None,
                      tokenizer=tokens.get("tokenizer") or model)
    except (KeyError, TypeError, ValueError) as exc:
        why = f"missing {exc}" if isinstance(exc, KeyError) else re.sub(r"\s+", " ", str(exc))[:200]
        raise CallerError(f"token ids: give prompt_ids, completion_ids and optionally logprobs ({why})") from None
