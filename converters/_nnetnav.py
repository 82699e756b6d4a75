"""Shared parsing for the NNetNav datasets (nnetnav-wa, nnetnav-live): one raw row per step."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from converters._util import Builder, Ctx, py_tool
from converters.registry import KeyField, group_consecutive
from schemas.models import Trajectory

TOOLS = [
    py_tool("click", "Click the element with the given browser id.", {"bid": "string"}),
    py_tool("hover", "Hover over the element with the given browser id.", {"bid": "string"}),
    py_tool("type", "Type text into an element; press Enter afterwards when press_enter_after is 1.",
            {"bid": "string", "text": "string", "press_enter_after": "integer"}, ["bid", "text"]),
    py_tool("keyboard_press", "Press a key or key combination.", {"key": "string"}),
    py_tool("scroll", "Scroll by (delta_x, delta_y) pixels.", {"delta_x": "number", "delta_y": "number"}),
    py_tool("goto", "Navigate to a URL.", {"url": "string"}),
    py_tool("go_back", "Go back in history."),
    py_tool("go_forward", "Go forward in history."),
    py_tool("new_tab", "Open a new tab."),
    py_tool("tab_focus", "Bring the tab with the given index to front.", {"index": "integer"}),
    py_tool("tab_close", "Close the current tab."),
]
_SUMMARY = "In summary, the next action I will perform is"


EPISODE_KEY = KeyField("id")


def episodes(rows: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Group consecutive step rows by `id`."""
    return group_consecutive(rows, EPISODE_KEY)


def _bracket(ctx: Ctx, action: str, n: int) -> str:
    parts = action.split("[")
    if len(parts) <= n:
        ctx.fail(f"action {action[:80]!r} lacks argument {n}")
    return parts[n].split("]")[0]


def parse_observation(ctx: Ctx, content: str) -> tuple[str, str, str]:
    """(axtree, url, objective) from 'OBSERVATION: ... URL: ... OBJECTIVE: ... PREVIOUS ACTIONS: ...'."""
    if "OBSERVATION:" not in content or "\nURL: " not in content:
        ctx.fail("observation turn lacks OBSERVATION: / URL:")
    start, end = content.find("OBJECTIVE:"), content.find("PREVIOUS ACTIONS:")
    objective = content[start + len("OBJECTIVE:") : end].strip() if start != -1 and end != -1 else ""
    axtree = content.split("OBSERVATION:")[1].split("\nURL: ")[0].strip()
    url = content.split("\nURL: ")[1].split("\n")[0].strip()
    return axtree, url, objective


def parse_action(ctx: Ctx, b: Builder, content: str) -> None:
    """One assistant turn ('... In summary, the next action I will perform is ```click [12]```')."""
    first, last = content.find("```"), content.rfind("```")
    if first == -1 or last == first:
        ctx.fail("assistant turn has no ```action``` block")
    action = content[first + 3 : last].strip()
    thought = content[:first].replace(_SUMMARY, "").strip() or None
    # Substring tests in ADP's order (it checks "type" before "click", etc.).
    if "type" in action:
        press = _bracket(ctx, action, 3) if action.count("[") > 3 else "0"
        b.api("type", {"bid": f'"{_bracket(ctx, action, 1)}"', "text": f'"{_bracket(ctx, action, 2)}"',
                       "press_enter_after": press}, thought=thought)
    elif "press" in action:
        b.api("keyboard_press", {"key": f'"{_bracket(ctx, action, 1)}"'}, thought=thought)
    elif "scroll" in action:
        direction = _bracket(ctx, action, 1).removeprefix("direction=").strip()
        if direction not in ("up", "down"):
            ctx.fail(f"unknown scroll direction {direction[:20]!r}")
        b.api("scroll", {"delta_x": 0, "delta_y": 500 if direction == "down" else -500}, thought=thought)
    elif "close_tab" in action:
        b.api("tab_close", {}, thought=thought)
    elif "stop" in action:
        b.message(_bracket(ctx, action, 1), thought=thought)
    elif "click" in action:
        b.api("click", {"bid": f'"{_bracket(ctx, action, 1)}"'}, thought=thought)
    elif "hover" in action:
        b.api("hover", {"bid": f'"{_bracket(ctx, action, 1)}"'}, thought=thought)
    elif "new_tab" in action:
        b.api("new_tab", {}, thought=thought)
    elif "tab_focus" in action:
        b.api("tab_focus", {"index": _bracket(ctx, action, 1)}, thought=thought)
    elif "goto" in action:
        b.api("goto", {"url": f'"{_bracket(ctx, action, 1)}"'}, thought=thought)
    elif "go_back" in action:
        b.api("go_back", {}, thought=thought)
    elif "go_forward" in action:
        b.api("go_forward", {}, thought=thought)
    else:
        ctx.fail(f"unknown action {action[:80]!r}")


def convert_episode(record: Any, name: str, dataset: str) -> Trajectory:
    rows = record if isinstance(record, list) else [record]
    first = rows[0] if rows else None
    ctx = Ctx(first if isinstance(first, dict) else record, ("id",), require_id=True)
    if not rows:
        ctx.fail("empty episode")
    ctx.raw = record  # the id's content hash covers the whole episode
    b = Builder(ctx, name, dataset)
    objective = ""
    for i, row in enumerate(rows):
        where = f"steps[{i}]"
        if not isinstance(row, dict):
            ctx.fail(f"`{where}` is {type(row).__name__}, expected an object")
        if row.get("id") != first.get("id"):
            ctx.fail(f"`{where}.id` differs from the episode's")
        messages = ctx.dicts(row, "messages", where)
        if len(messages) < 3:
            ctx.fail(f"`{where}.messages` needs system, observation and action turns")
        obs = ctx.str_(messages[1], "content", f"{where}.messages[1]")
        act = ctx.str_(messages[2], "content", f"{where}.messages[2]")
        axtree, url, objective = parse_observation(ctx, obs)
        b.web(url=url, axtree=axtree)
        parse_action(ctx, b, act)
    goal = (f"You are given the following objective: {objective}\nExamine the current web page and perform "
            "the next appropriate action to move toward completing the objective.")
    b.steps.insert(0, {"kind": "text", "content": goal, "source": "user"})
    last = b.last
    completed = last["kind"] == "message"
    if completed:
        last["content"] = f"<finish> {last['content']} </finish>"
    details: dict[str, Any] = {"source": name, "completed": completed}
    if isinstance(first.get("dataset"), str):
        details["dataset"] = first["dataset"]
    return b.build(tools=TOOLS, details=details, task_id=first.get("task_name") if isinstance(first.get("task_name"), str) else None)
