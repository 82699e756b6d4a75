"""`sharegpt`: the ShareGPT layout LLaMA-Factory reads (`formatting: sharegpt`).

Row: `{"conversations": [{"from", "value"}], "system": str | null, "tools": <JSON string> | null}`
(plus `id`, `source`). Roles map: system -> the `system` column; user -> `human`; assistant ->
`gpt`, or `function_call` when it makes tool calls (value = the call as JSON
`{"name", "arguments": {...}}`, a JSON list for parallel calls); tool -> `observation`.
`tools` is a JSON list of `{"name", "description", "parameters"}` (LLaMA-Factory's tools column).

LLaMA-Factory requires strict alternation (human/observation at odd positions, gpt/function_call
at even ones, ending on the model side), so: consecutive same-side turns are merged (values joined
by a blank line; an assistant message without a call folds into the next assistant message); trailing human/observation turns after the last model
turn are left out; a conversation that does not start with a human turn is skipped. A thought
or reasoning that accompanies a call goes before the JSON in a `<think>...</think>` block (the
thought words LLaMA-Factory's function formatter strips), reasoning on a `gpt` turn likewise.
The loss mask cannot be expressed: trajectories with masked steps are skipped ("masked steps need
the prompt-completion layout" — use trl-sft or openai).
"""

from __future__ import annotations

import json
from typing import Any

from converters.export.options import FormatOptions
from converters.export.render import Turn, Unrenderable, render
from converters.export.sft import has_masked_steps
from converters.export.tools import function_specs
from schemas.models import Trajectory

_HUMAN_SIDE = ("human", "observation")


def _think(thoughts: list[str], text: str) -> str:
    inner = "\n\n".join(t for t in thoughts if t)
    return f"<think>{inner}</think>{text}" if inner else text


def _merge_assistant(turns: list[Turn]) -> list[dict[str, Any]]:
    """Fold an assistant message into the next one when the first makes no call (one model turn)."""
    out: list[dict[str, Any]] = []
    for turn in turns:
        msg = turn.message
        prev = out[-1] if out else None
        if prev and prev["role"] == "assistant" == msg["role"] and not prev.get("tool_calls"):
            merged = dict(msg)
            merged["content"] = "\n\n".join(x for x in (prev.get("content"), msg.get("content")) if x)
            merged["reasoning_content"] = "\n\n".join(
                x for x in (prev.get("reasoning_content"), msg.get("reasoning_content")) if x)
            out[-1] = merged
        else:
            out.append(msg)
    return out


def _turn(msg: dict[str, Any]) -> dict[str, str]:
    role = msg["role"]
    if role == "user":
        return {"from": "human", "value": msg["content"]}
    if role == "tool":
        return {"from": "observation", "value": msg["content"]}
    reasoning = msg.get("reasoning_content") or ""
    calls = msg.get("tool_calls")
    if calls:
        parsed = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])} for c in calls]
        payload = json.dumps(parsed[0] if len(parsed) == 1 else parsed, ensure_ascii=False)
        return {"from": "function_call", "value": _think([reasoning, msg.get("content") or ""], payload)}
    return {"from": "gpt", "value": _think([reasoning], msg.get("content") or "")}


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


def sharegpt_rows(traj: Trajectory, opts: FormatOptions) -> list[dict[str, Any]]:
    if has_masked_steps(traj):
        raise Unrenderable("masked steps need the prompt-completion layout")
    turns = render(traj, opts.render)
    system = next((t.message["content"] for t in turns if t.role == "system"), None)
    conversations = _alternate([_turn(m) for m in _merge_assistant([t for t in turns if t.role != "system"])])
    if not conversations or conversations[0]["from"] != "human":
        raise Unrenderable("conversation does not start with a human turn")
    specs = function_specs(traj)
    return [{
        "id": traj.id,
        "source": traj.source,
        "conversations": conversations,
        "system": system,
        "tools": json.dumps(specs, ensure_ascii=False) if specs else None,
    }]
