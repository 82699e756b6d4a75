"""CodeActInstruct (xingyaoww/code-act) -> interlingua.

Raw format (one object per trajectory):
- `id`: e.g. "oct28_full6728/reasoning/hotpotqa/23173/claude-2/max5_p2+tool+cd".
- `conversations`: list of {`role`: "system" | "user" | "assistant", `content`: str}; the system
  turn may list tool functions after "Tool function available (already imported in <execute>
  environment):"; user turns are "Task:\\n..." or "Observation:\\n..."; assistant turns hold
  `<execute> code </execute>` or `<solution> answer </solution>`.

Follows ADP's `datasets/codeactinstruct/raw_to_standardized.py`: the system turn is dropped (its
text is kept in `details["system"]`; its listed functions fill `tools`); `<execute>` -> python code
action, `<solution>` -> message, Task/Observation -> user text; the first step gets ADP's
"You have 5 chances..." note; a trajectory ending on code gets ADP's closing turns (picked from the
id), a final message is wrapped in `<finish>`.
"""

from __future__ import annotations

import re
from typing import Any

from converters._chat import turns
from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "codeactinstruct"
DATASET = "xingyaoww/code-act"
TOOL_HEADER = "Tool function available (already imported in <execute> environment):"
WARNING = (
    "Observation:\nI don't understand your input. \nIf you want to execute code, please use <execute> "
    "YOUR_CODE_HERE </execute>.\nIf you want to give me an answer, please use <solution> YOUR_SOLUTION_HERE "
    "</solution>.\nFor example: The answer to the question is <solution> 42 </solution>."
)
NEW_WARNING = (
    "I don't understand your input. \nIf you want to execute code, please follow the instructions.\n"
    "If you want to give me an answer, please use <solution> YOUR_SOLUTION_HERE </solution>.\n"
    "For example: The answer to the question is <solution> 42 </solution>."
)
CHANCES = "\n\nYou have 5 chances to interact with the environment or propose a solution. You can only propose a solution 2 times."
_JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "list": "array", "dict": "object"}


def parse_tools(text: str) -> list[dict[str, Any]]:
    """`[1] name(arg: type, ...) -> ret\\ndescription...` blocks -> tool specs."""
    tools = []
    blocks = re.split(r"^\[\d+\] ", text, flags=re.MULTILINE)
    for block in blocks[1:]:
        head, _, desc = block.partition("\n")
        m = re.match(r"(\w+)\((.*?)\)", head)
        if not m:
            continue
        props, required = {}, []
        for arg in filter(None, (a.strip() for a in m.group(2).split(","))):
            pname, _, ptype = arg.partition(":")
            pname = pname.strip()
            ptype = ptype.split("=")[0].strip()
            props[pname] = {"type": _JSON_TYPES.get(ptype, "string")}
            if "=" not in arg:
                required.append(pname)
        tools.append({"name": m.group(1), "description": desc.strip() or None,
                      "parameters": {"type": "object", "properties": props, "required": required}})
    return tools


@register(NAME, sources=[DATASET])
@guarded()
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id",), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    tools: list[dict[str, Any]] = []
    system = []
    for role, content in turns(ctx, roles=("system", "user", "assistant")):
        if role == "system":
            if TOOL_HEADER in content:
                before, after = content.split(TOOL_HEADER, 1)
                tools = parse_tools(after)
            system.append(content)
            continue
        source = "user" if role == "user" else "agent"
        solution = re.match(r"(.*)<solution>(.*)</solution>", content, re.DOTALL) if "<solution>" in content else None
        execute = re.match(r"(.*)<execute>(.*)</execute>", content, re.DOTALL) if "<execute>" in content else None
        if WARNING in content:
            b.text(content.replace(WARNING, NEW_WARNING), source)
        elif solution:
            if role != "assistant":
                ctx.fail(f"<solution> in a {role} turn")
            b.message(f"<solution> {solution.group(2).strip()} </solution>", thought=solution.group(1).strip())
        elif execute:
            if role != "assistant":
                ctx.fail(f"<execute> in a {role} turn")
            code = execute.group(2).strip()
            if not code:
                ctx.fail("empty <execute> block")
            b.code("python", code, thought=execute.group(1).strip())
        elif content.startswith("Observation:\n"):
            b.text(content[len("Observation:\n") :], source)
        elif content.startswith("Task:\n"):
            b.text(content[len("Task:\n") :], source)
        else:
            b.message(content, thought=None)
    if not b.steps:
        ctx.fail("no user or assistant turns")
    b.steps[0]["content"] += CHANCES
    last = b.last
    if last["kind"] == "code" or (last["kind"] == "text" and last["source"] == "agent"):
        b.closing("content")
    last = b.last
    if last["kind"] == "message" and "<finish>" not in last["content"]:
        last["content"] = f"<finish> {last['content']} </finish>"
    return b.build(tools=tools, details={"system": "\n\n".join(system)} if system else {})
