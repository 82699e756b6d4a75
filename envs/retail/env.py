"""RetailEnv: the retail tools over an in-memory SQLite database, a simulated user, tau-bench-style outcome reward."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from envs.base import Environment, Snapshot, StepResult, Task, action_kind, error_observation
from envs.retail.db import GOAL_TABLES, DBSnapshot, RetailDB, initial_snapshot
from envs.retail.memo import MEMO, CallOutcome
from envs.retail.tasks import generate_tasks
from envs.retail.tools import TOOL_SPECS, ToolError, call_tool
from envs.retail.user import SimulatedUser
from envs.toolspec import validate_call
from schemas.models import Action, ApiAction, MessageAction, Observation, TextObservation, Tool


@dataclass(frozen=True)
class _Episode:
    """Everything beyond the database that a snapshot must capture (immutable, so sharing is safe)."""

    task: Task | None = None
    steps: int = 0
    user_turns: int = 0
    done: bool = False
    messages: tuple[str, ...] = ()


class RetailEnv(Environment):
    """Customer service for an online shop. Tasks name their world seed in `params["world_seed"]`."""

    name = "retail"

    def __init__(self, seed: int = 0, max_steps: int = 40, max_user_turns: int = 10) -> None:
        self.seed = seed
        self.max_steps = max_steps
        self.max_user_turns = max_user_turns
        self.db = RetailDB(initial_snapshot(seed))
        self._ep = _Episode()
        self._user: SimulatedUser | None = None
        self._tools = [s.tool() for s in TOOL_SPECS.values()]

    def tools(self) -> list[Tool]:
        return list(self._tools)

    def generate_tasks(self, n: int, seed: int = 0) -> list[Task]:
        return generate_tasks(n, seed=seed, world_seed=self.seed)

    @property
    def task(self) -> Task | None:
        return self._ep.task

    @property
    def done(self) -> bool:
        return self._ep.done

    def reset(self, task: Task) -> Observation:
        self._check_task(task)
        self.db.restore(initial_snapshot(int(task.params.get("world_seed", self.seed))))
        self._ep = _Episode(task=task)
        self._user = self._make_user(task)
        return TextObservation(content=task.instruction, source="user")

    def _make_user(self, task: Task) -> SimulatedUser:
        return SimulatedUser(task.instruction, task.metadata.get("user_info", {}), self.max_user_turns)

    def step(self, action: Action) -> StepResult:
        if self._ep.task is None:
            raise RuntimeError("call reset(task) before step()")
        if self._ep.done:
            return StepResult(error_observation("the episode is over"), 0.0, True, {"error": "the episode is over"})
        self._ep = replace(self._ep, steps=self._ep.steps + 1)
        if isinstance(action, ApiAction):
            result = self._api(action)
        elif isinstance(action, MessageAction):
            result = self._message(action)
        else:
            reason = f"{action_kind(action)} actions are not supported here; call a tool or send a message"
            result = StepResult(error_observation(reason), info={"error": reason})
        if not result.done and self._ep.steps >= self.max_steps:
            result.done = True
            result.info["truncated"] = True
        if result.done:
            self._ep = replace(self._ep, done=True)
            result.reward = self.evaluate()
        return result

    def _api(self, action: ApiAction) -> StepResult:
        ids = {"name": action.function, "tool_call_id": action.tool_call_id}
        key = MEMO.key(action.function, action.arguments, self.db.tokens())
        outcome = MEMO.get(key) if key is not None else None
        if outcome is None:
            outcome = self._call(action.function, action.arguments)
            if key is not None:
                MEMO.put(key, outcome)
        elif outcome.after is not None:
            self.db.restore(outcome.after)
        if outcome.error is not None:
            info: dict[str, Any] = {"error": outcome.error}
            if outcome.rule_violation:
                info["rule_violation"] = True
            return StepResult(error_observation(outcome.error, **ids), info=info)
        assert outcome.content is not None
        done = action.function == "transfer_to_human_agents"
        return StepResult(TextObservation(content=outcome.content, source="environment", **ids), done=done)

    def _call(self, function: str, arguments: Any) -> CallOutcome:
        """Validate and run one tool call on the database."""
        reason = validate_call(TOOL_SPECS, function, arguments)
        if reason is not None:
            return CallOutcome(None, reason)
        before = self.db.tokens()
        try:
            value = call_tool(self.db, function, arguments)
        except ToolError as exc:
            return CallOutcome(None, str(exc), rule_violation=True)
        content = value if isinstance(value, str) else json.dumps(value)
        return CallOutcome(content, after=self.db.snapshot() if self.db.tokens() != before else None)

    def _message(self, action: MessageAction) -> StepResult:
        assert self._user is not None
        turn = self._ep.user_turns + 1
        self._ep = replace(self._ep, user_turns=turn, messages=self._ep.messages + (action.content,))
        reply, left = self._user.reply(action.content, turn)
        return StepResult(TextObservation(content=reply, source="user"), done=left)

    def evaluate(self) -> float:
        task = self._ep.task
        if task is None or "state_hash" not in task.goal:
            return 0.0
        if self.db.state_hash(GOAL_TABLES) != task.goal["state_hash"]:
            return 0.0
        said = " ".join(self._ep.messages).lower().replace(",", "").replace("$", "")
        return 1.0 if all(str(o).lower() in said for o in task.goal.get("outputs", [])) else 0.0

    def snapshot(self) -> Snapshot:
        return Snapshot(self.name, (self.db.snapshot(), self._ep))

    def restore(self, snapshot: Snapshot) -> None:
        self._check_snapshot(snapshot)
        db_snap, ep = snapshot.payload
        assert isinstance(db_snap, DBSnapshot)
        self.db.restore(db_snap)
        if ep.task is not self._ep.task:
            self._user = self._make_user(ep.task) if ep.task is not None else None
        self._ep = ep

    def close(self) -> None:
        self.db.close()

    def state(self) -> dict[str, Any]:
        """The whole database as plain rows (for tests and debugging)."""
        return {t: self.db.rows(f"SELECT * FROM {t}") for t in GOAL_TABLES}
