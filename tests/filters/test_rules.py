"""Rule filters on hand-made good and bad records: exact reason strings."""

from __future__ import annotations

import pytest

from tests.factories import tool_trajectory
from filters.base import FilterConfigError, build_filter
from filters.chain import Chain, load_config
from schemas.models import ApiAction, CodeAction, MessageAction, TextObservation, Tool

TOOLS = [
    Tool(name="search", parameters={"type": "object", "properties": {"query": {"type": "string"},
                                                                       "limit": {"type": "integer"}},
                                    "required": ["query"]}),
    Tool(name="finish", parameters={"type": "object", "properties": {"answer": {"type": "string"}}}),
]


def decide(spec: dict, record):
    return build_filter(spec).decide(record)


def with_call(function: str, arguments: dict):
    t = tool_trajectory(1)
    t.tools = TOOLS
    t.steps[1] = ApiAction(function=function, arguments=arguments, tool_call_id="call_1")
    return t


def test_good_record_passes_every_rule_filter():
    t = tool_trajectory(1)
    for name in ("well_formed", "tool_calls_valid", "max_step_tokens", "no_loops", "final_answer", "pii"):
        d = decide({"name": name}, t)
        assert d.keep, (name, d.reason)


@pytest.mark.parametrize("arguments, function, reason", [
    ({"query": "x"}, "lookup", "unknown tool 'lookup'"),
    ({}, "search", "missing argument 'query' for 'search'"),
    ({"query": "x", "page": 2}, "search", "unexpected argument 'page' for 'search'"),
    ({"query": 3}, "search", "wrong type for 'query' in 'search' (expected string)"),
    ({"query": "x", "limit": "ten"}, "search", "wrong type for 'limit' in 'search' (expected integer)"),
])
def test_tool_call_reasons(arguments, function, reason):
    d = decide({"name": "tool_calls_valid"}, with_call(function, arguments))
    assert not d.keep and d.reason == reason


def test_tool_calls_valid_options():
    assert decide({"name": "tool_calls_valid", "allow": ["lookup"]}, with_call("lookup", {})).keep
    assert decide({"name": "tool_calls_valid", "strict": False}, with_call("search", {"query": "x", "p": 1})).keep
    closed = with_call("search", {"query": "x", "p": 1})
    closed.tools[0].parameters["additionalProperties"] = False
    assert decide({"name": "tool_calls_valid", "strict": False}, closed).reason == "unexpected argument 'p' for 'search'"
    bare = tool_trajectory(1)
    bare.tools = []
    assert decide({"name": "tool_calls_valid"}, bare).keep
    assert decide({"name": "tool_calls_valid", "require_tools": True}, bare).reason == "no tools declared"


def test_well_formed_reasons():
    t = tool_trajectory(1)
    t.steps = []
    assert decide({"name": "well_formed"}, t).reason == "no steps"
    t = tool_trajectory(1)
    t.steps = [TextObservation(content="hi", source="user")]
    assert decide({"name": "well_formed"}, t).reason == "no action"
    t = tool_trajectory(1)
    t.steps[3] = MessageAction(content="   ")
    assert decide({"name": "well_formed"}, t).reason == "empty message step 3"
    t = tool_trajectory(1)
    t.steps[2].tool_call_id = "call_zzz"
    assert decide({"name": "well_formed"}, t).reason == "observation 2 answers unknown tool_call_id 'call_zzz'"


def test_max_step_tokens():
    t = tool_trajectory(1)
    t.steps[3] = MessageAction(content="word " * 50)
    d = decide({"name": "max_step_tokens", "max_tokens": 20}, t)
    assert not d.keep and d.reason == "step 3 has 50 tokens (max 20)" and d.score == 50
    d = decide({"name": "max_step_tokens", "max_tokens": 100, "max_total_tokens": 40}, t)
    assert d.reason is not None and d.reason.startswith("trajectory has ") and d.reason.endswith("tokens (max 40)")


def test_no_loops():
    t = tool_trajectory(1)
    call = dict(function="search", arguments={"query": "a"})
    obs = TextObservation(content="none", source="environment")
    t.steps = [t.steps[0], ApiAction(**call), obs, ApiAction(**call), obs, ApiAction(**call), MessageAction(content="x")]
    d = decide({"name": "no_loops"}, t)
    assert d.reason == 'action repeated 3 times in a row at step 5: search({"query": "a"})'
    assert decide({"name": "no_loops", "k": 4}, t).keep
    code = [CodeAction(language="python", content="print(1)")] * 3
    t.steps = [t.steps[0], *code]
    assert decide({"name": "no_loops"}, t).reason == "action repeated 3 times in a row at step 3: python:print(1)"


def test_final_answer():
    t = tool_trajectory(1)
    t.steps = t.steps[:3]
    assert decide({"name": "final_answer"}, t).reason == "no final answer: last action is api call 'search'"
    t.steps.append(ApiAction(function="finish", arguments={"answer": "x"}))
    assert decide({"name": "final_answer"}, t).keep
    t.steps.append(CodeAction(language="bash", content="ls"))
    assert decide({"name": "final_answer"}, t).reason == "no final answer: last action is code action"
    assert decide({"name": "final_answer", "allow_code": True}, t).keep


SECRETS = ("key sk-proj-abcdefghijklmnopqrstuvwx0123, aws AKIAABCDEFGHIJKLMNOP, gh ghp_" + "a" * 36
           + ", auth: Bearer abcdefghijklmnop1234, mail jane.doe@example.org, call +1 415-555-0132")


def test_pii_scrub_replaces_and_counts():
    t = tool_trajectory(1)
    t.steps[3] = MessageAction(content=SECRETS)
    t.steps[1] = ApiAction(function="search", arguments={"query": "bob@corp.io"}, tool_call_id="call_1")
    d = decide({"name": "pii", "mode": "scrub"}, t)
    assert d.keep
    text = d.record.steps[3].content
    for placeholder in ("<API_KEY>", "<AWS_KEY>", "<GITHUB_TOKEN>", "Bearer <TOKEN>", "<EMAIL>", "<PHONE>"):
        assert placeholder in text, placeholder
    assert "sk-proj" not in text and "AKIA" not in text and "example.org" not in text
    assert d.record.steps[1].arguments == {"query": "<EMAIL>"}
    assert d.record.details["pii"]["scrubbed"] == 7
    assert d.record.details["pii"]["by_kind"]["email"] == 2
    assert t.steps[3].content == SECRETS  # the input record is not modified


def test_pii_drop_and_no_false_positives():
    t = tool_trajectory(1)
    t.steps[3] = MessageAction(content="mail jane@example.org")
    d = decide({"name": "pii", "mode": "drop"}, t)
    assert not d.keep and d.reason == "contains email (1)"
    clean = tool_trajectory(1)
    clean.steps[3] = MessageAction(content="Version 2024-01-15, build 3.11.7, order 12345678, skip-this")
    d = decide({"name": "pii"}, clean)
    assert d.keep and "pii" not in d.record.details


def test_config_errors():
    with pytest.raises(FilterConfigError, match="unknown filter 'nope'"):
        build_filter({"name": "nope"})
    with pytest.raises(FilterConfigError, match="bad options for filter 'no_loops'"):
        build_filter({"name": "no_loops", "kk": 3})
    with pytest.raises(FilterConfigError, match="names repeat"):
        Chain([{"name": "pii"}, {"name": "pii"}])
    assert len(Chain([{"name": "pii"}, {"name": "pii", "as": "pii_drop", "mode": "drop"}]).filters) == 2
    with pytest.raises(FilterConfigError):
        load_config("just a string")
    assert load_config("filters:\n  - {name: pii}\n") == [{"name": "pii"}]


def test_chain_stops_at_first_drop_and_passes_modified_record():
    chain = Chain(load_config("- {name: pii}\n- {name: final_answer}\n"))
    t = tool_trajectory(1)
    t.steps[3] = MessageAction(content="write to a@b.co")
    out = chain.run_sync(t)
    assert out.status == "kept" and out.record.steps[3].content == "write to <EMAIL>"
    t.steps = t.steps[:3]
    out = chain.run_sync(t)
    assert out.status == "filtered" and out.filter == "final_answer"


@pytest.mark.parametrize("success, reason", [(True, None), (False, "not verified: success is false"),
                                             (None, "not verified: success is unknown")])
def test_verified_keeps_only_what_the_world_verified(success, reason):
    t = tool_trajectory(1)
    t.success = success
    d = decide({"name": "verified"}, t)
    assert d.keep is (success is True) and d.reason == reason
