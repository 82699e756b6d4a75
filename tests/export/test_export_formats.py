"""Row functions of every format, on hand-made trajectories: concrete structure."""

from __future__ import annotations

import json

import pytest

from converters.export.dpo import dpo_rows
from converters.export.kto import kto_rows
from converters.export.openai_chat import openai_rows
from converters.export.options import FormatOptions
from converters.export.render import RenderOptions, Unrenderable
from converters.export.sft import sft_rows
from converters.export.sharegpt import sharegpt_rows
from schemas.models import Pair
from tests.export import _data

PC = FormatOptions(sft_layout="prompt-completion")


def _text(messages):
    return " ".join(m.get("content") or "" for m in messages)


def test_sft_messages_row():
    (row,) = sft_rows(_data.tool_traj(), FormatOptions())
    assert row["id"] == "t-tool" and row["source"] == "hand"
    assert [m["role"] for m in row["messages"]][:3] == ["system", "user", "assistant"]
    tools = json.loads(row["tools"])
    assert [t["function"]["name"] for t in tools] == ["get_weather", "lookup"]


def test_sft_messages_layout_refuses_masked_steps():
    with pytest.raises(Unrenderable, match="prompt-completion"):
        sft_rows(_data.masked_traj(), FormatOptions())


def test_sft_prompt_completion_splits_at_first_trainable_assistant_turn():
    (row,) = sft_rows(_data.masked_traj(), PC)
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "user"]
    assert "MASKEDALPHA" in _text(row["prompt"])
    assert [m["role"] for m in row["completion"]] == ["assistant", "user", "assistant"]
    assert row["completion"][0]["content"].startswith("TRAINEDBETA")
    assert "MASKED" not in _text(row["completion"])
    assert row["tools"] is None


def test_sft_interleaved_masks_split_into_segments_that_never_train_a_masked_step():
    rows = sft_rows(_data.interleaved_traj(), PC)
    assert [r["segment"] for r in rows] == [0, 1]
    first, second = rows
    assert [m["role"] for m in first["prompt"]] == ["user"]
    assert [m["content"] for m in first["completion"]] == ["```bash\nwc -l TRAINEDONE.txt\n```"]
    assert "MASKEDTWO" in _text(second["prompt"]) and "TRAINEDONE" in _text(second["prompt"])
    assert second["completion"][0]["content"].endswith("TRAINEDTHREE\n```")
    assert second["completion"][-1]["content"] == "TRAINEDFOUR twelve lines"
    for row in rows:
        assert "MASKED" not in _text(row["completion"])


def test_sft_fully_trainable_in_prompt_completion_layout():
    (row,) = sft_rows(_data.tool_traj(), PC)
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["completion"][0]["tool_calls"][0]["id"] == "c1"
    assert row["completion"][-1]["content"] == "Paris 21C clear, Rome 25C."


def test_dpo_prompt_is_the_shared_prefix():
    pair, chosen, rejected = _data.branch_pair()
    (row,) = dpo_rows(pair, chosen, rejected, FormatOptions())
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "tool"]
    assert row["prompt"][1]["tool_calls"][0]["id"] == "k1" == row["prompt"][2]["tool_call_id"]
    assert row["chosen"] == [{"role": "assistant", "content": "The answer is 4."}]
    assert [m["role"] for m in row["rejected"]] == ["assistant", "tool", "assistant"]
    assert row["rejected"][1]["tool_call_id"] == row["rejected"][0]["tool_calls"][0]["id"]
    assert (row["id"], row["chosen_id"], row["rejected_id"], row["level"]) == ("p1", "p1-good", "p1-bad", "trajectory")


def test_dpo_skips_pairs_whose_prefixes_differ_or_leave_nothing():
    pair, chosen, rejected = _data.branch_pair()
    with pytest.raises(Unrenderable, match="prefix mismatch"):
        dpo_rows(pair, chosen, _data.tool_traj(), FormatOptions())
    long = Pair(id="p", chosen_id=chosen.id, rejected_id=rejected.id, prefix_len=4, source="s")
    with pytest.raises(Unrenderable):
        dpo_rows(long, chosen, rejected, FormatOptions())


def test_kto_step_labels_give_one_example_per_labeled_step():
    rows = kto_rows(_data.labeled_traj(), FormatOptions())
    assert [(r["step"], r["label"]) for r in rows] == [(2, True), (4, False)]
    good, bad = rows
    assert [m["role"] for m in good["prompt"]] == ["user", "user"]
    assert good["completion"] == [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "click", "arguments": '{"bid": "1"}'}}]}]
    assert [m["role"] for m in bad["prompt"]] == ["user", "user", "assistant", "tool"]
    assert bad["completion"][0]["tool_calls"][0]["function"]["arguments"] == '{"bid": "9"}'


def test_kto_trajectory_mode_uses_success_and_keeps_masked_steps_in_the_prompt():
    (row,) = kto_rows(_data.masked_traj(), FormatOptions(kto_mode="trajectory"))
    assert row["label"] is True and row["step"] == -1
    assert "MASKEDALPHA" in _text(row["prompt"])
    assert "MASKED" not in _text(row["completion"])
    (row,) = kto_rows(_data.labeled_traj(), FormatOptions(kto_mode="trajectory"))
    assert row["label"] is False and [m["role"] for m in row["prompt"]] == ["user", "user"]
    with pytest.raises(Unrenderable, match="no success label"):
        kto_rows(_data.interleaved_traj(), FormatOptions())


def test_openai_weights_and_no_nulls():
    (row,) = openai_rows(_data.masked_traj(), FormatOptions())
    assistants = [m for m in row["messages"] if m["role"] == "assistant"]
    assert [m["weight"] for m in assistants] == [0, 1, 1]
    assert "MASKEDALPHA" in assistants[0]["content"]
    assert all("weight" not in m for m in row["messages"] if m["role"] != "assistant")
    assert "tools" not in row
    (row,) = openai_rows(_data.tool_traj(), FormatOptions(render=RenderOptions(reasoning=False)))
    parallel = row["messages"][4]
    assert "content" not in parallel and len(parallel["tool_calls"]) == 2
    assert all(v is not None for m in row["messages"] for v in m.values())
    assert row["tools"][0]["function"]["name"] == "get_weather"


def test_sharegpt_alternates_and_maps_roles():
    (row,) = sharegpt_rows(_data.tool_traj(), FormatOptions())
    assert row["system"] == "You are a weather bot."
    tags = [c["from"] for c in row["conversations"]]
    assert tags == ["human", "function_call", "observation", "function_call", "observation", "gpt"]
    call = row["conversations"][1]["value"]
    assert call.startswith("<think>The user wants two cities.\n\nCheck Paris first.</think>")
    assert json.loads(call.split("</think>")[1]) == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert json.loads(row["conversations"][3]["value"]) == [
        {"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "lookup", "arguments": {"q": "Rome"}}]
    assert row["conversations"][4]["value"] == "lookup: Rome is in Italy\n\nRome: 25C"
    assert [t["name"] for t in json.loads(row["tools"])] == ["get_weather", "lookup"]
    with pytest.raises(Unrenderable):
        sharegpt_rows(_data.masked_traj(), FormatOptions())
