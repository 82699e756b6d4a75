"""The one environment contract every generation method drives.

An environment is a world an agent acts in; it does not know who acts in it (a model, a script,
a replay). Everything is async, on every environment, built-in ones too:

    async with make_env("retail") as env:          # start(): connect a server, launch a browser
        first = await env.reset(task)               # a fresh episode of `task`
        result = await env.step(action)             # one agent action -> StepResult
        verdict = await env.evaluate()              # Evaluation(reward, success, reason, details)

The base class keeps the episode's bookkeeping once for every world: the task, the history of
(action, observation) steps, the step cap, refusing actions after the end, and the user. It cuts
every observation longer than `max_observation_chars` where it leaves the world (schemas/cut.py):
the agent, the record and the exports see the same cut, the whole text stays with the record. The
user is a component of its own (`UserSimulator`): when the agent sends a message and the episode
has a user, the user answers it; the world only ever sees tool calls (and, where it has no user,
the agent's final message). Subclasses implement `_reset`, `_act` and `_evaluate`.

Branching: a world that can copy itself declares `can_snapshot` and implements `_snapshot_world`
/ `_restore_world`; any other world (a real server, a browser) is restored by *replay*: a fresh
episode of the same task replays the recorded actions (`replay`), user turns taken from the
record instead of asking the user again. `Checkpoint` + `restore` pick the right one, so search
methods work with both.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field

from schemas.cut import DEFAULT_MAX_OBSERVATION_CHARS, cut_observation
from schemas.models import Action, ApiAction, CodeAction, MessageAction, Observation, Step, TextObservation, Tool

ACTION_KINDS = ("api", "code", "message")
USER_STOP = "###STOP###"


class EnvError(RuntimeError):
    """The world itself failed (a server died or hung, a browser crashed): the episode cannot go on."""


class UnrunnableTask(EnvError):
    """A task this environment cannot run (`metadata.unrunnable`, or a set-up it has no means for): its
    episodes are quarantined with the reason, the other tasks run."""


def refuse_unrunnable(task: Task) -> None:
    """UnrunnableTask for a task its source marked `metadata.unrunnable` (the reason said)."""
    if task.metadata.get("unrunnable"):
        raise UnrunnableTask(f"task {task.id} cannot run: {task.metadata['unrunnable']}")


GIVEN = {"given": "message_history"}


def history_steps(messages: Sequence[dict[str, Any]]) -> list[Step]:
    """A task's conversation so far (`params.message_history`: {role, content, tool_calls?, tool_call_id?})
    as context steps (`train=False`: nobody's turn to learn from; `extra.given`: the world replays their calls
    at reset, a replay of the record skips them). The user's own tool calls and their
    results happen on the user's side: the world replays them, the agent never saw them."""
    steps: list[Step] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "user":
            if content:
                steps.append(TextObservation(content=content, source="user", train=False, extra=dict(GIVEN)))
        elif role == "assistant":
            calls = message.get("tool_calls") or []
            for n, call in enumerate(calls):
                steps.append(ApiAction(function=call["name"], arguments=call.get("arguments") or {}, train=False,
                                       tool_call_id=call.get("id") or None, extra=dict(GIVEN),
                                       thought=(content or None) if n == 0 else None))
            if content and not calls:
                steps.append(MessageAction(content=content, train=False, extra=dict(GIVEN)))
        elif message.get("requestor", "assistant") == "assistant":
            steps.append(TextObservation(content=content, source="environment", train=False, extra=dict(GIVEN),
                                         tool_call_id=message.get("tool_call_id") or None))
    return steps


class Task(BaseModel):
    """One episode's specification: what the user wants and how success is judged.

    `params` configures the world (e.g. its seed); `goal` is what the environment's checker
    compares against (a goal state, reference actions, tau2-style criteria, a page check);
    `metadata` holds what the agent must not see (e.g. what a simulated user knows, the split).
    """

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    env: str = Field(min_length=1)
    instruction: str
    params: dict[str, Any] = Field(default_factory=dict)
    goal: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0
    metadata: dict[str, Any] = Field(default_factory=dict)


@dataclass
class StepResult:
    """What one action produced: the next observation, whether the episode ended, extras.

    `info["error"]` is set when the action was refused (unknown tool, bad arguments, a business
    rule, a tool error); `info["truncated"]` when the step cap ended the episode.
    """

    observation: Observation
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Evaluation:
    """The outcome of an episode: reward in [0, 1], success, why, and each criterion's verdict."""

    reward: float
    success: bool
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"reward {self.reward} is outside [0, 1]")

    @classmethod
    def of(cls, reward: float, reason: str, **details: Any) -> Evaluation:
        """An evaluation whose success means full reward."""
        reward = min(1.0, max(0.0, float(reward)))
        return cls(reward, reward >= 1.0, reason, details)

    def as_dict(self) -> dict[str, Any]:
        return {"reward": self.reward, "success": self.success, "reason": self.reason, "details": self.details}


@dataclass(frozen=True)
class Snapshot:
    """An opaque, immutable copy of an environment's full state (world + episode)."""

    env: str
    payload: Any


class UserReply(BaseModel):
    text: str
    stop: bool = False
    # Calls of the user's own tools (dual control, tau2 telecom): {name, arguments}, made on the world before
    # the user is asked again; the reply with none is the user's message.
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)


# A user's tool calls in one turn at most (a user model that loops on its tools ends its turn).
MAX_USER_TOOL_CALLS = 8


class UserSimulator(ABC):
    """The person the agent serves. Stateless: it answers from the task and the conversation so far,
    so snapshots, replays and caches need nothing from it."""

    kind: ClassVar[str] = "abstract"
    # The user's own tools in this world (dual control): set by the environment at reset; empty in most worlds.
    tools: list[Tool] = []

    async def opening(self, task: Task) -> str:
        """The user's first message (by default the task's instruction)."""
        return task.instruction

    @abstractmethod
    async def reply(self, task: Task, conversation: Sequence[Step]) -> UserReply:
        """The answer to the agent's last message (`conversation[-1]`); `stop` when the user leaves."""

    async def aclose(self) -> None:
        """Release what the user holds (its own model client)."""


@dataclass(frozen=True)
class Capabilities:
    """What `trajforge envs` lists: how the world branches, who the user is, what evaluates."""

    restore: Literal["snapshot", "replay"]
    user: str
    evaluation: str


@dataclass
class _Episode:
    task: Task
    key: str
    history: list[Step]
    actions: int = 0
    done: bool = False


class Environment(ABC):
    """A world an agent acts in; see the module doc for the contract."""

    name: ClassVar[str] = "abstract"
    can_snapshot: ClassVar[bool] = False
    # How the outcome is checked, in words (goal state, reference actions, a verification tool, a judge).
    evaluation: ClassVar[str] = "none"
    # Longest observation text handed out whole (None: no limit); the run's config sets it (EnvSpec).
    max_observation_chars: int | None = DEFAULT_MAX_OBSERVATION_CHARS

    def __init__(self, *, max_steps: int = 50, user: UserSimulator | None = None, policy: str | None = None) -> None:
        self.max_steps = max_steps
        self.user = user
        # The rules the agent must follow here (a domain policy): the agent's system prompt carries it.
        self.policy = policy
        self._episode: _Episode | None = None
        self.replays = 0  # replay-restores, for run summaries

    # ---- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Acquire what the world needs (a server connection, a browser); idempotent."""

    async def close(self) -> None:
        """Release everything the world holds; the environment may be started again."""

    async def __aenter__(self) -> Environment:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @classmethod
    def offers(cls, config: dict[str, Any]) -> set[str]:
        """What this world offers methods, given its config: `pages` (web observations), `state` (a JSON
        state a verifier can read, `state()`), `generator` (its own task generator), `snapshot`."""
        out = {"snapshot"} if cls.can_snapshot else set()
        if callable(getattr(cls, "state", None)):
            out.add("state")
        if cls.generate_tasks is not Environment.generate_tasks:
            out.add("generator")
        return out

    def capabilities(self) -> Capabilities:
        user = self.user.kind if self.user is not None else "none"
        return Capabilities("snapshot" if self.can_snapshot else "replay", user, self.evaluation)

    # ---- what subclasses implement --------------------------------------------------------------

    @abstractmethod
    def tools(self) -> list[Tool]:
        """The tools the agent may call, each with a JSON Schema of its parameters (after start())."""

    @abstractmethod
    async def _reset(self, task: Task) -> Observation | None:
        """Put the world in `task`'s initial state; its first observation (a page), or None."""

    @abstractmethod
    async def _act(self, action: Action) -> StepResult:
        """Apply one action the user does not handle (a tool call; a final message where there is no user)."""

    @abstractmethod
    async def _evaluate(self, task: Task, history: Sequence[Step]) -> Evaluation:
        """The outcome of the episode so far."""

    def _snapshot_world(self) -> Any:
        raise NotImplementedError(f"{self.name} cannot snapshot its state; it is restored by replay")

    def _restore_world(self, payload: Any) -> None:
        raise NotImplementedError(f"{self.name} cannot snapshot its state; it is restored by replay")

    def generate_tasks(self, n: int, seed: int = 0) -> list[Task]:
        """Deterministic tasks from the world's own generator; worlds without one raise."""
        raise NotImplementedError(f"environment {self.name!r} has no task generator; give tasks from a file")

    async def reference_solution(self, task: Task) -> list[Action] | None:
        """Actions that solve `task` where it knows them, else None.

        By default a task's reference tool calls (`goal["actions"]`, as `{function|name, arguments}`),
        then a message telling the user what they must hear (`goal["communicate_info"]` or `outputs`).
        """
        refuse_unrunnable(task)
        refs = task.goal.get("actions")
        if not isinstance(refs, list):
            return None
        # A user-side action (tau2's requestor: user, dual control) is the user's to make: marked so.
        actions: list[Action] = [ApiAction(function=a.get("function") or a["name"], arguments=a.get("arguments") or {},
                                           extra={"requestor": "user"} if a.get("requestor") == "user" else {})
                                 for a in refs]
        info = [str(x) for x in (task.goal.get("communicate_info") or task.goal.get("outputs") or [])]
        told = f" {'; '.join(info)}." if info else ""
        actions.append(MessageAction(content=f"Your request has been processed.{told} Is there anything else?"))
        return actions

    # ---- the episode ----------------------------------------------------------------------------

    @property
    def task(self) -> Task | None:
        return self._episode.task if self._episode else None

    @property
    def history(self) -> list[Step]:
        """The episode's steps: the first observation(s), then each action and its observation."""
        return list(self._episode.history) if self._episode else []

    @property
    def done(self) -> bool:
        return self._episode.done if self._episode else False

    @property
    def episode_key(self) -> str:
        """A key unique to this episode (e.g. to isolate server-side state between episodes)."""
        if self._episode is None:
            raise RuntimeError("no episode: call reset(task) first")
        return self._episode.key

    async def reset(self, task: Task) -> list[Step]:
        """Start a fresh episode of `task`; returns its opening steps.

        An episode always opens with the user's request (the user's own first message, or the
        task's instruction), then the world's first observation where it has one (a page).
        """
        if task.env != self.name:
            raise ValueError(f"task {task.id} is for {task.env!r}, not {self.name!r}")
        refuse_unrunnable(task)
        self._episode = _Episode(task, f"{task.id}/{uuid.uuid4().hex[:12]}", [])
        page = await self._reset(task)
        # A task may start mid-conversation (tau2's message_history): the user speaks next unless it spoke last.
        opening: list[Step] = history_steps(task.params.get("message_history") or [])
        if not opening or not (opening[-1].kind == "text" and opening[-1].source == "user"):
            if self.user is None:
                request = task.instruction
            elif opening:
                request = (await self.user.reply(task, opening)).text
            else:
                request = await self.user.opening(task)
            opening.append(TextObservation(content=request, source="user"))
        if page is not None:
            opening.append(cut_observation(page, self.max_observation_chars))
        self._episode.history.extend(opening)
        return opening

    async def step(self, action: Action) -> StepResult:
        """Apply one agent action: the user answers messages, the world everything else."""
        ep = self._episode
        if ep is None:
            raise RuntimeError("call reset(task) before step()")
        if ep.done:
            return StepResult(error_observation("the episode is over"), True, {"error": "the episode is over"})
        ep.actions += 1
        if isinstance(action, MessageAction) and self.user is not None:
            reply, made = await self._user_turn(ep.task, [*ep.history, action])
            observation = TextObservation(content=reply.text, source="user", extra={"user_tool_calls": made} if made else {})
            result = StepResult(observation, done=reply.stop or USER_STOP in reply.text)
        else:
            result = await self._act(action)
        result.observation = cut_observation(result.observation, self.max_observation_chars)
        if not result.done and ep.actions >= self.max_steps:
            result.done = True
            result.info["truncated"] = True
        ep.history += [action, result.observation]
        ep.done = result.done
        return result

    async def _user_turn(self, task: Task, conversation: list[Step]) -> tuple[UserReply, list[dict[str, Any]]]:
        """The user's answer, after the calls of its own tools it makes first (dual control). The calls, with
        their results, are recorded on the user's step (`extra.user_tool_calls`): the user's, not the agent's,
        never shown to the agent."""
        assert self.user is not None
        made: list[dict[str, Any]] = []
        while True:
            pending = [TextObservation(content="", source="user", train=False, extra={"user_tool_calls": made})]
            reply = await self.user.reply(task, [*conversation, *(pending if made else [])])
            if not reply.tool_calls or len(made) >= MAX_USER_TOOL_CALLS:
                return reply, made
            for call in reply.tool_calls[:MAX_USER_TOOL_CALLS - len(made)]:
                name, arguments = str(call.get("name")), dict(call.get("arguments") or {})
                made.append({"name": name, "arguments": arguments, "result": await self._user_act(name, arguments)})

    async def _user_act(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one of the user's own tools on the world (worlds with user tools override this)."""
        return f"Error: there is no user tool {name!r} in this world"

    async def inspect(self, action: ApiAction) -> StepResult:
        """A read-only tool call outside the episode's record, also after its end: a verifier reading the
        world's state through the tools. The history, the step count and `done` stay as they were; the
        caller vouches that the call changes nothing (e.g. by comparing two reads)."""
        if self._episode is None:
            raise RuntimeError("call reset(task) before inspect()")
        return await self._act(action)

    async def evaluate(self) -> Evaluation:
        """The outcome of the current episode, the same way at every end (done, caps, failures, stops)."""
        if self._episode is None:
            return Evaluation(0.0, False, "no episode was run")
        return await self._evaluate(self._episode.task, list(self._episode.history))

    # ---- branching ------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """An independent copy of the whole state (snapshot-capable worlds only)."""
        if not self.can_snapshot:
            raise NotImplementedError(f"{self.name} cannot snapshot its state; it is restored by replay")
        ep = self._episode
        episode = None if ep is None else (ep.task, ep.key, tuple(ep.history), ep.actions, ep.done)
        return Snapshot(self.name, (episode, self._snapshot_world()))

    def restore(self, snapshot: Snapshot) -> None:
        """Return to the state captured by `snapshot` (which stays reusable)."""
        if not isinstance(snapshot, Snapshot) or snapshot.env != self.name:
            raise ValueError(f"snapshot of {getattr(snapshot, 'env', snapshot)!r} cannot restore a {self.name} environment")
        episode, world = snapshot.payload
        self._restore_world(world)
        if episode is None:
            self._episode = None
        else:
            task, key, history, actions, done = episode
            self._episode = _Episode(task, key, list(history), actions, done)

    async def replay(self, task: Task, steps: Sequence[Step]) -> None:
        """A fresh episode of `task` brought to the state after `steps` (a recorded history).

        Tool calls are made again; the user's recorded answers are reused, not asked again.
        """
        await self.reset(task)
        ep = self._episode
        assert ep is not None
        for action, observation in transitions(steps):
            if isinstance(action, MessageAction) and self.user is not None and observation is not None:
                ep.actions += 1
                ep.history += [action, observation]
                ep.done = observation.kind == "text" and USER_STOP in observation.content
            else:
                await self.step(action)
        self.replays += 1


@dataclass(frozen=True)
class Checkpoint:
    """A point to branch from: a snapshot where the world can copy itself, else the history to replay."""

    task: Task
    steps: tuple[Step, ...]
    snapshot: Snapshot | None = None


def checkpoint(env: Environment, steps: Sequence[Step]) -> Checkpoint:
    """The env's current state; `steps` is the history that led there (what a replay re-runs)."""
    task = env.task
    if task is None:
        raise RuntimeError("no episode to checkpoint: call reset(task) first")
    return Checkpoint(task, tuple(steps), env.snapshot() if env.can_snapshot else None)


async def restore(env: Environment, point: Checkpoint) -> None:
    """Put `env` in the state of `point`, by snapshot or by replay."""
    if point.snapshot is not None:
        env.restore(point.snapshot)
    else:
        await env.replay(point.task, point.steps)


def is_revision(step: Step) -> bool:
    """A revision thought spliced into a trajectory: the agent's words, not a move in the world."""
    return step.kind == "message" and step.extra.get("kind") == "revision"


# `extra["masked"]` of a step kept as context with its loss masked that the world did go through (Agent-R's
# bad path before its revision, the prefix it shares with the good path included): replays take it.
MASKED_CONTEXT = "context"


def undone(step: Step) -> bool:
    """A masked step of a branch the record does not continue from (train = false: the bad segment of a spliced
    or reflected trajectory); a step masked only from the loss (`extra["masked"] == "context"`) is not."""
    return not step.train and step.extra.get("masked") != MASKED_CONTEXT


def transitions(steps: Sequence[Step]) -> list[tuple[Action, Observation | None]]:
    """The moves of a recorded history: each action with the observation that answered it.

    Revision thoughts and failed steps (the agent's unreadable text) were never sent to the world,
    and undone actions (the bad branch of a spliced or reflected trajectory) belong to a branch the
    rest of the record does not continue from: all are skipped.
    """
    out: list[tuple[Action, Observation | None]] = []
    for i, step in enumerate(steps):
        if step.kind not in ACTION_KINDS or is_revision(step) or undone(step) or step.extra.get("given"):
            continue
        nxt = steps[i + 1] if i + 1 < len(steps) and steps[i + 1].kind not in ACTION_KINDS else None
        out.append((step, nxt))  # type: ignore[arg-type]
    return out


def error_observation(message: str, *, name: str | None = None, tool_call_id: str | None = None) -> TextObservation:
    """The observation for a refused action: an environment text starting with 'Error:'."""
    return TextObservation(content=f"Error: {message}", source="environment", name=name, tool_call_id=tool_call_id)


def refused(action: Action, reason: str) -> StepResult:
    """A StepResult for an action the world refuses, the state unchanged."""
    ids = {"name": action.function, "tool_call_id": action.tool_call_id} if isinstance(action, ApiAction) else {}
    return StepResult(error_observation(reason, **ids), info={"error": reason})


def unsupported(action: Action, instead: str = "call a tool or send a message") -> StepResult:
    """The refusal of an action kind the environment does not take, saying what to do `instead`."""
    return refused(action, f"{action_kind(action)} actions are not supported here; {instead}")


def action_kind(action: object) -> str:
    """A short label for an action, for error messages about unsupported kinds."""
    if isinstance(action, ApiAction):
        return "api"
    if isinstance(action, CodeAction):
        return "code"
    if isinstance(action, MessageAction):
        return "message"
    return type(action).__name__


def said_to_user(history: Sequence[Step]) -> str:
    """Everything the agent told the user, as one text (for communicate-info checks)."""
    return "\n".join(s.content for s in history if s.kind == "message" and not is_revision(s))
