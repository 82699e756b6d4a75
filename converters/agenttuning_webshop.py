"""AgentInstruct WebShop split (THUDM/AgentInstruct, "webshop") -> interlingua.

Raw format (one object per trajectory):
- `id`: e.g. "webshop_330".
- `conversations`: list of {`role`: "user" | "assistant", `content`: str}; turn 0 is the prompt
  ("You are web shopping. ..."), assistant turns are "Thought:\\n...\\n\\nAction:\\nsearch[...]" or
  "click[...]", user turns are the page text ("Observation:\\n...").

Follows ADP's `datasets/agenttuning_webshop/raw_to_standardized.py`: the prompt is cut before the
action help; `search[x]` / `click[x]` become api actions with the argument wrapped in double quotes
(ADP's convention); pages stay user text observations; ADP's closing turns are appended (picked
from the id; `details["synthetic_steps"]`). An action that is not search/click raises ConversionError
(ADP drops such records).
"""

from __future__ import annotations

import re
from typing import Any

from converters._chat import turns
from converters._util import Builder, Ctx, guarded, py_tool
from converters.registry import register
from schemas.models import Trajectory

NAME = "agenttuning_webshop"
DATASET = "THUDM/AgentInstruct"
_NON_ACTIONS = (
    "task failed", "task succeeded", "end of the task", "end the task", "unable to perform the task",
    "task cannot be completed", "end task", "the task cannot be completed", "unable to complete the task",
)
TOOLS = [
    py_tool("search", "Search the shop with the given keywords.", {"keywords": "string"}),
    py_tool("click", "Click a button or product by its label or id.", {"element": "string"}),
]


def thought_and_action(content: str) -> tuple[str, str]:
    m = re.search(r"Thought:\n\s*(.*?)\s*Action:\n\s*(.*)", content, re.DOTALL)
    if m:
        thought, action = m.group(1).strip(), m.group(2).strip()
    else:
        m = re.search(r"Action:\n\s*(.*)", content, re.IGNORECASE)
        if not m:
            return "", ""
        thought, action = "", m.group(1).strip()
    if any(n in action.lower() for n in _NON_ACTIONS):
        action = ""
    return thought, action


def parse_call(ctx: Ctx, raw: str) -> tuple[str, dict[str, str]]:
    m = re.match(r"(\w+)\[(.*)\]", raw)
    if not m:
        ctx.fail(f"invalid action {raw[:80]!r}")
    name, arg = m.group(1), m.group(2)
    if name not in ("search", "click"):
        ctx.fail(f"unknown action {name[:40]!r}")
    if not arg:
        return name, {}
    return name, {("keywords" if name == "search" else "element"): f'"{arg}"'}


@register(NAME, sources=[DATASET + " (webshop)"])
@guarded()
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id",), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    for role, content in turns(ctx):
        low = content.strip().lower()
        if content.startswith("You are web shopping") and "\n" in content:
            head = content[: content.rfind("\n")]
            b.text(head.split("You can use search action if search is available.")[0], "user")
        elif low == "ok." or "ok. i'll follow" in low:
            b.message(content)
        elif role == "assistant":
            thought, action = thought_and_action(content)
            fn, args = parse_call(ctx, action)
            b.api(fn, args, thought=thought)
        elif role in ("user", "system"):
            b.text(content, "user" if role == "user" else "environment")
        else:
            ctx.fail(f"unknown role {role[:40]!r}")
    last = b.last
    if not (last and last["kind"] == "message" and "<finish>" in last["content"]):
        b.closing("desc")
    return b.build(tools=TOOLS)
