"""The shared rendering rules: roles and order, tool calls and their ids, observations, reasoning."""

from __future__ import annotations

import json

import pytest

from converters.export.render import RenderOptions, Unrenderable, render, split_at
from converters.export.tools import openai_tools
from schemas.models import ApiAction, MessageAction, TextObservation, Trajectory
from tests.export import _data


def _msgs(traj, **kw):
    return [t.message for t in render(traj, **kw)]


def test_roles_order_and_tool_call_links():
    msgs = _msgs(_data.tool_traj())
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "tool", "tool", "assistant"]
    first = msgs[2]
    assert first["content"] == "Check Paris first."
    assert first["reasoning_content"] == "The user wants two cities."
    assert first["tool_calls"] == [{"id": "c1", "type": "function",
                                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    assert msgs[3] == {"role": "tool", "content": '{"temp": 21, "sky": "clear"}', "tool_call_id": "c1"}
    # Two consecutive api actions: one assistant message with two calls, answered in order.
    parallel = msgs[4]["tool_calls"]
    assert [c["function"]["name"] for c in parallel] == ["get_weather", "lookup"]
    assert [json.loads(c["function"]["arguments"]) for c in parallel] == [{"city": "Rome"}, {"q": "Rome"}]
    assert [m["tool_call_id"] for m in msgs[5:7]] == [c["id"] for c in parallel] == ["call_4", "call_5"]
    assert msgs[-1] == {"role": "assistant", "content": "Paris 21C clear, Rome 25C."}


def test_every_tool_call_is_answered_before_the_next_assistant_message():
    traj = Trajectory(id="x", source="s", steps=[
        TextObservation(content="go", source="user"),
        ApiAction(function="f", arguments={}),
        MessageAction(content="done"),
    ])
    msgs = _msgs(traj)
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[2] == {"role": "tool", "content": "", "tool_call_id": msgs[1]["tool_calls"][0]["id"]}


def test_observation_names_its_own_pending_call():
    traj = Trajectory(id="x", source="s", steps=[
        TextObservation(content="go", source="user"),
        ApiAction(function="a", arguments={}, tool_call_id="A"),
        ApiAction(function="b", arguments={}, tool_call_id="B"),
        TextObservation(content="from b", source="environment", tool_call_id="B"),
        TextObservation(content="from a", source="environment"),
        MessageAction(content="ok"),
    ])
    msgs = _msgs(traj)
    assert [(m["tool_call_id"], m["content"]) for m in msgs if m["role"] == "tool"] == [("B", "from b"), ("A", "from a")]


def test_code_actions_are_fenced_and_their_output_is_a_user_turn():
    msgs = _msgs(_data.masked_traj())
    assert msgs[1] == {"role": "assistant", "content": "```bash\ncat MASKEDALPHA.csv\n```"}
    assert msgs[3]["content"] == "TRAINEDBETA revise: list it\n\n```bash\nls -l data.csv\n```"
    assert msgs[2] == {"role": "user", "content": "No such file"}


def test_web_and_image_observations_are_text_with_paths_and_truncation():
    msgs = _msgs(_data.labeled_traj(), opts=RenderOptions(web_max_chars=30))
    web = msgs[1]["content"]
    assert web.startswith("URL: http://x/home\n\n[1] link 'Settings'")
    assert "...[truncated" in web and web.endswith("[screenshot: shots/0.png]")
    assert msgs[3]["content"] == "URL: http://x/settings\n\n<html>settings</html>"
    assert msgs[5]["content"] == "[image: shots/2.png]"


def test_reasoning_can_be_dropped():
    msgs = _msgs(_data.tool_traj(), opts=RenderOptions(reasoning=False))
    assert all("reasoning_content" not in m for m in msgs)


def test_system_text_is_hoisted_only_before_the_first_action():
    traj = Trajectory(id="x", source="s", steps=[
        TextObservation(content="task", source="user"),
        TextObservation(content="env intro", source="environment"),
        MessageAction(content="hi"),
        TextObservation(content="late system", source="environment", name="system"),
        MessageAction(content="bye"),
    ])
    assert [(m["role"], m["content"]) for m in _msgs(traj)] == [
        ("system", "env intro"), ("user", "task"), ("assistant", "hi"), ("user", "late system"), ("assistant", "bye")]


def test_unrenderable_reasons():
    with pytest.raises(Unrenderable, match="no assistant turn"):
        render(_data.no_assistant_traj())
    with pytest.raises(Unrenderable, match="empty trajectory"):
        render(Trajectory(id="e", source="s"))


def test_breaks_keep_a_split_point_on_a_message_boundary():
    traj = _data.tool_traj()
    before, after = split_at(render(traj, breaks=[5]), 5)
    assert [c["id"] for c in before[-2].message["tool_calls"]] == ["call_4"]
    assert before[-1].message == {"role": "tool", "content": "", "tool_call_id": "call_4"}
    assert after[0].message["tool_calls"][0]["id"] == "call_5"


def test_tools_declared_then_called_but_undeclared():
    tools = openai_tools(_data.tool_traj())
    assert tools[0] == {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city", "parameters": _data.WEATHER.parameters}}
    assert tools[1] == {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def test_every_adp_sample_renders_or_has_a_reason(adp_dir):
    for traj in _data.adp_trajectories(adp_dir):
        try:
            turns = render(traj)
        except Unrenderable:
            continue
        calls = {c["id"] for t in turns for c in t.message.get("tool_calls") or []}
        answered = [t.message["tool_call_id"] for t in turns if t.role == "tool"]
        assert set(answered) <= calls and len(answered) == len(set(answered))
