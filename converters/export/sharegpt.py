"""`sharegpt`: the ShareGPT layout LLaMA-Factory reads (`formatting: sharegpt`), as of LLaMA-Factory 0.9.5.

Row: `{"conversations": [{"from", "value"}], "system": str | null, "tools": <JSON text> | null}`
(plus `id`, `source`). Roles map: system -> the `system` column; user -> `human`; assistant ->
`gpt`, or `function_call` when it makes tool calls (value = the call as JSON
`{"name", "arguments": {...}}` with the arguments as an object, a JSON list for parallel calls);
tool -> `observation`. `tools` is a JSON list of `{"name", "description", "parameters"}`.
The export writes `dataset_info.json` next to `data/` with this layout declared, so
`dataset_dir: OUT` + `dataset: trajforge` loads it.

LLaMA-Factory's rules, and how the rows meet them:
- `SharegptDatasetConverter` requires strict alternation (human/observation at even positions,
  gpt/function_call at odd ones) and an even count: consecutive same-side turns are merged
  (values joined by a blank line; an assistant message without a call folds into the next
  assistant message); messages after the last model turn are left out; a conversation that
  does not start with a human turn is skipped.
- `FunctionFormatter` splits a thought off a function_call value with the template's thought
  words (`"<think>\\n"`, `"\\n</think>\\n\\n"` by default) and `json.loads` the rest: a thought or
  reasoning that accompanies a call is written `<think>\\n{thought}\\n</think>\\n\\n{json}`, which
  templates with the bare `<think>` / `</think>` words split as well. Reasoning on a gpt turn is
  written the same way (the reasoning templates' format).
- It trains every gpt/function_call turn (`mask_history: false`) and no human/observation turn:
  it cannot mask single model turns, so trajectories with a masked assistant step are skipped
  ("masked steps need the prompt-completion layout" — use trl-sft, tokenized or openai).
"""

from __future__ import annotations

import json
from typing import Any

from converters.export.options import FormatOptions
from converters.export.records import Record
from converters.export.render import ROLES, SYSTEM, Conversation, Unrenderable

THOUGHT_WORDS = ("<think>\n", "\n</think>\n\n")
_HUMAN_SIDE = ("human", "observation")
DATASET_INFO = {
    "trajforge": {
        "file_name": "data",
        "formatting": "sharegpt",
        "columns": {"messages": "conversations", "system": "system", "tools": "tools"},
        "tags": {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                 "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"},
    }
}


def _think(parts: list[str], text: str) -> str:
    inner = "\n\n".join(p for p in parts if p)
    return f"{THOUGHT_WORDS[0]}{inner}{THOUGHT_WORDS[1]}{text}" if inner else text


def _call(name: str, arguments: str) -> str:
    # The stored arguments are JSON text of an object: splice it in, no parse and re-dump.
    return f'{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {arguments}}}'


def _join(a: str | None, b: str | None) -> str:
    return "\n\n".join(x for x in (a, b) if x)


def _merged(conv: Conversation) -> list[tuple[str, str, str, list[tuple[str, str]]]]:
    """(role, content, reasoning, calls as (name, arguments)) per message; an assistant message
    without a call folds into the next assistant message (one model turn)."""
    r = conv.r
    roles, contents, reasonings, calls = r.py("role"), r.py("content"), r.py("reasoning_content"), r.py("tool_calls")
    out: list[tuple[str, str, str, list[tuple[str, str]]]] = []
    for m in conv.idx:
        if roles[m] == SYSTEM:
            continue
        role = ROLES[roles[m]]
        named = [(c["function"]["name"], c["function"]["arguments"]) for c in calls[m] or ()]
        if out and role == "assistant" == out[-1][0] and not out[-1][3]:
            prev = out[-1]
            out[-1] = (role, _join(prev[1], contents[m]), _join(prev[2], reasonings[m]), named)
        else:
            out.append((role, contents[m] or "", reasonings[m] or "", named))
    return out


def _turn(role: str, content: str, reasoning: str, calls: list[tuple[str, str]]) -> dict[str, str]:
    if role == "user":
        return {"from": "human", "value": content}
    if role == "tool":
        return {"from": "observation", "value": content}
    if calls:
        payload = [_call(name, args) for name, args in calls]
        value = payload[0] if len(payload) == 1 else "[" + ", ".join(payload) + "]"
        return {"from": "function_call", "value": _think([reasoning, content], value)}
    return {"from": "gpt", "value": _think([reasoning], content)}


def _alternate(turns: list[dict[str, str]]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for turn in turns:
        if out and (out[-1]["from"] in _HUMAN_SIDE) == (turn["from"] in _HUMAN_SIDE):
            out[-1] = {"from": out[-1]["from"], "value": f"{out[-1]['value']}\n\n{turn['value']}"}
        else:
            out.append(turn)
    while out and out[-1]["from"] in _HUMAN_SIDE:
        out.pop()
    return out


def sharegpt_rows(record: Record, opts: FormatOptions) -> list[dict[str, Any]]:
    if record.has_masked_assistant_step():
        raise Unrenderable("masked steps need the prompt-completion layout")
    conv = record.render(opts.render)
    system = next((conv.r.py("content")[m] for m in conv.idx if conv.r.py("role")[m] == SYSTEM), None)
    conversations = _alternate([_turn(*m) for m in _merged(conv)])
    if not conversations or conversations[0]["from"] != "human":
        raise Unrenderable("conversation does not start with a human turn")
    return [{"id": record.id, "source": record.source, "conversations": conversations, "system": system,
             "tools": record.specs_json()}]
