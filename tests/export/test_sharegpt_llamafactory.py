"""sharegpt rows against LLaMA-Factory's own conversion rules (llamafactory 0.9.5).

The rules below are LLaMA-Factory 0.9.5's, rewritten from its source (`src/llamafactory/data/`):
`converter.py` (`SharegptDatasetConverter`: tag alternation and count), `formatter.py`
(`FunctionFormatter`: thought words split off, then `json.loads` of the call, then each call's
`arguments` re-dumped with `json.dumps` — a JSON *string* there would be double-encoded) and
`tool_utils.py` (`DefaultToolUtils.tool_formatter` reads `parameters["properties"]` of every tool).
llamafactory from PyPI is not a test dependency: it pins transformers, torch, torchvision and
torchaudio builds that conflict with this project's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from converters.export import ExportConfig, export
from tests.export import _data

THOUGHT_WORDS = ("<think>\n", "\n</think>\n\n")  # Template default (template.py, register_template)
TOOL_CALL_WORDS = ("<tool_call>", "</tool_call>")
TAGS = {"human": "user", "gpt": "assistant", "observation": "observation", "function_call": "function"}
ODD, EVEN = ("human", "observation"), ("gpt", "function_call")


class Broken(Exception):
    pass


def convert(row: dict[str, Any]) -> dict[str, Any]:
    """SharegptDatasetConverter.__call__ for a normal (not ranking, not KTO) example."""
    messages = row["conversations"]
    if messages and messages[0]["from"] == "system":
        system, messages = messages[0]["value"], messages[1:]
    else:
        system = row["system"] or ""
    aligned = []
    for turn_idx, message in enumerate(messages):
        if message["from"] not in (ODD, EVEN)[turn_idx % 2]:
            raise Broken(f"Invalid role tag in {messages}.")
        aligned.append({"role": TAGS[message["from"]], "content": message["value"]})
    if len(aligned) % 2 != 0:
        raise Broken(f"Invalid message count in {messages}.")
    return {"_prompt": aligned[:-1], "_response": aligned[-1:], "_system": system, "_tools": row["tools"] or ""}


def function_calls(content: str) -> tuple[str | None, list[dict[str, Any]]]:
    """FunctionFormatter.apply's parsing: (the thought block it keeps, the calls)."""
    tool_call = re.search(rf"{re.escape(TOOL_CALL_WORDS[0])}(.*?){re.escape(TOOL_CALL_WORDS[1])}", content, re.DOTALL)
    assert tool_call is None, "a <tool_call> block would be parsed instead of the JSON"
    thought = re.search(rf"{re.escape(THOUGHT_WORDS[0])}(.*?){re.escape(THOUGHT_WORDS[1])}", content, re.DOTALL)
    json_part = content.replace(thought.group(0), "") if thought else content
    try:
        calls = json.loads(json_part)
    except json.JSONDecodeError:
        raise Broken(f"Invalid JSON format in function message: {str([content])}.") from None
    calls = calls if isinstance(calls, list) else [calls]
    for call in calls:
        json.dumps(call["arguments"], ensure_ascii=False)  # FunctionCall(name, json.dumps(arguments))
    return (thought.group(1) if thought else None), calls


def default_tool_prompt(tools: str) -> None:
    """ToolFormatter.apply -> DefaultToolUtils.tool_formatter's reads."""
    for tool in json.loads(tools):
        tool = tool.get("function", "") if tool.get("type") == "function" else tool
        for name, param in tool["parameters"]["properties"].items():
            _ = (name in tool["parameters"].get("required", []), param.get("type", ""), param.get("description", ""))
        _ = (tool["name"], tool.get("description", ""))


def check(rows: list[dict[str, Any]]) -> int:
    """Every row converts, every function_call parses with object arguments; returns the calls seen."""
    calls_seen = 0
    for row in rows:
        converted = convert(row)
        if converted["_tools"]:
            default_tool_prompt(converted["_tools"])
        for message in converted["_prompt"] + converted["_response"]:
            if message["role"] == "function":
                _, calls = function_calls(message["content"])
                assert all(isinstance(c["arguments"], dict) for c in calls), message["content"]
                calls_seen += len(calls)
    return calls_seen


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, adp_dir: Path) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("sharegpt")
    trajectories = [_data.tool_traj(), _data.masked_observation_traj(), *_data.adp_trajectories(adp_dir)]
    src = _data.store(root / "src", trajectories)
    report = export(src, root / "out", ExportConfig(format="sharegpt"))
    assert report.rows > 10
    info = json.loads((root / "out" / "dataset_info.json").read_text())["trajforge"]
    assert info["formatting"] == "sharegpt" and info["file_name"] == "data"
    return pq.read_table(root / "out" / "data").to_pylist()


def test_every_row_passes_llamafactory_conversion(exported):
    assert check(exported) > 20


def test_thoughts_use_the_thought_words_and_survive(exported):
    row = next(r for r in exported if r["id"] == "t-tool")
    thought, calls = function_calls(row["conversations"][1]["value"])
    assert thought == "The user wants two cities.\n\nCheck Paris first."
    assert calls == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    row = next(r for r in exported if r["id"] == "t-maskobs")
    assert function_calls(row["conversations"][1]["value"]) == (
        "TRAINEDOSLO", [{"name": "get_weather", "arguments": {"city": "Oslo", "units": {"temp": "C"}}}])


def test_the_check_catches_what_the_old_layout_wrote():
    old = {"conversations": [{"from": "human", "value": "hi"},
                             {"from": "function_call", "value": '<think>plan</think>{"name": "f", "arguments": "{}"}'}],
           "system": None, "tools": json.dumps([{"name": "f", "parameters": {"type": "object"}}])}
    with pytest.raises(Broken, match="Invalid JSON format"):
        check([{**old, "tools": None}])
    with pytest.raises(KeyError):
        default_tool_prompt(old["tools"])
    with pytest.raises(Broken, match="Invalid role tag"):
        convert({"conversations": [{"from": "gpt", "value": "x"}], "system": None, "tools": None})
