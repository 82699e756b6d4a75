"""SWE-Play trajectories (OpenHands-style runs on generated projects) -> interlingua.

Raw format (one object per trajectory; learned from ADP's
`datasets/swe-play-trajectories/raw_to_standardized.py`, `schema_raw.py`, `api.py` and sample_raw.json):
- `id`: e.g. "swe-play-0".
- `messages`: list of {`role`: "system" | "user" | "assistant", `content`: str}; assistant turns hold
  one `<function=name>\\n<parameter=p>value</parameter>\\n</function>` call (execute_bash,
  execute_ipython_cell, str_replace_editor, think, finish, ...); user turns after the first are tool output.
- `category`: task category (e.g. "general"); `source`: the generated project (e.g. "cpu-architecture-simulator").

Follows ADP: system prompt dropped (`details["system"]`); the first user turn is user text, later ones
environment text; execute_bash -> `bash` code, execute_ipython_cell -> `python` code, other calls
api actions (digit / true / false parameters converted); no call -> a message.
"""

from __future__ import annotations

import re
from typing import Any

from converters._chat import turns
from converters._swe import STR_REPLACE_EDITOR
from converters._util import Builder, Ctx, guarded, py_tool
from converters.registry import register
from schemas.models import Trajectory

NAME = "swe-play-trajectories"
DATASET = "StephenZhu/SWE-Play-trajectories"
TOOLS = [
    py_tool("execute_bash", "Run a bash command.", {"command": "string"}),
    py_tool("execute_ipython_cell", "Run Python code in an IPython cell.", {"code": "string"}),
    STR_REPLACE_EDITOR,
    py_tool("think", "Log a thought.", {"thought": "string"}),
    py_tool("finish", "Finish the task.", {"message": "string", "task_completed": {"type": "string", "enum": ["true", "false"]}}, ["message"]),
]


def _value(text: str) -> Any:
    value = text.strip()
    if value.isdigit() and value.isascii():
        return int(value)
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


@register(NAME, sources=[DATASET])
@guarded()
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id",), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    system = []
    first_user = True
    for role, content in turns(ctx, "messages", roles=("system", "user", "assistant")):
        if role == "system":
            system.append(content)
        elif role == "user":
            b.text(content, "user" if first_user else "environment")
            first_user = False
        else:
            m = re.search(r"<function=(\w+)>(.*?)</function>", content, re.DOTALL) if "<function=" in content else None
            if not m:
                b.message(content.strip(), thought=None)
                continue
            name = m.group(1)
            kwargs = {k: _value(v) for k, v in re.findall(r"<parameter=(\w+)>(.*?)</parameter>", m.group(2), re.DOTALL)}
            thought = content[: m.start()].strip() or None
            if name in ("execute_bash", "execute_ipython_cell"):
                code = kwargs.get("command" if name == "execute_bash" else "code", "")
                b.code("bash" if name == "execute_bash" else "python", code if isinstance(code, str) else str(code), thought=thought)
            else:
                b.api(name, kwargs, thought=thought)
    details = {"category": record.get("category") if isinstance(record.get("category"), str) else "",
               "source": record.get("source") if isinstance(record.get("source"), str) else ""}
    if system:
        details["system"] = "\n\n".join(system)
    return b.build(tools=TOOLS, details=details)
