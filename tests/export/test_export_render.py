"""The shared rendering rules: roles and order, tool calls and their ids, observations, reasoning."""

from __future__ import annotations

import json

import pytest

import random

import pyarrow as pa

from converters.export.records import Record
from converters.export.render import RenderOptions, Unrenderable, render, render_batch
from schemas.arrow import STEP_TYPE, step_to_row
from schemas.models import (ApiAction, CodeAction, ImageObservation, ImageRef, JsonObservation, MessageAction,
                            TextObservation, Trajectory, WebObservation)
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


def test_an_api_action_after_a_message_joins_it_and_unanswered_calls_are_answered_in_order():
    traj = Trajectory(id="x", source="s", steps=[
        TextObservation(content="go", source="user"),
        MessageAction(content="Let me check.", thought="plan"),
        ApiAction(function="a", arguments={}, thought="first", reasoning="r1"),
        ApiAction(function="b", arguments={}, reasoning="r2"),
        ApiAction(function="c", arguments={}, train=False),  # another mask: a message of its own
        TextObservation(content="from a", source="environment"),
        MessageAction(content="done"),
    ])
    msgs = _msgs(traj)
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant", "tool", "assistant"]
    assert msgs[1]["content"] == "plan\n\nLet me check.\n\nfirst" and msgs[1]["reasoning_content"] == "r1\n\nr2"
    assert [c["function"]["name"] for c in msgs[1]["tool_calls"]] == ["a", "b"]
    # The calls still pending when the next assistant message starts get empty answers, in call order;
    # the observation then answers the call that is pending.
    assert [(m["tool_call_id"], m["content"]) for m in msgs if m["role"] == "tool"] == [
        ("call_2", ""), ("call_3", ""), ("call_4", "from a")]
    turns = render(traj)
    assert (turns[1].first_step, turns[1].last_step, turns[4].train) == (1, 3, False)


def test_tools_declared_then_called_but_undeclared():
    tools = Record.of(_data.tool_traj()).openai_tools()
    assert tools[0] == {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city", "parameters": _data.WEATHER.parameters}}
    assert tools[1] == {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object",
                                                                                          "properties": {}}}}


def _random_trajectory(rng: random.Random, i: int) -> Trajectory:
    steps = []
    for k in range(rng.randint(0, 10)):
        c, train = rng.random(), rng.random() > 0.15
        if c < 0.3:
            steps.append(ApiAction(function=rng.choice("fg"), arguments={"a": k}, thought=rng.choice([None, "", "t"]),
                                   reasoning=rng.choice([None, "r"]), tool_call_id=rng.choice([None, "", "x", "y"]),
                                   train=train))
        elif c < 0.45:
            steps.append(rng.choice([CodeAction(language="py", content="x", thought=rng.choice([None, "t"]), train=train),
                                     MessageAction(content="m", thought=rng.choice([None, "", "t"]), train=train)]))
        elif c < 0.85:
            steps.append(TextObservation(content=f"o{k}", source=rng.choice(["user", "agent", "environment"]),
                                         name=rng.choice([None, "system"]), tool_call_id=rng.choice([None, "x", "y"]),
                                         train=train))
        else:
            steps.append(rng.choice([JsonObservation(content={"k": k}), ImageObservation(image=ImageRef(path="p.png")),
                                     WebObservation(url="http://u", axtree="tree", screenshot=ImageRef(path="s.png"))]))
    return Trajectory(id=f"r{i}", source="s", steps=steps)


def _steps(trajectories: list[Trajectory], compact: bool = False) -> pa.ListArray:
    """Model steps as a `list<step>` column, free-form values as `json.dumps` text (as `render` writes them;
    `compact`: arguments as the store writes them)."""
    rows = []
    for traj in trajectories:
        steps = []
        for step in traj.steps:
            row = step_to_row(step)
            if step.kind == "api" and not compact:
                row["arguments"] = json.dumps(step.arguments, ensure_ascii=False)
            elif step.kind == "json":
                row["content"] = json.dumps(step.content, ensure_ascii=False)
            steps.append(row)
        rows.append(steps)
    return pa.array(rows, pa.list_(STEP_TYPE))


def test_render_and_render_batch_are_one_set_of_rules(adp_dir):
    """`render` (one trajectory, step by step) and `render_batch` (column-wise, many at once) must
    give the same messages, masks and step ranges; a trajectory must also come out the same
    whatever its neighbours in the batch are."""
    rng = random.Random(7)
    trajectories = [_random_trajectory(rng, i) for i in range(1500)]
    trajectories += [_data.tool_traj(), _data.masked_traj(), _data.interleaved_traj(), _data.labeled_traj(),
                     _data.masked_observation_traj(), *_data.adp_trajectories(adp_dir)]
    for opts in (RenderOptions(web_max_chars=3), RenderOptions(reasoning=False), RenderOptions(tool_format="text")):
        # The text tool format must not depend on how arguments are spelt in storage (the store writes compact JSON).
        batch = render_batch(_steps(trajectories, compact=opts.tool_format == "text"), opts)
        for r, traj in enumerate(trajectories):
            try:
                turns = render(traj, opts)
            except Unrenderable as exc:
                assert batch.errors[r] == str(exc), traj.id
                continue
            conv = batch.conversation(r)
            assert conv.messages() == [t.message for t in turns], traj.id
            assert [conv.steps(k) for k in range(len(conv))] == [
                range(t.first_step, t.last_step + 1) if t.first_step >= 0 else range(0) for t in turns]
            assert [conv.train(k) for k in range(len(conv))] == [t.is_assistant and t.train for t in turns]
    alone = render_batch(_steps(trajectories[:50]), RenderOptions())
    for r in range(50):
        one = render_batch(_steps(trajectories[r:r + 1]), RenderOptions())
        assert (one.errors[0] or one.conversation(0).messages()) == (alone.errors[r] or alone.conversation(r).messages())
