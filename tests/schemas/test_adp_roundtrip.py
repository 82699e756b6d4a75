"""Every shipped ADP-standardized sample loads into the interlingua and writes back unchanged."""

from __future__ import annotations

import copy

import pytest

from converters.adp import from_adp, to_adp
from converters.errors import ConversionError
from schemas.arrow import trajectory_from_row, trajectory_to_row
from tests.factories import adp_samples


def test_every_adp_sample_round_trips(adp_dir):
    count = 0
    for dataset, raw in adp_samples(adp_dir):
        trajectory = from_adp(raw, dataset)
        assert to_adp(trajectory) == raw, f"{dataset}/{raw['id']} changed in the round trip"
        # And through the Arrow row layout the shards use.
        assert to_adp(trajectory_from_row(trajectory_to_row(trajectory))) == raw
        count += 1
    assert count >= 80  # all 19 datasets' samples were read


def test_adp_kinds_map_to_interlingua_kinds(adp_dir):
    seen = set()
    for dataset, raw in adp_samples(adp_dir):
        trajectory = from_adp(raw, dataset)
        assert len(trajectory.steps) == len(raw["content"])
        for step, obj in zip(trajectory.steps, raw["content"]):
            seen.add((obj["class_"], step.kind))
            if step.kind == "api":
                assert step.function == obj["function"] and step.arguments == obj["kwargs"]
                assert step.thought == obj["description"]
    assert {k for _, k in seen} == {"api", "code", "message", "text", "image", "web"}


def test_newer_adp_schema_with_tool_call_ids_round_trips():
    raw = {
        "schema_version": "1.3.0",
        "id": "t-1",
        "content": [
            {"class_": "text_observation", "content": "Weather in Paris?", "source": "user", "name": None},
            {
                "class_": "api_action",
                "function": "get_weather",
                "kwargs": {"city": "Paris"},
                "description": "Look it up.",
                "tool_call_id": "call_000001",
                "reasoning_content": "<think>the user wants weather</think>",
            },
            {
                "class_": "json_observation",
                "content": {"temp_c": 21, "sky": "clear"},
                "source": "environment",
                "name": "get_weather",
                "tool_call_id": "call_000001",
                "reward": 0.5,
            },
            {"class_": "message_action", "content": "<finish> 21C and clear </finish>", "description": None},
        ],
        "details": {"split": "train", "attempts": 2},
        "available_custom_tools": ["get_weather"],
        "available_code_languages": [],
    }
    trajectory = from_adp(raw, "weather")
    assert trajectory.provenance.source_format == "adp-1.3.0"
    assert [t.name for t in trajectory.tools] == ["get_weather"]
    assert trajectory.steps[1].reasoning.startswith("<think>")
    assert trajectory.steps[2].kind == "json" and trajectory.steps[2].content["temp_c"] == 21
    assert to_adp(trajectory) == raw
    assert to_adp(trajectory_from_row(trajectory_to_row(trajectory))) == raw


def test_ids_are_unique_and_stable_even_when_upstream_ids_repeat(adp_dir):
    by_dataset = {}
    for dataset, raw in adp_samples(adp_dir):
        by_dataset.setdefault(dataset, []).append(raw)
    synatra, go_browse = by_dataset["synatra"][0], by_dataset["go-browse-wa"][0]
    assert synatra["id"] == go_browse["id"]  # upstream reuses ids across datasets
    a, b = from_adp(synatra, "synatra"), from_adp(go_browse, "go-browse-wa")
    assert a.id != b.id
    assert a.id == from_adp(copy.deepcopy(synatra), "synatra").id
    assert a.provenance.source_id == synatra["id"]


@pytest.mark.parametrize(
    "raw, problem",
    [
        ([], "expected an object"),
        ({"content": []}, "id"),
        ({"id": "x", "content": "nope"}, "`content` must be a list"),
        ({"id": "x", "content": [{"class_": "teleport"}]}, "unknown step class_"),
        ({"id": "x", "content": [{"class_": "api_action", "kwargs": {}}]}, "function"),
    ],
)
def test_bad_adp_records_raise_conversion_error_naming_the_problem(raw, problem):
    with pytest.raises(ConversionError, match=problem) as info:
        from_adp(raw)
    if isinstance(raw, dict) and "id" in raw:
        assert "'x'" in str(info.value)
