"""Nebius SWE-agent trajectories (nebius/SWE-agent-trajectories) -> interlingua.

Raw format (one object per trajectory, SWE-agent runs on SWE-bench-extra):
- `instance_id`: trajectory id (task instance + "_<run>"), e.g. "tomerfiliba__plumbum-366_17".
- `model_name`: the agent model; `target`: whether the run resolved the task (bool).
- `trajectory`: list of {`role`: "system" | "user" | "ai", `text`: str | null, `system_prompt`:
  str | null, `mask`: bool, `cutoff_date`: str | null}; ai turns are "DISCUSSION ... ```\\n<command>\\n```".
- `exit_status`: e.g. "submitted"; `generated_patch`: final diff; `eval_logs`: evaluation log text.

Follows ADP's `datasets/nebius_SWE-agent-trajectories/raw_to_standardized.py`: system turns are
dropped (`details["system"]`), user turns are user text; an ai command that is a SWE-agent
interface command (open, goto, edit, find_file, search_dir, search_file, scroll_*, create, submit)
becomes an api action with ADP's argument convention (str arguments in double quotes, others as
the raw token; edit -> start_line / end_line / replacement_text), any other command a `bash` code
action; an ai turn that cannot be parsed is a message. A trajectory ending on an action gets ADP's
closing turns (picked from the id). ADP skips `target == false` runs; we keep them, `success = target`.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from converters._util import Builder, Ctx, guarded, py_tool
from converters.registry import register
from schemas.models import Trajectory

NAME = "nebius_SWE-agent-trajectories"
DATASET = "nebius/SWE-agent-trajectories"

# name -> [(param, is_str)], in signature order
SIGNATURES: dict[str, list[tuple[str, bool]]] = {
    "open": [("path", True), ("line_number", False)],
    "goto": [("line_number", False)],
    "scroll_down": [],
    "scroll_up": [],
    "create": [("filename", True)],
    "submit": [],
    "search_dir": [("search_term", True), ("dir", True)],
    "search_file": [("search_term", True), ("file", True)],
    "find_file": [("file_name", True), ("dir", True)],
    "edit": [("start_line", False), ("end_line", False), ("replacement_text", True)],
}
_REQUIRED = {"open": 1, "goto": 1, "create": 1, "search_dir": 1, "search_file": 1, "find_file": 1, "edit": 3}
_DESCRIPTIONS = {
    "open": "Open a file in the editor, optionally at a line.",
    "goto": "Move the editor window to a line.",
    "scroll_down": "Scroll the editor window down.",
    "scroll_up": "Scroll the editor window up.",
    "create": "Create and open a new file.",
    "submit": "Submit the current changes and end the session.",
    "search_dir": "Search for a term in the files of a directory.",
    "search_file": "Search for a term in a file (default: the open file).",
    "find_file": "Find files by name in a directory.",
    "edit": "Replace lines start_line..end_line of the open file with replacement_text.",
}
TOOLS = [
    py_tool(n, _DESCRIPTIONS[n], {p: ("string" if s else "integer") for p, s in sig}, [p for p, _ in sig[: _REQUIRED.get(n, 0)]])
    for n, sig in SIGNATURES.items()
]


class _Unparsed(Exception):
    pass


def _edit_args(action: str) -> dict[str, Any]:
    parts = action.split()
    if len(parts) < 2:
        raise _Unparsed
    if re.match(r"^\d+:\d+$", parts[1]):
        lines, text = parts[1], action.split(None, 2)[-1].strip()
    else:
        if len(parts) < 3 or not re.match(r"^\d+:\d+$", parts[2]):
            raise _Unparsed
        lines, text = parts[2], action.split(None, 3)[-1].strip()
    start, end = (int(x) for x in lines.split(":"))
    if text.endswith("end_of_edit"):
        text = text[: -len("end_of_edit")]
    return {"start_line": start, "end_line": end, "replacement_text": f'"{text}"'}


def parse_ai(b: Builder, text: str) -> None:
    parts = text.rsplit("```", 2)
    if len(parts) != 3:
        raise _Unparsed
    thought, action, remainder = parts[0].strip(), parts[1], parts[2].strip()
    if thought.startswith("DISCUSSION"):
        thought = thought[len("DISCUSSION") :].strip()
    if thought.endswith("COMMAND"):
        thought = thought[: -len("COMMAND")].strip()
    if remainder:
        thought = thought + " " + remainder
    lines = action.splitlines()
    if not lines:
        raise _Unparsed
    if re.fullmatch(r"\w+\s*", lines[0]):
        action = "\n".join(lines[1:])
    action = action.strip()
    if not action:
        raise _Unparsed
    name = action.split()[0]
    if name not in SIGNATURES:
        b.code("bash", action, thought=thought)
        return
    if name == "edit":
        kwargs = _edit_args(action)
    else:
        try:
            args = shlex.split(action)[1:]
        except ValueError:
            raise _Unparsed from None
        kwargs = {p: (f'"{a}"' if is_str else a) for (p, is_str), a in zip(SIGNATURES[name], args)}
    b.api(name, kwargs, thought=thought)


@register(NAME, sources=[DATASET])
@guarded(("instance_id",))
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("instance_id",), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    system = []
    items = ctx.dicts(record, "trajectory")
    if not items:
        ctx.fail("`trajectory` is empty")
    for i, item in enumerate(items):
        where = f"trajectory[{i}]"
        role = ctx.str_(item, "role", where)
        if role == "system":
            prompt = ctx.get(item, "system_prompt", str, where, default=None) or ctx.get(item, "text", str, where, default=None)
            if prompt:
                system.append(prompt)
            continue
        text = ctx.str_(item, "text", where)
        if role == "user":
            b.text(text, "user")
        elif role == "ai":
            if "```" in text:
                try:
                    parse_ai(b, text)
                except (_Unparsed, ValueError):
                    b.message(text)
            else:
                b.message(text)
        else:
            ctx.fail(f"`{where}.role` is {role[:40]!r}, expected system, user or ai")
    last = b.last
    if last and last["kind"] in ("api", "code"):
        b.closing("content")
    details = {k: (record.get(k) if isinstance(record.get(k), str) else "")
               for k in ("model_name", "exit_status", "generated_patch", "eval_logs")}
    if system:
        details["system"] = "\n\n".join(system)
    target = record.get("target")
    return b.build(tools=TOOLS, success=target if isinstance(target, bool) else None, details=details,
                   model=details["model_name"] or None)
