"""Toucan-1.5M MCP tool-use trajectories (Agent-Ark/Toucan-1.5M) -> interlingua.

Raw format (one object per trajectory):
- `id`: trajectory id (ADP's extraction id, e.g. "toucan_sample_0"); `uuid`: the upstream uuid.
- `subset_name`: e.g. "single-turn-original"; `question`: the user task.
- `messages`: list of {`role`: "system" | "user" | "assistant" | "function", `content`: str,
  `function_call`: {`name`, `arguments`: JSON string} (assistant, optional), `name`: tool name
  (function)}; the HF dataset stores this list as a JSON string, accepted too. The system turn
  declares the tools (Kimi-K2 `<|im_system|>tool_declare` text).
- `available_tools`: OpenAI tool specs ({"type": "function", "function": {name, description, parameters}}).
- `target_tools`: tool names the question targets; `question_quality_assessment`,
  `response_quality_assessment`: LLM judge notes; `metadata`: {prompt_id, row_id, mcp_servers}.

Follows ADP's `datasets/toucan_1_5m/raw_to_standardized.py`: MCP tool names become Python
identifiers ("exa-search-web_search_exa" -> "web_search_exa": hyphens to underscores, the
"exa_search_" server prefix dropped), also inside the system text, which is kept as an environment
text observation named "system"; an assistant function_call is an api action (arguments parsed
from JSON; unparsable arguments raise ConversionError where ADP kept them raw), its text a message;
function results are environment text named by the tool, linked to the call by generated
`tool_call_id`s ("call_1", ...); the last message is wrapped in `<finish>` (or a
"<finish> Task completed. </finish>" message is added).
"""

from __future__ import annotations

import json
import re
from typing import Any

from converters._util import Builder, Ctx, guarded, openai_tool
from converters.registry import register
from schemas.models import Trajectory

NAME = "toucan_1_5m"
DATASET = "Agent-Ark/Toucan-1.5M"


def tool_name(name: str) -> str:
    name = name.replace("-", "_")
    return name[len("exa_search_") :] if name.startswith("exa_search_") else name


def _rename_in_text(text: str) -> str:
    return re.sub(r'"name":\s*"([^"]+)"', lambda m: f'"name": "{tool_name(m.group(1))}"', text)


@register(NAME, sources=[DATASET])
@guarded(("id", "uuid"))
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id", "uuid"), require_id=True)
    raw_msgs = ctx.get(record, "messages", (list, str))
    if isinstance(raw_msgs, str):
        raw_msgs = ctx.json_loads(raw_msgs, "messages")
        if not isinstance(raw_msgs, list):
            ctx.fail("`messages` JSON is not a list")
    b = Builder(ctx, NAME, DATASET)
    pending: list[str] = []
    n_calls = 0
    for i, msg in enumerate(raw_msgs):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            ctx.fail(f"`{where}` is {type(msg).__name__}, expected an object")
        role = ctx.str_(msg, "role", where)
        content = ctx.get(msg, "content", str, where, default="")
        if role == "system":
            if content.strip():
                b.text(_rename_in_text(content), "environment", name="system")
        elif role == "user":
            b.text(content, "user")
        elif role == "assistant":
            call = msg.get("function_call")
            if call:
                if not isinstance(call, dict):
                    ctx.fail(f"`{where}.function_call` is {type(call).__name__}, expected an object")
                name = ctx.get(call, "name", str, f"{where}.function_call", default="")
                args = call.get("arguments", "{}")
                kwargs = args if isinstance(args, dict) else ctx.json_loads(args, f"{where}.function_call.arguments")
                if not isinstance(kwargs, dict):
                    ctx.fail(f"`{where}.function_call.arguments` is not a JSON object")
                n_calls += 1
                call_id = f"call_{n_calls}"
                pending.append(call_id)
                b.api(tool_name(name), kwargs, thought=None, tool_call_id=call_id)
            if content.strip():
                b.message(content, thought=None)
        elif role == "function":
            name = ctx.get(msg, "name", str, where, default="function_result")
            step = b.text(content, "environment", name=tool_name(name))
            if pending:
                step["tool_call_id"] = pending.pop(0)
        else:
            ctx.fail(f"`{where}.role` is {role[:40]!r}")
    last = b.last
    if last and not (last["kind"] == "message" and "<finish>" in last["content"]):
        if last["kind"] == "message":
            last["content"] = f"<finish> {last['content']} </finish>"
        else:
            b.message("<finish> Task completed. </finish>", thought=None)
    tools = []
    for j, spec in enumerate(ctx.items(record, "available_tools", default=[])):
        tool = openai_tool(spec, ctx, f"available_tools[{j}]")
        tool["name"] = tool_name(tool["name"])
        tools.append(tool)
    details: dict[str, Any] = {}
    for key in ("uuid", "subset_name", "question", "question_quality_assessment", "response_quality_assessment"):
        if isinstance(record.get(key), str):
            details[key] = record[key]
    if isinstance(record.get("target_tools"), (list, str)):
        details["target_tools"] = record["target_tools"]
    if isinstance(record.get("metadata"), dict):
        details["metadata"] = record["metadata"]
    return b.build(tools=tools, details=json.loads(json.dumps(details, default=str)))
