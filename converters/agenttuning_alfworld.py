"""AgentInstruct ALFWorld split (THUDM/AgentInstruct, "alfworld") -> interlingua.

Raw format (one object per trajectory):
- `id`: e.g. "alfworld_155".
- `conversations`: list of {`role`: "user" | "assistant" (| "system"), `content`: str}; turn 0 is the
  task prompt ("Interact with a household to solve a task..."), assistant turns are
  "THOUGHT: ...\\n ACTION: go to shelf 1" or "ACTION: ...", user turns are environment feedback.

Follows ADP's `datasets/agenttuning_alfworld/raw_to_standardized.py`: the prompt is shortened and
ends with "Ok? Understood?"; actions become api calls (go / take / put / open / ...) whose string
arguments keep ADP's literal double quotes (`{"location": '"shelf 1"'}`); feedback stays a user text
observation; a trajectory that ends on an action gets ADP's closing turns (picked from the id, not at
random; their indices are in `details["synthetic_steps"]`). `thoughts` (optional): ADP's
LLM-generated thoughts ({step index: thought} or the whole generated_thoughts.json) fill empty thoughts.
"""

from __future__ import annotations

import re
from typing import Any

from converters._chat import thought_map, turns
from converters._util import Builder, Ctx, guarded, py_tool
from converters.registry import register
from schemas.models import Trajectory

NAME = "agenttuning_alfworld"
DATASET = "THUDM/AgentInstruct"

_NON_ACTIONS = (
    "task failed", "task succeeded", "end of the task", "end the task", "unable to perform the task",
    "task cannot be completed", "end task", "the task cannot be completed", "unable to complete the task",
)

# (pattern, function, argument names); arguments are quoted like ADP does.
_PATTERNS: list[tuple[str, str, tuple[str, ...]]] = [
    (r"go to (.+)", "go", ("location",)),
    (r"take (.+) from (.+)", "take", ("item", "source")),
    (r"put (.+) in/on (.+)", "put", ("item", "target")),
    (r"put (.+) on (.+)", "put", ("item", "target")),
    (r"open (.+)", "open", ("obj",)),
    (r"close (.+)", "close", ("obj",)),
    (r"heat (.+) with (.+)", "heat", ("item", "appliance")),
    (r"examine (.+)", "examine", ("obj",)),
    (r"cool (.+) with (.+)", "cool", ("item", "appliance")),
    (r"use (.+)", "use", ("obj",)),
    (r"clean (.+) with (.+)", "clean", ("item", "appliance")),
    (r"report problem with (.+)", "report_problem", ("obj",)),
    (r"inventory", "inventory", ()),
    (r"look", "look", ()),
    (r"look at (.+) under (.+)", "look_at_under", ("item", "reference")),
]

TOOLS = [
    py_tool("go", "Go to a location.", {"location": "string"}),
    py_tool("take", "Take an item from a source.", {"item": "string", "source": "string"}),
    py_tool("put", "Put an item in or on a target.", {"item": "string", "target": "string"}),
    py_tool("open", "Open an object.", {"obj": "string"}),
    py_tool("close", "Close an object.", {"obj": "string"}),
    py_tool("heat", "Heat an item with an appliance.", {"item": "string", "appliance": "string"}),
    py_tool("examine", "Examine an object.", {"obj": "string"}),
    py_tool("cool", "Cool an item with an appliance.", {"item": "string", "appliance": "string"}),
    py_tool("use", "Use an object.", {"obj": "string"}),
    py_tool("clean", "Clean an item with an appliance.", {"item": "string", "appliance": "string"}),
    py_tool("report_problem", "Report a problem with an object.", {"obj": "string"}),
    py_tool("inventory", "List the items carried."),
    py_tool("look", "Look around."),
    py_tool("look_at_under", "Look at an item under a reference object.", {"item": "string", "reference": "string"}),
]


def parse_action(ctx: Ctx, action: str) -> tuple[str, dict[str, Any]]:
    text = action.strip().lower()
    for pattern, fn, names in _PATTERNS:
        m = re.fullmatch(pattern, text, re.DOTALL) if not names else re.match(pattern, text)
        if m:
            return fn, {n: f'"{m.group(i + 1)}"' for i, n in enumerate(names)}
    ctx.fail(f"unrecognized ALFWorld action {action[:80]!r}")


def thought_and_action(content: str) -> tuple[str, str]:
    t = content.find("THOUGHT:")
    m = re.search(r"THOUGHT:\s*(.*?)\s*ACTION:\s*(.*)", content[t:], re.DOTALL) if t >= 0 else None
    if m:
        thought, action = m.group(1).strip(), m.group(2).strip()
    else:
        m = re.search(r"ACTION:\s*(.*)", content, re.IGNORECASE)
        if not m:
            return "", ""
        thought, action = "", m.group(1).strip()
    if any(n in action.lower() for n in _NON_ACTIONS):
        action = ""
    return thought, action


def _system_prompt(text: str) -> str:
    prompt = text.split("You should choose from two actions:")[0].strip() + "\n"
    prompt += text.split('Your output must strictly follow this format:"ACTION: your next action\n". ')[-1].strip()
    return prompt + "\n\nOk? Understood?"


@register(NAME, sources=[DATASET + " (alfworld)"])
@guarded()
def convert(record: Any, thoughts: Any = None) -> Trajectory:
    ctx = Ctx(record, ("id",), require_id=True)
    generated = thought_map(ctx, thoughts)
    b = Builder(ctx, NAME, DATASET)
    for role, content in turns(ctx):
        low = content.strip().lower()
        if content.startswith("Interact with a household to solve a task"):
            b.text(_system_prompt(content), "user")
        elif low == "ok" or "ok. i'll follow" in low:
            b.message(content)
        elif role == "assistant":
            thought, action = thought_and_action(content)
            if action:
                fn, args = parse_action(ctx, action)
                b.api(fn, args, thought=thought or generated.get(str(len(b.steps)), thought))
            else:
                b.text(thought or content, "agent")
        elif role in ("user", "system"):
            b.text(content.replace("ACTION: ", ""), "user" if role == "user" else "environment")
        else:
            ctx.fail(f"unknown role {role[:40]!r}")
    last = b.last
    if last and (last["kind"] == "api" or (last["kind"] == "text" and last["source"] == "agent")):
        b.closing("desc")
    return b.build(tools=TOOLS)
