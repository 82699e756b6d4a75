"""Every shipped ADP raw sample converts, and matches ADP's standardized sample step by step.

Compared per step: kind, function + arguments, language + code, message / observation content,
observation source and name, image path + annotations, web url / html / axtree / screenshot /
viewport, and the `thought` text (ADP `description`). Justified normalizations:

- ADP appends one of five fixed closing turns ("Congratulations! ..." + "<finish> ... </finish>")
  chosen with `random.choice`; our converters pick one from the record id and list the indices
  in `details["synthetic_steps"]`; at those indices any of the fixed variants is accepted.
- synatra: ADP numbers records by position (no upstream id); matched by position.
- webarena_successful: task ids repeat and ADP's sample_std is not one-to-one with sample_raw;
  each converted record must equal one of the standardized records.
- nnetnav-wa: ADP's script restarts an episode after a step it cannot parse
  (`scroll [direction=down]`), dropping everything before it; we parse that step, so the
  standardized record equals our goal turn followed by the tail of our steps.
- turkingbench: ADP's script caches each task's page across records and keeps mutating it, so
  its sample_std holds later copies of a record converted from an already-filled page; each of
  ours is compared with the first standardized record of its id (converted from a fresh page).

The comparison lives in `_compare.assert_matches_adp`; tests/converters/test_cli_samples.py
applies it to what `trajforge convert` writes.
- No dataset here uses ADP's LLM-generated thoughts in sample_std, so thoughts are compared
  everywhere (the optional `thoughts=` inputs are tested separately).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: make _compare importable

from _compare import ADP_DIR, assert_matches_adp, available, load, module, sample_datasets, units
from converters.registry import _REGISTRY
from schemas.models import Trajectory

SAMPLE_DATASETS = sample_datasets()


def _convert_all(name: str) -> list[Trajectory]:
    mod = module(name)
    raws = load(ADP_DIR / name / "sample_raw.json")
    return [mod.convert(u) for u in units(name, raws)]


@pytest.mark.parametrize("name", SAMPLE_DATASETS)
def test_sample_raw_converts(name: str) -> None:
    out = _convert_all(name)
    assert out, name
    info = _REGISTRY[name]
    assert info.fn is module(name).convert and info.sources and info.doc
    for t in out:
        assert isinstance(t, Trajectory)
        assert t.source == name
        assert t.provenance.source_dataset
        assert t.steps
        # round-trips through JSON
        assert Trajectory.model_validate_json(t.model_dump_json()) == t
    assert len({t.id for t in out}) == len(out)


@pytest.mark.parametrize("name", SAMPLE_DATASETS)
def test_matches_adp_standardized(name: str) -> None:
    assert_matches_adp(name, _convert_all(name))


def test_success_flags() -> None:
    assert all(t.success is True and t.reward == 1.0 for t in _convert_all("webarena_successful"))
    for name, key in (("swe-gym_openhands_sampled_trajectories", "resolved"), ("swe-smith", "resolved"),
                      ("mini-coder", "verified"), ("nebius_SWE-agent-trajectories", "target")):
        raws = load(ADP_DIR / name / "sample_raw.json")
        assert [t.success for t in _convert_all(name)] == [r[key] for r in raws]


def test_tools_filled() -> None:
    (toucan,) = _convert_all("toucan_1_5m")
    assert toucan.tools[0].name == "web_search_exa"
    assert toucan.tools[0].parameters["required"] == ["query"]
    api = [s for s in toucan.steps if s.kind == "api"][0]
    result = [s for s in toucan.steps if s.kind == "text" and s.source == "environment" and s.name != "system"][0]
    assert api.tool_call_id and api.tool_call_id == result.tool_call_id
    gym = _convert_all("swe-gym_openhands_sampled_trajectories")[0]
    assert {t.name for t in gym.tools} == {"execute_bash", "str_replace_editor", "finish"}
    linked = [s for s in gym.steps if s.kind in ("api", "code") and s.tool_call_id]
    obs_ids = {s.tool_call_id for s in gym.steps if s.kind == "text" and s.tool_call_id}
    assert linked and all(s.tool_call_id in obs_ids for s in linked)
    kg = _convert_all("agenttuning_kg")[0]
    assert {s.function for s in kg.steps if s.kind == "api"} <= {t.name for t in kg.tools}


def test_generated_thoughts_optional() -> None:
    mod = module("agenttuning_alfworld")
    raw = load(ADP_DIR / "agenttuning_alfworld" / "sample_raw.json")[0]
    thoughts = load(ADP_DIR / "agenttuning_alfworld" / "generated_thoughts.json")
    plain, with_thoughts = mod.convert(raw), mod.convert(raw, thoughts=thoughts)
    assert [s.kind for s in plain.steps] == [s.kind for s in with_thoughts.steps]
    filled = [s.thought for s in with_thoughts.steps if s.kind == "api"]
    assert "" in [s.thought for s in plain.steps if s.kind == "api"] and "" not in filled
    gym = module("swe-gym_openhands_sampled_trajectories")
    raw = load(ADP_DIR / "swe-gym_openhands_sampled_trajectories" / "sample_raw.json")[0]
    per_record = load(ADP_DIR / "swe-gym_openhands_sampled_trajectories" / "generated_thoughts.json")[raw["instance_id"]]
    t = gym.convert(raw, thoughts=per_record)
    assert any(s.thought == per_record["1"] for s in t.steps if s.kind in ("api", "code"))


def test_episode_grouping() -> None:
    raws = load(ADP_DIR / "nnetnav-wa" / "sample_raw.json")
    eps = units("nnetnav-wa", raws)
    assert [len(e) for e in eps] == [9, 4, 9, 25, 21]
    # a single step row is a one-step episode
    t = module("nnetnav-wa").convert(raws[0])
    assert [s.kind for s in t.steps] == ["text", "web", "api"]


def test_go_browse_wa_passthrough() -> None:
    mod = module("go-browse-wa")
    for rec in load(ADP_DIR / "go-browse-wa" / "sample_std.json"):
        t = mod.convert(rec)
        assert t.source == "go-browse-wa" and t.provenance.source_id == rec["id"]
        assert len(t.steps) == len(rec["content"])


def test_all_registered() -> None:
    for name in available():
        module(name)
        assert name in _REGISTRY, name
