"""AgentInstruct KG split (THUDM/AgentInstruct, "kg") -> interlingua.

Raw format (one object per trajectory):
- `id`: e.g. "kg_132".
- `conversations`: list of {`role`: "user" | "assistant", `content`: str}; turn 0 is the prompt
  ("You are an agent that answers questions based on the knowledge stored in a knowledge base..."),
  assistant turns are "Thought: ...\\nAction: get_relations(Barack Obama)" or end with
  "Final Answer: #3", user turns are "Observation: ..." results.

Follows ADP's `datasets/agenttuning_kg/raw_to_standardized.py`: the prompt keeps its first and last
paragraph plus "Ok? Understood?"; tool calls become api actions with positional arguments mapped to
the tool's parameter names and wrapped in single quotes (ADP's convention); the final answer is a
`<solution>` message followed by ADP's closing turns (picked from the id; `details["synthetic_steps"]`).
A call to an unknown tool or with the wrong arity raises ConversionError (ADP drops those records).
"""

from __future__ import annotations

import re
from typing import Any

from converters._chat import turns
from converters._util import Builder, Ctx, guarded, py_tool
from converters.registry import register
from schemas.models import Trajectory

NAME = "agenttuning_kg"
DATASET = "THUDM/AgentInstruct"

SIGNATURES: dict[str, tuple[str, ...]] = {
    "get_relations": ("variable",),
    "get_neighbors": ("variable", "relation"),
    "intersection": ("variable1", "variable2"),
    "get_attributes": ("variable",),
    "argmax": ("variable", "attribute"),
    "argmin": ("variable", "attribute"),
    "count": ("variable",),
}
_DESCRIPTIONS = {
    "get_relations": "List the relations (edges) of an entity or variable in the knowledge base.",
    "get_neighbors": "Entities linked to a variable through a relation, as a new variable.",
    "intersection": "Entities shared by two variables of the same type, as a new variable.",
    "get_attributes": "Numerical attributes of a variable (for superlative questions).",
    "argmax": "The entity of a variable with the largest value of an attribute.",
    "argmin": "The entity of a variable with the smallest value of an attribute.",
    "count": "Number of entities in a variable.",
}
TOOLS = [py_tool(n, _DESCRIPTIONS[n], {p: "string" for p in ps}) for n, ps in SIGNATURES.items()]


def parse_call(ctx: Ctx, raw: str) -> tuple[str, dict[str, str]]:
    m = re.match(r"(\w+)\((.*)\)", raw)
    if not m:
        ctx.fail(f"invalid function call {raw[:80]!r}")
    name, args_str = m.group(1), m.group(2)
    if name not in SIGNATURES:
        ctx.fail(f"unknown function {name[:40]!r}")
    if not args_str:
        return name, {}
    args = [a.strip() for a in args_str.split(",")]
    params = SIGNATURES[name]
    if len(args) != len(params):
        ctx.fail(f"{name} takes {len(params)} argument(s), got {len(args)}")
    return name, {p: f"'{a}'" for p, a in zip(params, args)}


def _system_prompt(content: str) -> str:
    cut = content.rfind("\n")
    head, tail = content[:cut], content[cut + 1 :]
    text = head.replace("Final Answer: #3", "<solution> #3 </solution>").replace("Final Answer: #id", "<solution> #id </solution>")
    parts = (text + tail).split("\n\n")
    return parts[0] + "\n\n" + parts[-1] + "\n\nOk? Understood?"


@register(NAME, sources=[DATASET + " (kg)"])
@guarded()
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id",), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    for role, content in turns(ctx):
        if content.startswith("You are an agent that answers questions") and "\n" in content:
            b.text(_system_prompt(content), "user")
        elif role == "assistant" and "Final Answer:" in content:
            at = content.rfind("Final Answer:")
            answer = content[at + len("Final Answer:") :].lstrip()
            b.message(f"<solution> {answer} </solution>", thought=content[:at].strip().replace("Thought: ", ""))
        elif role == "assistant":
            m = re.search(r"Thought:\s*(.*?)\nAction:\s*(.*)", content, re.DOTALL)
            if m:
                fn, args = parse_call(ctx, m.group(2).strip())
                b.api(fn, args, thought=m.group(1).strip())
            else:
                b.text(content, "agent")
        elif role in ("user", "system"):
            b.text(content.replace("Observation:", ""), "user" if role == "user" else "environment")
        else:
            ctx.fail(f"unknown role {role[:40]!r}")
    last = b.last
    solved = bool(last and last["kind"] == "message" and "<solution>" in last["content"])
    if solved:
        b.closing("content")
    return b.build(tools=TOOLS, details={} if solved else {"has_final_answer": False})
