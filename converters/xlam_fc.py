"""xlam-function-calling-60k (Salesforce/xlam-function-calling-60k) -> interlingua.

Raw format (one object per single-turn example; cc-by-4.0):
- `id`: integer id.
- `query`: the user request (string).
- `tools`: JSON string: list of {`name`, `description`, `parameters`: {param: {`type`: "str" /
  "int, optional" / "List[int]" ..., `description`, `default`?}}}.
- `answers`: JSON string: list of {`name`, `arguments`: object} — the calls that answer the query.

Mapping: the query is a user text observation; each answer is an api action with its parsed
arguments and a generated `tool_call_id` ("call_1", ...; the dataset has no tool results, so no
observations follow); `tools` become JSON Schema (see `converters._fc.parameters_schema`).
Truncated / invalid JSON in `tools` or `answers` raises ConversionError.
"""

from __future__ import annotations

from typing import Any

from converters._fc import CallLinker, call_arguments, tool_specs
from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "xlam_fc"
DATASET = "Salesforce/xlam-function-calling-60k"


@register(NAME, sources=[DATASET])
@guarded(("id",))
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id",), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    tools = tool_specs(ctx, ctx.get(record, "tools", (str, list)), "tools")
    b.text(ctx.str_(record, "query"), "user")
    answers = ctx.get(record, "answers", (str, list))
    if isinstance(answers, str):
        answers = ctx.json_loads(answers, "answers")
    if not isinstance(answers, list):
        ctx.fail("`answers` is not a list")
    link = CallLinker()
    for i, answer in enumerate(answers):
        where = f"answers[{i}]"
        if not isinstance(answer, dict):
            ctx.fail(f"`{where}` is {type(answer).__name__}, expected an object")
        name = ctx.str_(answer, "name", where)
        args = call_arguments(ctx, answer.get("arguments"), f"{where}.arguments")
        b.api(name, args, thought=None, tool_call_id=link.new())
    return b.build(tools=tools)
