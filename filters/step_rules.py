"""Rule-based step verifiers for the built-in environments: they stand in for, or check, the LLM judge.

- Any environment: a tool call is bad when its observation is an error (`Error: ...`).
- Retail (when the trajectory records its task, see `task_of`): the trajectory is replayed in a
  fresh environment of the same world and each database diff is compared with the task's goal
  state (the state its reference actions lead to): an action is good when it succeeds and either
  changes nothing or writes only goal rows and removes no goal row (so the distance to the goal
  shrinks); bad when it errs or writes anything the goal does not have.

Masked steps (train = false: the bad segment of a spliced path, the erroneous step of a
reflection) were taken in a branch the rest of the trajectory does not continue from, so the
replay judges them and then restores the state from before the masked segment. Revision steps
(`extra["kind"] == "revision"`) are thoughts, not moves, and are left unlabeled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from envs.base import ACTION_KINDS, Environment, Task, is_revision
from schemas.models import ApiAction, Step, Trajectory


@dataclass(frozen=True)
class RuleLabel:
    label: Literal["good", "bad"]
    reason: str


def task_of(traj: Trajectory) -> Task | None:
    """The environment task a generated trajectory ran (methods store it in `details["task"]`)."""
    data = traj.details.get("task")
    return Task.model_validate(data) if isinstance(data, dict) else None


def env_config_of(traj: Trajectory) -> dict[str, Any]:
    data = traj.details.get("env_config")
    return dict(data) if isinstance(data, dict) else {}


def observation_error(step: Step | None) -> str | None:
    """The error text of an observation that reports a refused action, else None."""
    if step is None or step.kind in ACTION_KINDS:
        return None
    text = step.content if step.kind == "text" else json.dumps(step.content) if step.kind == "json" else ""
    return text.strip() if isinstance(text, str) and text.strip().startswith("Error:") else None


def _after(steps: list[Step], i: int) -> Step | None:
    return steps[i + 1] if i + 1 < len(steps) and steps[i + 1].kind not in ACTION_KINDS else None


def tool_labels(traj: Trajectory) -> dict[int, RuleLabel]:
    """Environment-agnostic: an agent step is bad iff the observation after it is an error."""
    out: dict[int, RuleLabel] = {}
    for i, step in enumerate(traj.steps):
        if step.kind not in ACTION_KINDS or is_revision(step):
            continue
        err = observation_error(_after(traj.steps, i))
        out[i] = RuleLabel("bad", f"tool error: {err}") if err else RuleLabel("good", "the action succeeded")
    return out


def _rows(env: Any) -> dict[str, set[str]]:
    return {t: {json.dumps(r, sort_keys=True, default=str) for r in rows} for t, rows in env.state().items()}


def _distance(state: dict[str, set[str]], goal: dict[str, set[str]]) -> int:
    return sum(len(state[t] ^ goal[t]) for t in goal)


async def goal_state(env: Environment, task: Task) -> dict[str, set[str]]:
    """The retail state after the task's reference actions."""
    await env.reset(task)
    for a in task.goal.get("actions", []):
        await env.step(ApiAction(function=a["function"], arguments=a["arguments"]))
    return _rows(env)


async def retail_labels(traj: Trajectory, task: Task) -> dict[int, RuleLabel]:
    """Replay in a fresh retail world: errors and moves away from the goal state are bad."""
    from envs.registry import make_env

    out: dict[int, RuleLabel] = {}
    async with make_env("retail", **env_config_of(traj)) as env:
        goal = await goal_state(env, task)
        await env.reset(task)
        before_masked = None
        for i, step in enumerate(traj.steps):
            if step.kind not in ACTION_KINDS or is_revision(step):
                continue
            if not step.train and before_masked is None:
                before_masked = env.snapshot()
            elif step.train and before_masked is not None:
                env.restore(before_masked)  # the trajectory continues from before the masked branch
                before_masked = None
            if env.done:
                out[i] = RuleLabel("bad", "acted after the episode ended")
                continue
            state = _rows(env)
            result = await env.step(step)  # type: ignore[arg-type]
            err = result.info.get("error") if result.info else None
            if err:
                out[i] = RuleLabel("bad", f"tool error: {err}")
                continue
            if step.kind != "api":
                out[i] = RuleLabel("good", "message without error")
                continue
            new = _rows(env)
            if new == state:
                out[i] = RuleLabel("good", "read-only call succeeded")
                continue
            # Every row the action wrote must be a goal row, and it must remove no goal row.
            wrong = sum(len((new[t] - state[t]) - goal[t]) + len((state[t] - new[t]) & goal[t]) for t in goal)
            d0, d1 = _distance(state, goal), _distance(new, goal)
            if wrong == 0 and d1 < d0:
                out[i] = RuleLabel("good", f"moved toward the goal state ({d0} -> {d1} differing rows)")
            else:
                out[i] = RuleLabel("bad", f"wrote {wrong} rows that are not in the goal state ({d0} -> {d1} differing rows)")
    return out


async def rule_labels(traj: Trajectory) -> dict[int, RuleLabel]:
    """The best rules available for the trajectory: retail state diffs when its task is known, else tool errors."""
    task = task_of(traj)
    if task is not None and task.env == "retail" and task.goal.get("actions"):
        return await retail_labels(traj, task)
    return tool_labels(traj)


def first_bad(labels: dict[int, RuleLabel], start: int = 0) -> int | None:
    return next((i for i in sorted(labels) if i >= start and labels[i].label == "bad"), None)
