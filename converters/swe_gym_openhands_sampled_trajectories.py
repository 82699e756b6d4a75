"""SWE-Gym OpenHands sampled trajectories (SWE-Gym/OpenHands-Sampled-Trajectories) -> interlingua.

Raw format (one object per trajectory, OpenAI function-calling messages):
- `instance_id`: trajectory id (task instance + "_<n>"), e.g. "python__mypy-15976_0".
- `run_id`: the sampling run (model, settings); `resolved`: whether the final patch resolved the task.
- `messages`: list of {`role`: "system" | "user" | "assistant" | "tool", `content`: str,
  `tool_calls`: [{`id`, `type`: "function", `function`: {`name`, `arguments`: JSON string}}] | null,
  `tool_call_id`: str | null, `name`: str | null, `function_call`: null}.
- `tools`: OpenAI tool specs offered (execute_bash, str_replace_editor, finish).
- `test_result`: {`git_patch`, `report`: {...resolved...}, `test_output`, `apply_patch_output`}.

Follows ADP's `datasets/swe-gym_openhands_sampled_trajectories/raw_to_standardized.py`: system
turn dropped (`details["system"]`); tool results lose their "OBSERVATION:\\n" prefix and become
environment text linked by `tool_call_id`; execute_bash -> `bash` code action, finish -> a
`<finish> message </finish>` message, other calls -> api actions (arguments parsed from JSON);
parallel calls are interleaved with their results as ADP does; the issue prompt drops the BashTool
hint; a trajectory not ending on finish gets ADP's closing turns (picked from the id). ADP keeps
only resolved runs; we keep all, `success = resolved`. `thoughts` (optional): ADP's LLM-generated
thoughts ({step index: thought} or the whole generated_thoughts.json) fill empty thoughts.
"""

from __future__ import annotations


from typing import Any

from converters._chat import thought_map
from converters._util import Builder, Ctx, guarded, openai_tool
from converters.registry import register
from schemas.models import Trajectory

NAME = "swe-gym_openhands_sampled_trajectories"
DATASET = "SWE-Gym/OpenHands-Sampled-Trajectories"
PRIOR_INS = "2. Create a script to reproduce the error and execute it with `python <filename.py>` using the BashTool"
NEW_INS = "2. Create a script to reproduce the error and execute it"


@register(NAME, sources=[DATASET])
@guarded(("instance_id",))
def convert(record: Any, thoughts: Any = None) -> Trajectory:
    ctx = Ctx(record, ("instance_id",), require_id=True)
    generated = thought_map(ctx, thoughts)
    b = Builder(ctx, NAME, DATASET)
    system = []
    pending = 0
    messages = ctx.dicts(record, "messages")
    if not messages:
        ctx.fail("`messages` is empty")
    for idx, msg in enumerate(messages):
        where = f"messages[{idx}]"
        role = ctx.str_(msg, "role", where)
        raw_content = ctx.get(msg, "content", str, where, default=None)
        content = raw_content or ""
        if role == "system":
            system.append(content)
        elif role in ("user", "tool"):
            text = content.replace(PRIOR_INS, NEW_INS) if idx == 1 else content
            if "OBSERVATION:\n" in text:
                text = "\n".join(text.split("OBSERVATION:\n")[1:])
            call_id = ctx.get(msg, "tool_call_id", str, where, default=None) if role == "tool" else None
            name = ctx.get(msg, "name", str, where, default=None) if role == "tool" else None
            step = {"kind": "text", "content": text, "source": "user" if role == "user" else "environment"}
            if call_id:
                step["tool_call_id"] = call_id
            if name:
                step["extra"] = {"tool_name": name}
            if pending:
                pending -= 1
            if pending:
                b.steps.insert(len(b.steps) - pending, step)
            else:
                b.steps.append(step)
        elif role == "assistant":
            calls = ctx.dicts(msg, "tool_calls", where, default=[])
            if not calls:
                b.message(content)
            for j, call in enumerate(calls):
                cwhere = f"{where}.tool_calls[{j}]"
                if call.get("type", "function") != "function":
                    continue
                fn = ctx.get(call, "function", dict, cwhere)
                name = ctx.str_(fn, "name", f"{cwhere}.function")
                args = fn.get("arguments", "{}")
                kwargs = args if isinstance(args, dict) else ctx.json_loads(args, f"{cwhere}.function.arguments")
                if not isinstance(kwargs, dict):
                    ctx.fail(f"`{cwhere}.function.arguments` is not a JSON object")
                call_id = call.get("id") if isinstance(call.get("id"), str) else None
                # generated thoughts are keyed by the standardized step index
                thought = raw_content or generated.get(str(len(b.steps)), raw_content)
                if name == "finish":
                    final = kwargs.get("message", "Task completed.")
                    b.message(f"<finish> {final} </finish>", thought=thought)
                elif name == "execute_bash":
                    command = kwargs.get("command")
                    if not isinstance(command, str):
                        ctx.fail(f"`{cwhere}` execute_bash without a string `command`")
                    pending += 1
                    b.code("bash", command, thought=thought, tool_call_id=call_id)
                else:
                    pending += 1
                    b.api(name, kwargs, thought=thought, tool_call_id=call_id)
        else:
            ctx.fail(f"`{where}.role` is {role[:40]!r}")
    last = b.last
    if not (last and last["kind"] == "message" and "<finish>" in last["content"]):
        b.closing("content")
    tools = [openai_tool(t, ctx, f"tools[{i}]") for i, t in enumerate(ctx.items(record, "tools", default=[]))]
    for tool in tools:
        if isinstance(tool.get("parameters"), dict):
            tool["parameters"] = _drop_nulls(tool["parameters"])
    resolved = record.get("resolved")
    details: dict[str, Any] = {"run_id": record.get("run_id") if isinstance(record.get("run_id"), str) else ""}
    if isinstance(record.get("test_result"), dict):
        details["test_result"] = record["test_result"]
    if system:
        details["system"] = "\n\n".join(system)
    return b.build(tools=tools, success=resolved if isinstance(resolved, bool) else None, details=details)


def _drop_nulls(schema: Any) -> Any:
    """HF's Arrow export pads every tool's `properties` with the union of all keys as null: drop those."""
    if isinstance(schema, dict):
        return {k: _drop_nulls(v) for k, v in schema.items() if v is not None}
    if isinstance(schema, list):
        return [_drop_nulls(v) for v in schema]
    return schema
