"""The dataset card's plots: PNGs next to README.md, linked from it, rebuilt by `trajforge card`."""

from __future__ import annotations

import json
import re
import struct
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from converters.export import ExportConfig, export
from flows.cli import app
from schemas.store import Dataset

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FILTER_COUNTS = {"in": 12, "kept": 7, "filtered": 5, "quarantined": 0,
                 "reason:no_loops:action repeated 3 times in a row at step 4: call f({})": 3,
                 "reason:well_formed:no action": 2}


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _linked(out: Path) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\((plots/[^)]+\.png)\)", (out / "README.md").read_text())


@pytest.fixture()
def filtered_source(hand_dataset: Path) -> Path:
    """The hand dataset with a filter stage's counts in its manifest."""
    Dataset.open(hand_dataset).mark_complete(FILTER_COUNTS)
    return hand_dataset


def test_card_has_valid_linked_plots(filtered_source, tmp_path):
    out = tmp_path / "kto"
    export(filtered_source, out, ExportConfig(format="trl-kto"))
    linked = _linked(out)
    names = {Path(p).name for p in linked}
    assert {"steps.png", "tokens.png", "sources.png", "step_labels.png", "kto_labels.png",
            "filter_reasons.png"} <= names
    assert sorted(p.name for p in (out / "plots").glob("*.png")) == sorted(names)  # every PNG is linked
    for rel in linked:
        width, height = _png_size(out / rel)
        assert width >= 300 and height >= 200
        assert (out / rel).stat().st_size > 5_000  # drawn axes and bars, not an empty canvas

    data = json.loads((out / "card.json").read_text())
    d = data["distributions"]
    # The labeled trajectory's three agent steps, as labeled; KTO rows per label from the shards.
    assert d["step_labels"]["good"] >= 1 and d["step_labels"]["bad"] >= 1
    assert sum(d["kto_labels"].values()) == data["counts"]["rows"]
    assert sum(d["tokens"]["counts"]) == data["counts"]["rows"]
    assert sum(d["steps"].values()) == data["counts"]["records_exported"]
    assert d["filter_reasons"] == {"no_loops: action repeated 3 times in a row at step 4: call f({})": 3,
                                   "well_formed: no action": 2}
    assert "## Filtered upstream" in (out / "README.md").read_text()


def test_steps_and_rewards_count_only_exported_trajectories(hand_dataset, tmp_path):
    out = tmp_path / "sft"
    report = export(hand_dataset, out, ExportConfig(format="trl-sft"))
    d = json.loads((out / "card.json").read_text())["distributions"]
    exported = set(pq.read_table(out / "data", columns=["id"]).column("id").to_pylist())
    trajectories = [t for t in Dataset.open(hand_dataset).iter_records("trajectories") if t.id in exported]
    assert len(trajectories) == report.records_exported < Dataset.open(hand_dataset).count()  # one was skipped
    assert d["steps"] == {str(n): c for n, c in sorted(Counter(len(t.steps) for t in trajectories).items())}
    rewards = Counter(f"{round(t.reward, 2):g}" for t in trajectories if t.reward is not None)
    assert d.get("rewards", {}) == dict(sorted(rewards.items(), key=lambda kv: float(kv[0])))
    assert "filter_reasons" in d and not d["filter_reasons"]  # no filter stage upstream: no plot
    assert not (out / "plots" / "filter_reasons.png").exists()


def test_dpo_card_plots_cover_both_sides_of_each_pair(hand_dataset, tmp_path):
    out = tmp_path / "dpo"
    report = export(hand_dataset, out, ExportConfig(format="trl-dpo"))
    assert report.rows == 1
    d = json.loads((out / "card.json").read_text())["distributions"]
    assert sum(d["steps"].values()) == 2  # the chosen and the rejected trajectory
    assert "plots/steps.png" in _linked(out)


def test_trajforge_card_regenerates_readme_and_plots(filtered_source, tmp_path):
    out = tmp_path / "sft"
    export(filtered_source, out, ExportConfig(format="trl-sft"))
    readme = (out / "README.md").read_text()
    plots = {p.name: p.stat().st_size for p in (out / "plots").glob("*.png")}
    assert plots
    (out / "README.md").unlink()
    for p in (out / "plots").glob("*.png"):
        p.unlink()

    result = CliRunner().invoke(app, ["card", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "README.md").read_text() == readme
    again = {p.name: p.stat().st_size for p in (out / "plots").glob("*.png")}
    assert set(again) == set(plots) and all(n > 5_000 for n in again.values())
    for rel in _linked(out):
        _png_size(out / rel)


def test_trajforge_card_refuses_a_folder_without_card_data(tmp_path):
    result = CliRunner().invoke(app, ["card", str(tmp_path)])
    assert result.exit_code == 1
    assert "no card.json" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("fmt", ["trl-sft", "trl-dpo", "trl-kto", "tokenized", "openai", "sharegpt", "atif"])
def test_the_cards_load_line_loads_the_export(fmt, hand_dataset, tmp_path, tmp_path_factory):
    from tests.export import _tiny

    out = tmp_path / "export"
    extra = ["--tokenizer", str(_tiny.shared_model_dir(tmp_path_factory)), "--skip-unfit-rows"] \
        if fmt == "tokenized" else []
    result = CliRunner().invoke(app, ["export", str(hand_dataset), "--format", fmt, "-o", str(out), *extra])
    assert result.exit_code == 0, result.output
    card = json.loads((out / "card.json").read_text())
    line = card["load"]
    assert line in (out / "README.md").read_text() and "load_from_disk" in (out / "README.md").read_text()
    scope: dict = {}
    exec(line, scope)  # the line as the card prints it
    assert len(scope["ds"]) == card["counts"]["rows"] > 0, (scope["ds"].cache_files, line)
