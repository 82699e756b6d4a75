"""APIGen-MT-5k (Salesforce/APIGen-MT-5k; tau-bench retail + airline) -> interlingua.

Raw format (one object per multi-turn conversation; cc-by-nc-4.0; no id field):
- `conversations`: list of {`from`: "human" | "gpt" | "function_call" | "observation", `value`: str};
  a function_call value is JSON {"name", "arguments"}; an observation value is the tool result.
- `system`: the domain policy text (string).
- `tools`: JSON string: list of {`name`, `description`, `parameters`} (JSON Schema).

Mapping (our choice): `system` is the first step, a text observation with source "environment"
and name "system"; human turns are user text; gpt turns are message actions (a leading
`<think>...</think>` goes to `reasoning`); each function_call is an api action with parsed
arguments and a generated `tool_call_id` ("call_<n>"); observations are environment text named
after the tool and linked to the oldest unanswered call. The id is `apigen_mt/xxh3:<hash>` of
the record (an `id` field is used when present). Truncated / invalid JSON raises ConversionError.
"""

from __future__ import annotations

from typing import Any

from converters._fc import CallLinker, call_arguments, split_think, tool_specs
from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "apigen_mt"
DATASET = "Salesforce/APIGen-MT-5k"


@register(NAME, sources=[DATASET])
@guarded(("id",))
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id",))
    b = Builder(ctx, NAME, DATASET)
    tools = tool_specs(ctx, record.get("tools"), "tools")
    system = ctx.get(record, "system", str, default="")
    if system:
        b.text(system, "environment", name="system")
    link = CallLinker()
    names: dict[str, str] = {}
    turns = ctx.dicts(record, "conversations")
    if not turns:
        ctx.fail("`conversations` is empty")
    for i, turn in enumerate(turns):
        where = f"conversations[{i}]"
        who = ctx.str_(turn, "from", where)
        value = ctx.str_(turn, "value", where)
        if who == "human":
            b.text(value, "user")
        elif who == "gpt":
            reasoning, text = split_think(value)
            b.message(text, reasoning=reasoning)
        elif who == "function_call":
            call = ctx.json_loads(value, f"{where}.value")
            if not isinstance(call, dict):
                ctx.fail(f"`{where}.value` is not a JSON object")
            name = ctx.str_(call, "name", f"{where}.value")
            args = call_arguments(ctx, call.get("arguments"), f"{where}.value.arguments")
            call_id = link.new()
            names[call_id] = name
            b.api(name, args, thought=None, tool_call_id=call_id)
        elif who == "observation":
            call_id = link.result()
            b.text(value, "environment", name=names.get(call_id or ""), tool_call_id=call_id)
        else:
            ctx.fail(f"`{where}.from` is {who[:40]!r}, expected human, gpt, function_call or observation")
    return b.build(tools=tools)
