"""Rule-based step labels: they stand in for, or measure, the LLM judge.

Three sources, the best one a trajectory allows (`labelled`):

- **replay** (retail, when the trajectory records its task, see `task_of`): the trajectory is
  replayed in a fresh environment of the same world and each database diff is compared with the
  task's goal state (the state its reference actions lead to): an action is good when it succeeds
  and either changes nothing or writes only goal rows and removes no goal row (so the distance to
  the goal shrinks); bad when it errs or writes anything the goal does not have.
- **reference** (any other task with tau2-style reference actions, `goal["actions"]` as
  `{name|function, arguments, compare_args?}`): a tool call is good when it matches a reference
  action (same name, equal arguments over `compare_args`, by default the reference's own
  arguments) or is read-only and succeeded; bad when it errs, or writes without matching a
  reference action not already matched. Messages and code have no reference and stay unlabeled.
  Read-only tools are named by the caller, else recognised by a leading read verb (`get_`,
  `find_`, `list_`, `search_`, `calculate`, ...).
- **tool_errors** (anything else): an agent step is bad iff the observation after it is an error.

Replay and reference labels are ground truth to measure a judge against; tool errors are a rule.
Masked steps (train = false: the bad segment of a spliced path, the erroneous step of a
reflection) were taken in a branch the rest of the trajectory does not continue from, so they are
judged and then the state from before the masked segment is restored (the replayed world; the
reference actions they matched). Revision steps (`extra["kind"] == "revision"`) are thoughts, not
moves, and are left unlabeled.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Collection, Literal

from envs.base import ACTION_KINDS, Environment, Task, is_revision, undone
from schemas.models import ApiAction, Step, Trajectory


@dataclass(frozen=True)
class RuleLabel:
    label: Literal["good", "bad"]
    reason: str
    # Whether the label settles an outcome (an error, a write that moves toward the goal or away from it): a read
    # or a message that merely succeeded says nothing of whether the policy allowed it.
    outcome: bool = True


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
    for ref in reference_actions(task):
        await env.step(ApiAction(function=ref.name, arguments=ref.arguments))
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
            if undone(step) and before_masked is None:
                before_masked = env.snapshot()
            elif not undone(step) and before_masked is not None:
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
                out[i] = RuleLabel("good", "message without error", outcome=False)
                continue
            new = _rows(env)
            if new == state:
                out[i] = RuleLabel("good", "read-only call succeeded", outcome=False)
                continue
            # Every row the action wrote must be a goal row, and it must remove no goal row.
            wrong = sum(len((new[t] - state[t]) - goal[t]) + len((state[t] - new[t]) & goal[t]) for t in goal)
            d0, d1 = _distance(state, goal), _distance(new, goal)
            if wrong == 0 and d1 < d0:
                out[i] = RuleLabel("good", f"moved toward the goal state ({d0} -> {d1} differing rows)")
            else:
                out[i] = RuleLabel("bad", f"wrote {wrong} rows that are not in the goal state ({d0} -> {d1} differing rows)")
    return out


ReferenceSource = Literal["replay", "reference", "tool_errors"]
GROUND_TRUTH: frozenset[str] = frozenset({"replay", "reference"})
# Leading words of tools that only read (tau2 and most tool sets name them so).
READ_VERBS = frozenset({"get", "find", "list", "search", "lookup", "look", "read", "fetch", "query", "calculate",
                        "check", "view", "show", "describe", "count", "think"})
_FIRST_WORD = re.compile(r"[_\-.]|(?<=[a-z])(?=[A-Z])")


@dataclass(frozen=True)
class Labels:
    """Rule labels of a trajectory's agent steps and where they come from."""

    source: ReferenceSource
    labels: dict[int, RuleLabel]

    @property
    def ground_truth(self) -> bool:
        return self.source in GROUND_TRUTH


def is_read_only(tool: str, read_only: Collection[str] | None = None) -> bool:
    """Whether `tool` only reads: named in `read_only` when given, else by its leading verb."""
    if read_only is not None:
        return tool in read_only
    return _FIRST_WORD.split(tool, 1)[0].lower() in READ_VERBS


@dataclass(frozen=True)
class ReferenceAction:
    name: str
    arguments: dict[str, Any]
    compare_args: tuple[str, ...] | None = None

    def matches(self, step: Step) -> bool:
        if step.kind != "api" or step.function != self.name:
            return False
        keys = self.arguments.keys() if self.compare_args is None else self.compare_args
        return all(step.arguments.get(k) == self.arguments.get(k) for k in keys)


def reference_actions(task: Task) -> list[ReferenceAction]:
    """The task's tau2-style reference tool calls (`name` or `function`, `arguments`, `compare_args`)."""
    out = []
    for a in task.goal.get("actions") or []:
        if isinstance(a, dict) and isinstance(a.get("name") or a.get("function"), str):
            compare = a.get("compare_args")
            out.append(ReferenceAction(a.get("name") or a["function"], dict(a.get("arguments") or {}),
                                       tuple(compare) if isinstance(compare, list) else None))
    return out


def reference_labels(traj: Trajectory, task: Task, read_only: Collection[str] | None = None) -> dict[int, RuleLabel]:
    """Tool calls against the task's reference actions; see the module doc."""
    refs = reference_actions(task)
    out: dict[int, RuleLabel] = {}
    matched: set[int] = set()  # reference writes already done: a second one is not the reference's
    before_masked: set[int] | None = None
    for i, step in enumerate(traj.steps):
        if step.kind not in ACTION_KINDS or is_revision(step):
            continue
        if undone(step) and before_masked is None:
            before_masked = set(matched)
        elif not undone(step) and before_masked is not None:
            matched, before_masked = before_masked, None  # the masked branch was undone
        if step.kind != "api":
            continue
        err = observation_error(_after(traj.steps, i))
        if err:
            out[i] = RuleLabel("bad", f"tool error: {err}")
            continue
        reads = is_read_only(step.function, read_only)
        hit = next((j for j, ref in enumerate(refs) if ref.matches(step) and (reads or j not in matched)), None)
        if hit is not None:
            if not reads:
                matched.add(hit)
            out[i] = RuleLabel("good", f"matches reference action {hit + 1} ({step.function})", outcome=not reads)
        elif reads:
            out[i] = RuleLabel("good", "read-only call succeeded", outcome=False)
        elif any(ref.matches(step) for ref in refs):
            out[i] = RuleLabel("bad", f"repeats a reference write ({step.function}) already done")
        else:
            out[i] = RuleLabel("bad", f"a write ({step.function}) that matches no reference action")
    return out


async def labelled(traj: Trajectory, read_only: Collection[str] | None = None) -> Labels:
    """The best rule labels the trajectory allows: replay (retail), reference actions, else tool errors."""
    task = task_of(traj)
    if task is not None and task.goal.get("actions"):
        if task.env == "retail":
            return Labels("replay", await retail_labels(traj, task))
        if reference_actions(task):
            return Labels("reference", reference_labels(traj, task, read_only))
    return Labels("tool_errors", tool_labels(traj))


async def rule_labels(traj: Trajectory) -> dict[int, RuleLabel]:
    """The labels of `labelled` without their source (for callers that only need the first bad step)."""
    return (await labelled(traj)).labels


def first_bad(labels: dict[int, RuleLabel], start: int = 0) -> int | None:
    return next((i for i in sorted(labels) if i >= start and labels[i].label == "bad"), None)
