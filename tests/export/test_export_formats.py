"""The rows of every format for hand-made trajectories, as the trainer loads them (`preview`)."""

from __future__ import annotations

import json

from converters.export import preview
from schemas.models import ApiAction, MessageAction, Pair, TextObservation, Trajectory
from tests.export import _data


def _text(messages):
    return " ".join(m.get("content") or "" for m in messages)


def _rows(traj, fmt, **kw):
    p = preview(traj, fmt, **kw)
    assert p.skipped is None, p.skipped
    return p.rows


def test_sft_prompt_completion_is_the_default_and_arguments_are_mappings():
    (row,) = _rows(_data.tool_traj(), "trl-sft")
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    first = row["completion"][0]
    assert first["tool_calls"][0] == {"id": "c1", "type": "function",
                                      "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    assert first["reasoning_content"] == "The user wants two cities."
    assert row["completion"][-1]["content"] == "Paris 21C clear, Rome 25C."
    assert [t["function"]["name"] for t in json.loads(row["tools"])] == ["get_weather", "lookup"]


def test_sft_masked_prefix_stays_in_the_prompt():
    (row,) = _rows(_data.masked_traj(), "trl-sft")
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "user"]
    assert "MASKEDALPHA" in _text(row["prompt"])
    assert row["completion"][0]["content"].startswith("TRAINEDBETA") and "MASKED" not in _text(row["completion"])
    assert row["tools"] is None


def test_sft_interleaved_masks_split_into_segments_that_never_train_a_masked_step():
    rows = _rows(_data.interleaved_traj(), "trl-sft")
    assert [r["segment"] for r in rows] == [0, 1]
    first, second = rows
    assert [m["content"] for m in first["completion"]] == ["```bash\nwc -l TRAINEDONE.txt\n```"]
    assert "MASKEDTWO" in _text(second["prompt"]) and "TRAINEDONE" in _text(second["prompt"])
    assert second["completion"][-1]["content"] == "TRAINEDFOUR twelve lines"
    assert all("MASKED" not in _text(r["completion"]) for r in rows)


def test_sft_messages_layout_carries_train_flags_and_drops_trailing_observations():
    (row,) = _rows(_data.masked_observation_traj(), "trl-sft", sft_layout="messages")
    assert [m.get("train") for m in row["messages"] if m["role"] == "assistant"] == [True, True, True]
    assert row["messages"][-1]["content"] == "TRAINEDANSWER Lima is warmer."  # "###STOP###" left out
    (row,) = _rows(_data.masked_traj(), "trl-sft", sft_layout="messages")
    assert [m["train"] for m in row["messages"] if m["role"] == "assistant"] == [False, True, True]
    assert all("train" not in m for m in row["messages"] if m["role"] != "assistant")


def test_failed_trajectories_are_left_out_of_supervised_formats_unless_asked():
    for fmt in ("trl-sft", "openai", "sharegpt"):
        assert preview(_data.failed_traj(), fmt).skipped == "success = false (--include-failed keeps it)"
        assert preview(_data.failed_traj(), fmt, include_failed=True).rows


def test_dpo_step_level_compares_the_next_assistant_message():
    pair, chosen, rejected = _data.branch_pair()
    (row,) = _rows(chosen, "trl-dpo", pair=pair, rejected=rejected)
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "tool"]
    assert row["prompt"][1]["tool_calls"][0]["function"]["arguments"] == {"expr": "2+2"}
    assert row["chosen"] == [{"role": "assistant", "content": "The answer is 4."}]
    assert [m["role"] for m in row["rejected"]] == ["assistant"]  # no tool result, no trailing turns
    assert (row["id"], row["chosen_id"], row["rejected_id"], row["level"]) == ("p1", "p1-good", "p1-bad", "trajectory")
    (row,) = _rows(chosen, "trl-dpo", pair=pair, rejected=rejected, dpo_level="trajectory")
    assert [m["role"] for m in row["rejected"]] == ["assistant", "tool", "assistant"]


def test_dpo_forks_inside_parallel_calls_invent_no_tool_reply():
    shared = [TextObservation(content="Weather in Paris and Rome?", source="user"),
              ApiAction(function="get_weather", arguments={"city": "Paris"}, tool_call_id="a")]
    chosen = Trajectory(id="c", source="s", steps=[*shared, ApiAction(function="get_weather", arguments={"city": "Rome"}),
                                                   TextObservation(content="21", source="environment")])
    rejected = Trajectory(id="r", source="s", steps=[*shared, ApiAction(function="lookup", arguments={"q": "Rome"}),
                                                     TextObservation(content="?", source="environment")])
    pair = Pair(id="p", chosen_id="c", rejected_id="r", prefix_len=2, source="s")
    (row,) = _rows(chosen, "trl-dpo", pair=pair, rejected=rejected)
    assert [m["role"] for m in row["prompt"]] == ["user"]  # the fork is inside the parallel-call message
    assert [c["function"]["name"] for c in row["chosen"][0]["tool_calls"]] == ["get_weather", "get_weather"]
    assert all(m["role"] != "tool" for m in row["prompt"] + row["chosen"] + row["rejected"])


def test_dpo_skip_reasons():
    pair, chosen, rejected = _data.branch_pair()
    assert preview(chosen, "trl-dpo", pair=pair, rejected=_data.tool_traj()).skipped == "prefix mismatch"
    long = Pair(id="p", chosen_id=chosen.id, rejected_id=rejected.id, prefix_len=4, source="s")
    assert preview(chosen, "trl-dpo", pair=long, rejected=rejected).skipped == "prefix mismatch"  # step 3 differs
    whole = Pair(id="p", chosen_id=chosen.id, rejected_id=chosen.id, prefix_len=4, source="s")
    assert preview(chosen, "trl-dpo", pair=whole, rejected=chosen).skipped == "continuation has no assistant turn"
    same = Pair(id="p", chosen_id=chosen.id, rejected_id=chosen.id, prefix_len=3, source="s")
    assert preview(chosen, "trl-dpo", pair=same, rejected=chosen).skipped == "chosen and rejected turns are identical"


def test_kto_step_labels_give_one_row_per_labelled_assistant_message():
    rows = _rows(_data.labeled_traj(), "trl-kto")
    assert [(r["step"], r["label"]) for r in rows] == [(2, True), (4, False)]
    good, bad = rows
    assert [m["role"] for m in good["prompt"]] == ["user", "user"]
    assert good["completion"] == [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "click", "arguments": {"bid": "1"}}}]}]
    assert [m["role"] for m in bad["prompt"]] == ["user", "user", "assistant", "tool"]


def test_kto_parallel_calls_are_one_completion_with_their_answers_untouched():
    traj = Trajectory(id="x", source="s", steps=[
        TextObservation(content="go", source="user"),
        ApiAction(function="a", arguments={}, label="good"),
        ApiAction(function="b", arguments={}, label="good"),
        TextObservation(content="A", source="environment"),
        TextObservation(content="B", source="environment"),
        ApiAction(function="c", arguments={}, label="good"),
        ApiAction(function="d", arguments={}, label="bad"),  # disagreeing labels: no row
        MessageAction(content="done", label="bad"),
    ])
    rows = _rows(traj, "trl-kto")
    assert [(r["step"], r["label"]) for r in rows] == [(1, True), (7, False)]
    assert [c["function"]["name"] for c in rows[0]["completion"][0]["tool_calls"]] == ["a", "b"]
    assert [m["content"] for m in rows[1]["prompt"] if m["role"] == "tool"] == ["A", "B", "", ""]


def test_kto_outcome_labels_every_trainable_assistant_message_or_one_trajectory_row():
    rows = _rows(_data.masked_observation_traj(), "trl-kto")  # no step labels: the trajectory's success
    assert [(r["step"], r["label"]) for r in rows] == [(1, True), (3, True), (5, True)]
    rows = _rows(_data.masked_traj(), "trl-kto", kto_mode="turns")
    assert [(r["step"], r["label"]) for r in rows] == [(3, True), (5, True)]  # the masked step gives none
    (row,) = _rows(_data.masked_traj(), "trl-kto", kto_mode="trajectory")
    assert row["step"] == -1 and "MASKEDALPHA" in _text(row["prompt"]) and "MASKED" not in _text(row["completion"])
    assert preview(_data.interleaved_traj(), "trl-kto").skipped == "no success label"


def test_openai_weights_string_arguments_and_no_nulls():
    (row,) = _rows(_data.masked_traj(), "openai")
    assistants = [m for m in row["messages"] if m["role"] == "assistant"]
    assert [m["weight"] for m in assistants] == [0, 1, 1] and "tools" not in row
    (row,) = _rows(_data.tool_traj(), "openai")
    parallel = row["messages"][4]
    assert "content" not in parallel and [c["function"]["arguments"] for c in parallel["tool_calls"]] == [
        '{"city":"Rome"}', '{"q":"Rome"}']
    assert all(v is not None for m in row["messages"] for v in m.values())
    assert not any("reasoning_content" in m for m in row["messages"])  # openai's default


def test_sharegpt_layout_thoughts_and_object_arguments():
    (row,) = _rows(_data.tool_traj(), "sharegpt")
    assert row["system"] == "You are a weather bot."
    tags = [c["from"] for c in row["conversations"]]
    assert tags == ["human", "function_call", "observation", "function_call", "observation", "gpt"]
    call = row["conversations"][1]["value"]
    assert call.startswith("<think>\nThe user wants two cities.\n\nCheck Paris first.\n</think>\n\n")
    assert json.loads(call.split("</think>\n\n")[1]) == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert json.loads(row["conversations"][3]["value"]) == [
        {"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "lookup", "arguments": {"q": "Rome"}}]
    assert row["conversations"][4]["value"] == "lookup: Rome is in Italy\n\nRome: 25C"
    assert json.loads(row["tools"])[1] == {"name": "lookup", "parameters": {"type": "object", "properties": {}}}
    assert preview(_data.masked_traj(), "sharegpt").skipped == "masked steps need the prompt-completion layout"
