"""xLAM / AgentOhana unified trajectories (SalesforceAIResearch/xLAM, ActionStudio) -> interlingua.

Raw format (one object per trajectory):
- `unique_trajectory_id`: string id.
- `task_instruction`: the task / system prompt (the trainer adds a format instruction to it).
- `tools`: list of tool specs {`name`, `description`, `parameters`} (JSON Schema, or xLAM's
  {param: {"type": "str, optional", "description", "default"}} map; a JSON string is accepted).
- `conversation`: OpenAI-style messages {`role`: "user" | "assistant" | "tool" (| "system"),
  `content`: str | null, `tool_calls`: [{`id`?, `function`: {`name`, `arguments`: JSON string or
  object}}] (assistant), `tool_call_id`? / `name`? (tool)}.

Mapping (our choice): `task_instruction` and system turns are text observations with source
"environment" and name "system"; user turns are user text; an assistant turn with tool calls gives
one api action per call (its text is the first call's `thought`; a leading `<think>...</think>` goes
to `reasoning`), otherwise a message action; tool results are environment text observations named
after the tool and linked by `tool_call_id` (the source's ids, else "call_<n>" in call order, paired
first-in first-out). Tool parameters become JSON Schema (see `converters._fc.parameters_schema`).
Call arguments that are not a JSON object (e.g. truncated JSON) raise ConversionError.
"""

from __future__ import annotations

from typing import Any

from converters._fc import CallLinker, call_arguments, split_think, tool_specs
from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "xlam"
DATASET = "SalesforceAIResearch/xLAM (AgentOhana / ActionStudio unified format)"


@register(NAME, sources=["SalesforceAIResearch/xLAM (AgentOhana / ActionStudio unified format)"])
@guarded(("unique_trajectory_id", "id"))
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("unique_trajectory_id", "id"), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    tools = tool_specs(ctx, record.get("tools"), "tools")
    instruction = ctx.get(record, "task_instruction", str, default="")
    if instruction:
        b.text(instruction, "environment", name="system")
    link = CallLinker()
    tool_names: dict[str, str] = {}
    messages = ctx.dicts(record, "conversation")
    if not messages:
        ctx.fail("`conversation` is empty")
    for i, msg in enumerate(messages):
        where = f"conversation[{i}]"
        role = ctx.str_(msg, "role", where)
        content = ctx.get(msg, "content", str, where, default="")
        if role == "system":
            b.text(content, "environment", name="system")
        elif role == "user":
            b.text(content, "user")
        elif role == "assistant":
            reasoning, text = split_think(content)
            calls = ctx.dicts(msg, "tool_calls", where, default=[])
            if not calls:
                b.message(text, reasoning=reasoning)
                continue
            for j, call in enumerate(calls):
                cw = f"{where}.tool_calls[{j}]"
                fn = ctx.get(call, "function", dict, cw) if "function" in call else call
                name = ctx.str_(fn, "name", cw)
                args = call_arguments(ctx, fn.get("arguments"), f"{cw}.arguments")
                call_id = link.new(call.get("id"))
                tool_names[call_id] = name
                first = j == 0
                b.api(name, args, thought=(text.strip() or None) if first else None,
                      reasoning=reasoning if first else None, tool_call_id=call_id)
        elif role in ("tool", "function", "observation"):
            call_id = link.result(msg.get("tool_call_id"))
            name = msg.get("name") if isinstance(msg.get("name"), str) else tool_names.get(call_id or "")
            b.text(content, "environment", name=name, tool_call_id=call_id)
        else:
            ctx.fail(f"`{where}.role` is {role[:40]!r}")
    return b.build(tools=tools)
