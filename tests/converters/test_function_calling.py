"""xlam / xlam_fc / apigen_mt: hand-made fixtures (tests/converters/fixtures) convert to the expected steps and tools."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _compare import FIXTURES, load, module
from converters.errors import ConversionError


def _records(name: str) -> list[dict]:
    return load(FIXTURES / f"{name}.json")["records"]


def _steps(t) -> list[dict]:
    return [s.model_dump(exclude_defaults=True) | {"kind": s.kind} for s in t.steps]


def test_xlam_tools_calls_and_links() -> None:
    conv = module("xlam").convert
    first, second = (conv(r) for r in _records("xlam"))
    assert first.id.startswith("xlam/xlam_weather_0001~") and first.provenance.source_id == "xlam_weather_0001"
    assert first.source == "xlam"
    steps = _steps(first)
    assert steps[0] == {"kind": "text", "content": "You are a helpful assistant with access to weather tools.",
                        "source": "environment", "name": "system"}
    assert steps[1] == {"kind": "text", "content": "What's the weather in Paris, in Fahrenheit?", "source": "user"}
    assert steps[2] == {"kind": "api", "function": "get_weather", "arguments": {"city": "Paris", "unit": "c"},
                        "thought": "Let me look that up.", "reasoning": "Need the weather first, then convert.",
                        "tool_call_id": "tc_1"}
    assert steps[3] == {"kind": "text", "content": '{"temp": 20, "sky": "clear"}', "source": "environment",
                        "name": "get_weather", "tool_call_id": "tc_1"}
    assert steps[4] == {"kind": "api", "function": "convert_temp", "arguments": {"value": 20, "to": "f"},
                        "tool_call_id": "call_2"}
    assert steps[5]["tool_call_id"] == "call_2" and steps[5]["name"] == "convert_temp"
    assert steps[6] == {"kind": "message", "content": "It is 68°F and clear in Paris."}
    tools = {t.name: t for t in first.tools}
    assert tools["get_weather"].parameters["required"] == ["city"]
    assert tools["convert_temp"].parameters == {
        "type": "object",
        "properties": {"value": {"type": "number", "description": "Temperature"},
                       "to": {"type": "string", "default": "f", "x-type": "str, optional"}},
        "required": ["value"],
    }
    # parallel calls: results pair first-in first-out
    assert [(s["kind"], s.get("tool_call_id"), s.get("content")) for s in _steps(second)[2:6]] == [
        ("api", "call_1", None), ("api", "call_2", None), ("text", "call_1", "3"), ("text", "call_2", "7")]
    assert second.tools[0].parameters["properties"]["a"] == {"type": "integer"}


def test_xlam_fc() -> None:
    conv = module("xlam_fc").convert
    t, u = (conv(r) for r in _records("xlam_fc"))
    assert t.provenance.source_id == "7" and t.provenance.source_dataset == "Salesforce/xlam-function-calling-60k"
    assert _steps(t) == [
        {"kind": "text", "content": "Find the 5th Fibonacci number and reverse the word 'hello'.", "source": "user"},
        {"kind": "api", "function": "fibonacci", "arguments": {"n": 5}, "tool_call_id": "call_1"},
        {"kind": "api", "function": "reverse_string", "arguments": {"text": "hello"}, "tool_call_id": "call_2"},
    ]
    assert [x.name for x in t.tools] == ["fibonacci", "reverse_string"]
    assert t.tools[1].parameters["required"] == ["text"]
    assert t.tools[1].parameters["properties"]["keep_case"]["type"] == "boolean"
    assert u.tools[0].parameters["properties"]["limit"]["type"] == "array"


def test_apigen_mt() -> None:
    conv = module("apigen_mt").convert
    t, u = (conv(r) for r in _records("apigen_mt"))
    assert t.id.startswith("apigen_mt/xxh3:") and t.provenance.source_id is None
    kinds = [(s.kind, getattr(s, "source", None)) for s in t.steps]
    assert kinds == [("text", "environment"), ("text", "user"), ("message", None), ("text", "user"),
                     ("api", None), ("text", "environment"), ("api", None), ("text", "environment"), ("message", None)]
    assert t.steps[0].name == "system" and t.steps[0].content.startswith("# Retail agent policy")
    assert t.steps[4].function == "get_order_details" and t.steps[4].arguments == {"order_id": "#W123"}
    assert t.steps[6].arguments == {"order_id": "#W123", "reason": "no longer needed"}  # arguments given as a JSON string
    assert [s.tool_call_id for s in t.steps[4:8]] == ["call_1", "call_1", "call_2", "call_2"]
    assert t.steps[7].name == "cancel_pending_order"
    assert t.steps[8].reasoning == "Cancellation succeeded." and t.steps[8].content == "Your order #W123 is cancelled."
    assert t.tools[1].parameters["properties"]["reason"]["enum"] == ["no longer needed", "ordered by mistake"]
    assert u.steps[2].function == "get_flight" and u.id != t.id


@pytest.mark.parametrize("name,field,bad", [
    ("xlam_fc", "answers", '[{"name": "fibonacci", "arguments": {"n": 5'),
    ("xlam_fc", "tools", '[{"name": "fib'),
    ("apigen_mt", "tools", "[{"),
])
def test_truncated_json_is_a_conversion_error(name: str, field: str, bad: str) -> None:
    record = dict(_records(name)[0], **{field: bad})
    with pytest.raises(ConversionError) as err:
        module(name).convert(record)
    assert field in str(err.value)
    if name == "xlam_fc":
        assert "'7'" in str(err.value)


def test_truncated_call_arguments() -> None:
    rec = json.loads(json.dumps(_records("xlam")[0]))
    rec["conversation"][1]["tool_calls"][0]["function"]["arguments"] = '{"city": "Par'
    with pytest.raises(ConversionError, match="xlam_weather_0001"):
        module("xlam").convert(rec)
