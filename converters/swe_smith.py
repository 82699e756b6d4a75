"""SWE-smith trajectories (SWE-bench/SWE-smith-trajectories) -> interlingua.

Raw format (one object per trajectory, SWE-agent runs with function calling in XML form):
- `id`: trajectory id (`traj_id` + "_<n>"); `traj_id`: run id; `instance_id`: SWE-smith task.
- `messages`: list of {`role`: "system" | "user" | "assistant" | "tool", `content`: str or
  [{"type": "text", "text": str}]} (the HF dataset may store the list as a JSON string); assistant
  turns hold `<function=name>\\n<parameter=p>value</parameter>\\n</function>` calls; tool output
  starts with "OBSERVATION:".
- `patch`: final diff; `model`: generating model; `resolved`: whether the patch resolved the task.

Follows ADP's `datasets/swe-smith/raw_to_standardized.py`: the system prompt is dropped (kept in
`details["system"]`); each `<function=...>` block is an api action (bash -> `bash` code action),
parameters that look like JSON lists / digits / booleans are parsed; "OBSERVATION:" turns are
environment text; a trajectory ending on submit gets ADP's closing turns (picked from the id). ADP
keeps only trajectories ending on submit; we convert all and set `success` from `resolved`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from converters._swe import BASH, STR_REPLACE_EDITOR, SUBMIT
from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "swe-smith"
DATASET = "SWE-bench/SWE-smith-trajectories"
_CALL = re.compile(r"<function=([^>]+)>\s*(.*?)\s*</function>", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>]+)>(.*?)</parameter>", re.DOTALL)


def _messages(ctx: Ctx) -> list[tuple[str, str]]:
    raw = ctx.get(ctx.raw, "messages", (list, str))
    if isinstance(raw, str):
        raw = ctx.json_loads(raw, "messages")
        if not isinstance(raw, list):
            ctx.fail("`messages` JSON is not a list")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if isinstance(m, list) and len(m) == 1:
            m = m[0]
        if not isinstance(m, dict):
            ctx.fail(f"`{where}` is {type(m).__name__}, expected an object")
        role = ctx.str_(m, "role", where)
        content = ctx.get(m, "content", (str, list), where)
        if isinstance(content, list):
            if len(content) != 1 or not isinstance(content[0], dict):
                ctx.fail(f"`{where}.content` must be a string or one text part")
            content = ctx.str_(content[0], "text", f"{where}.content[0]")
        out.append((role, content))
    if not out:
        ctx.fail("`messages` is empty")
    return out


def _param(value: str) -> Any:
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if value.isdigit() and value.isascii():
        return int(value)
    if value in ("true", "false"):
        return value == "true"
    return value


@register(NAME, sources=[DATASET])
@guarded(("id", "traj_id"))
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id", "traj_id"), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    system = []
    for role, content in _messages(ctx):
        if role == "system":
            system.append(content)
        elif role in ("user", "tool"):
            if content.startswith("OBSERVATION:"):
                b.text(content[len("OBSERVATION:") :].strip(), "environment")
            else:
                b.text(content, "user" if role == "user" else "environment")
        elif role == "assistant":
            calls = list(_CALL.finditer(content)) if "<function=" in content else []
            if not calls:
                b.message(content)
            pos = 0
            for call in calls:
                thought = content[pos : call.start()].strip() or None
                name = call.group(1)
                kwargs = {k: _param(v) for k, v in _PARAM.findall(call.group(2))}
                if name == "bash":
                    command = kwargs.get("command")
                    if not isinstance(command, str):
                        command = "" if command is None else str(command)
                    b.code("bash", command, thought=thought)
                else:
                    b.api(name, kwargs, thought=thought)
                pos = call.end()
        else:
            ctx.fail(f"unknown role {role[:40]!r}")
    last = b.last
    if last and last["kind"] == "api" and last["function"] == "submit":
        b.closing("content")
    resolved = record.get("resolved")
    details = {k: record[k] for k in ("instance_id", "traj_id", "model", "patch") if isinstance(record.get(k), str)}
    if system:
        details["system"] = "\n\n".join(system)
    return b.build(tools=[BASH, STR_REPLACE_EDITOR, SUBMIT], success=resolved if isinstance(resolved, bool) else None,
                   details=details, task_id=details.get("instance_id"), model=details.get("model"))
