"""RetailEnv: the retail tools over an in-memory SQLite database, a rule-based user, tau-bench-style outcome reward."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Sequence

from envs.base import Environment, Evaluation, StepResult, Task, UserSimulator, refused, unsupported, said_to_user
from envs.retail.db import GOAL_TABLES, DBSnapshot, RetailDB, initial_snapshot
from envs.retail.memo import MEMO, CallOutcome
from envs.retail.tasks import generate_tasks, goal_hash
from envs.retail.tools import TOOL_SPECS, ToolError, call_tool
from envs.retail.user import RuleUser
from envs.toolspec import validate_call
from schemas.models import Action, ApiAction, MessageAction, Observation, Step, TextObservation, Tool


class RetailEnv(Environment):
    """Customer service for an online shop. Tasks name their world seed in `params["world_seed"]`."""

    name = "retail"
    can_snapshot = True
    default_user = "rules"  # what `trajforge envs` lists
    evaluation = "goal state (database after the reference actions) and the outputs told to the user"

    def __init__(self, seed: int = 0, max_steps: int = 40, max_user_turns: int = 10,
                 user: UserSimulator | None = None) -> None:
        super().__init__(max_steps=max_steps, user=user if user is not None else RuleUser(max_user_turns))
        self.seed = seed
        self._db: RetailDB | None = None
        self._tools = [s.tool() for s in TOOL_SPECS.values()]

    @property
    def db(self) -> RetailDB:
        if self._db is None:  # opened on first use, and again after close()
            self._db = RetailDB(initial_snapshot(self.seed))
        return self._db

    def tools(self) -> list[Tool]:
        return list(self._tools)

    def generate_tasks(self, n: int, seed: int = 0) -> list[Task]:
        return generate_tasks(n, seed=seed, world_seed=self.seed)

    async def _reset(self, task: Task) -> Observation | None:
        self.db.restore(initial_snapshot(int(task.params.get("world_seed", self.seed))))
        return None

    async def _act(self, action: Action) -> StepResult:
        if isinstance(action, MessageAction):  # no user to answer: the message is the agent's final answer
            return StepResult(TextObservation(content="The conversation has ended.", source="environment"), done=True)
        if not isinstance(action, ApiAction):
            return unsupported(action)
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
            result = refused(action, outcome.error)
            if outcome.rule_violation:
                result.info["rule_violation"] = True
            return result
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

    async def _evaluate(self, task: Task, history: Sequence[Step]) -> Evaluation:
        expected = task.goal.get("state_hash")
        if expected is None and isinstance(task.goal.get("actions"), list):
            # tau2-style criteria without a precomputed hash: the goal is the state the reference actions reach.
            try:
                expected = _criteria_hash(int(task.params.get("world_seed", self.seed)),
                                          json.dumps(task.goal["actions"], sort_keys=True))
            except (ToolError, KeyError, TypeError, ValueError) as exc:
                return Evaluation(0.0, False, f"the task's reference actions fail: {exc}")
        if expected is None:
            return Evaluation(0.0, False, "the task has no goal state to check")
        state_ok = self.db.state_hash(GOAL_TABLES) == expected
        said = said_to_user(history).lower().replace(",", "").replace("$", "")
        told = task.goal.get("outputs") or task.goal.get("communicate_info") or []
        outputs = {str(o): str(o).lower() in said for o in told}
        details = {"db": state_ok, "outputs": outputs}
        if not state_ok:
            return Evaluation(0.0, False, "the database differs from the goal state", details)
        missing = [o for o, ok in outputs.items() if not ok]
        if missing:
            return Evaluation(0.0, False, f"not told to the user: {', '.join(missing)}", details)
        return Evaluation(1.0, True, "goal state reached" + (" and outputs told" if outputs else ""), details)

    def _snapshot_world(self) -> DBSnapshot:
        return self.db.snapshot()

    def _restore_world(self, payload: DBSnapshot) -> None:
        self.db.restore(payload)

    async def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            db.close()

    def state(self) -> dict[str, Any]:
        """The whole database as plain rows (for verifiers, tests and debugging)."""
        return {t: self.db.rows(f"SELECT * FROM {t}") for t in GOAL_TABLES}


@lru_cache(maxsize=256)
def _criteria_hash(world_seed: int, actions_json: str) -> str:
    """The goal state hash of reference actions given as `{name | function, arguments}` (tau2's or ours)."""
    actions = [{"function": a.get("function") or a["name"], "arguments": a.get("arguments") or {}}
               for a in json.loads(actions_json)]
    for n, a in enumerate(actions, 1):
        if (reason := validate_call(TOOL_SPECS, a["function"], a["arguments"])) is not None:
            raise ValueError(f"action {n} ({a['function']}): {reason}")
    return goal_hash(world_seed, actions)
