"""Mixing: deterministic for a seed, different across seeds, proportions as the semantics say."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flows.cli import app
from pipelines.mix import MixError, run_mix, source_probabilities
from schemas.store import Dataset
from tests.factories import tool_trajectory
from tests.filters.conftest import make_dataset


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    def recs(name, n):
        out = []
        for i in range(n):
            t = tool_trajectory(i)
            t.id, t.source = f"{name}/{i}", name
            out.append(t)
        return out
    make_dataset(root / "a", recs("big", 3000), per_unit=1000)
    make_dataset(root / "b", recs("small", 1000), per_unit=500)
    return root


def test_probabilities():
    p = source_probabilities({"a": 300, "b": 100}, {}, 1.0)
    assert p == pytest.approx({"a": 0.75, "b": 0.25})
    p = source_probabilities({"a": 300, "b": 100}, {"b": 3.0}, 1.0)
    assert p == pytest.approx({"a": 0.5, "b": 0.5})
    p = source_probabilities({"a": 300, "b": 100}, {}, 1e9)
    assert p == pytest.approx({"a": 0.5, "b": 0.5})


def _ids(path):
    return sorted(Dataset.open(path).ids())


def test_mix_deterministic_and_proportional(sources, tmp_path):
    ins = [str(sources / "a"), str(sources / "b")]
    s1 = run_mix(ins, str(tmp_path / "m1"), temperature=2.0, seed=1, total=1000)
    run_mix(list(reversed(ins)), str(tmp_path / "m2"), temperature=2.0, seed=1, total=1000)
    s3 = run_mix(ins, str(tmp_path / "m3"), temperature=2.0, seed=2, total=1000)
    assert _ids(tmp_path / "m1") == _ids(tmp_path / "m2")
    assert _ids(tmp_path / "m1") != _ids(tmp_path / "m3")
    # T=2: p ∝ sqrt(n) -> big: sqrt(3000)/(sqrt(3000)+sqrt(1000)) = 0.634
    by = {m.name: m for m in s1.sources}
    assert by["big"].probability == pytest.approx(0.634, abs=1e-3)
    for m in s1.sources:
        assert abs(m.written - m.target) <= 4 * (m.target ** 0.5) + 5
    assert Dataset.open(tmp_path / "m1").manifest()["counts"]["source:big"] == by["big"].written
    assert s1.written == sum(m.written for m in s1.sources) == Dataset.open(tmp_path / "m1").count()
    assert s3.written > 0


def test_mix_cli_weights_and_errors(sources, tmp_path):
    result = CliRunner().invoke(app, ["mix", str(sources / "a"), str(sources / "b"), "--weights", "small=3",
                                      "--seed", "5", "--output", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    counts = Dataset.open(tmp_path / "m").manifest()["counts"]
    # p = 0.5 each of N=4000 -> small capped at its 1000 records, big gets ~2000.
    assert counts["source:small"] == 1000 and abs(counts["source:big"] - 2000) < 150
    with pytest.raises(MixError, match="unknown sources"):
        run_mix([str(sources / "a")], str(tmp_path / "x"), weights={"nope": 1.0})


@pytest.mark.parametrize("total", ["-5", "0"])
def test_mix_cli_refuses_a_total_below_one_record(sources, tmp_path, total):
    """`--total -5` used to exit 0 with an empty output."""
    result = CliRunner().invoke(app, ["mix", str(sources / "b"), "--total", total, "--output", str(tmp_path / "m")])
    assert result.exit_code == 1 and result.output.strip() == f"error: total must be at least 1 record, not {total}"
    assert not (tmp_path / "m").exists()
