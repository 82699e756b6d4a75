"""Synatra synthetic web-action demonstrations (oottyy/Synatra) -> interlingua.

Raw format (one object per single-step example; no id upstream):
- `prompt`: a Python-flavoured prompt with sections "# website" (`website = "..."`), "# objective"
  (`objective = "..."`), "# observation of the current web page" (`observation = \"\"\"<axtree>\"\"\"`)
  and "# past actions" (a `def solve():` body of earlier commented calls).
- `response`: the next action: optional "# sub-task ..." and "# step N: <reasoning>" comment lines,
  one call such as `click(element_id="93")`, `type(element_id="5", string="...")`, `goto(url="...")`,
  `stop(answer="...")`, and "# step summary: ...".

Follows ADP's `datasets/synatra/raw_to_standardized.py` (+ its trajectory.py parser): a user text
with the objective, one web observation (axtree = observation + "# Previous Actions" history with
element_id renamed bid; url = website) and one api action (ADP's quoted-string arguments; thought =
sub-task / step / summary lines). The source has no id (ADP numbered records by position), so the
trajectory id is `synatra/xxh3:<hash>` of the record. `hover(...)` is mapped like click (ADP's script rejects it).
"""

from __future__ import annotations

import re
from typing import Any

from converters._util import Builder, Ctx, guarded, py_tool
from converters.registry import register
from schemas.models import Trajectory

NAME = "synatra"
DATASET = "oottyy/Synatra"
_SECTIONS = {"# website": "website", "# objective": "objective",
             "# observation of the current web page": "observation", "# past actions": "past_actions"}
_CALLS = ("key_press(", "goto(", "go_back(", "go_forward(", "new_tab(", "close_tab(", "switch_tab(", "stop(", "scroll(")
TOOLS = [
    py_tool("click", "Click the element with the given id.", {"bid": "string"}),
    py_tool("hover", "Hover over the element with the given id.", {"bid": "string"}),
    py_tool("type", "Type text into the element with the given id.", {"bid": "string", "text": "string"}),
    py_tool("scroll", "Scroll by (delta_x, delta_y) pixels.", {"delta_x": "number", "delta_y": "number"}),
    py_tool("press", "Press a key combination.", {"key_comb": "string"}),
    py_tool("stop", "Stop, giving the answer if the task asks for one.", {"answer": "string"}, []),
    py_tool("goto", "Navigate to a URL.", {"url": "string"}),
    py_tool("new_tab", "Open a new tab at a URL.", {"url": "string"}),
    py_tool("tab_focus", "Focus the tab with the given number.", {"page_number": "integer"}),
    py_tool("close_tab", "Close the current tab."),
    py_tool("go_back", "Go back in history."),
    py_tool("go_forward", "Go forward in history."),
]


def parse_prompt(ctx: Ctx, prompt: str) -> dict[str, str]:
    parts: dict[str, list[str]] = {v: [] for v in _SECTIONS.values()}
    current = None
    for line in prompt.split("\n"):
        header = next((v for k, v in _SECTIONS.items() if line.startswith(k)), None)
        if header:
            current = header
        elif current:
            parts[current].append(line)
    text = {k: "\n".join(v) for k, v in parts.items()}
    objective = re.search(r'objective = "(.*?)"\n', text["objective"], re.DOTALL)
    website = re.search(r'website = "(.*?)"', text["website"])
    observation = re.search(r'observation = """([\s\S]*?)"""\n', text["observation"])
    if not (objective and website and observation):
        ctx.fail("prompt lacks the objective / website / observation sections")
    return {"objective": objective.group(1), "website": website.group(1), "observation": observation.group(1),
            "history": text["past_actions"]}


def parse_response(ctx: Ctx, response: str) -> tuple[str, dict[str, Any], str]:
    subtask = cot = summary = ""
    kind, node, typed = None, None, ""
    for line in response.split("\n"):
        s = line.strip()
        if s.startswith("# sub-task "):
            subtask = s
        elif s.startswith("# step") and not s.startswith("# step summary:"):
            cot = s
        elif s.startswith("# step summary:"):
            summary = s
        elif "(" in line and ")" in line and "# step" not in line and (
            (("click(" in line or "type(" in line or "hover(" in line) and "(element_id=" in line)
            or any(c in line for c in _CALLS)
        ):
            flat = line.replace("element_id=", "").replace("string=", "").replace("'", "").replace('"', "")
            items = [x.strip() for x in re.split("[(),]", flat)]

            def item(i: int) -> str:
                if len(items) <= i:
                    ctx.fail(f"action {s[:80]!r} lacks argument {i}")
                return items[i]

            def node_id() -> int:
                if not re.fullmatch(r"-?\d+", item(1)):
                    ctx.fail(f"action {s[:80]!r} has a non-integer element id")
                return int(item(1))

            for name in ("click", "type", "hover", "key_press", "goto", "go_back", "go_forward", "new_tab",
                         "close_tab", "switch_tab", "stop", "scroll"):
                if f"{name}(" in line:
                    kind = name
                    break
            if kind in ("click", "hover"):
                node = node_id()
            elif kind == "type":
                node, typed = node_id(), item(2)
            elif kind in ("key_press", "goto", "stop", "scroll"):
                typed = item(1)
    if kind is None:
        ctx.fail("response has no action call")
    thought = ""
    if subtask:
        thought += f"{subtask}.\n\n"
    if cot:
        thought += f"{cot}\n\n"
    if summary:
        thought += f"{summary}\n\n"
    if kind == "stop":
        return "stop", {"answer": f'"{typed}"'}, thought
    if kind == "type":
        return "type", {"bid": f'"{node}"', "text": f'"{typed}"'}, thought
    if kind in ("click", "hover"):
        return kind, {"bid": f'"{node}"'}, thought
    if kind == "scroll":
        return "scroll", {"delta_x": 0, "delta_y": 100 if "down" in typed else -100}, thought
    if kind == "key_press":
        return "press", {"key_comb": f'"{typed}"'}, thought
    if kind in ("goto", "new_tab"):
        return kind, {"url": f'"{typed}"'}, thought
    if kind == "switch_tab":
        return "tab_focus", {"page_number": typed}, thought
    return kind, {}, thought  # go_back, go_forward, close_tab


@register(NAME, sources=[DATASET])
@guarded(())
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ())
    parts = parse_prompt(ctx, ctx.str_(record, "prompt"))
    fn, kwargs, thought = parse_response(ctx, ctx.str_(record, "response"))
    b = Builder(ctx, NAME, DATASET)
    b.text("Generate the next action given the an objective, the current web page, and previous actions. "
           f"\n\nObjective: {parts['objective']}", "user")
    b.web(url=parts["website"], axtree=parts["observation"] + "\n\n# Previous Actions\n" + parts["history"].replace("element_id", "bid"))
    b.api(fn, kwargs, thought=thought)
    return b.build(tools=TOOLS, details={"task_description": parts["objective"], "website": parts["website"]})
