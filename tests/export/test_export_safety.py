"""`trajforge export` never deletes what it did not write, never leaves an export that cannot load, and
answers a bad option in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flows.cli import app
from schemas.models import Quarantined
from schemas.store import Dataset
from tests.export import _data


def _cli(*args: Any) -> Any:
    return CliRunner().invoke(app, ["export", *(str(a) for a in args)])


def _one_error_line(result: Any) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output, result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.strip()]
    assert line.startswith("error: "), line
    return line


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_overwrite_refuses_a_directory_no_export_wrote(hand_dataset, tmp_path):
    mine = tmp_path / "mine"
    (mine / "data").mkdir(parents=True)
    (mine / "README.md").write_text("my notes")
    (mine / "data" / "train-notes.txt").write_text("my data")
    (mine / "data" / "train-00000-of-00001.jsonl").write_text("{}\n")
    before = _files(mine)
    for fmt in ("openai", "trl-sft"):
        line = _one_error_line(_cli(hand_dataset, "-f", fmt, "-o", mine, "--overwrite"))
        assert f"{mine}: not an export trajforge wrote (no card.json listing its files)" in line
        assert _files(mine) == before


def test_overwrite_removes_only_the_files_the_earlier_export_wrote(hand_dataset, tmp_path):
    out = tmp_path / "out"
    assert _cli(hand_dataset, "-f", "sharegpt", "-o", out, "--shard-rows", "2").exit_code == 0
    card = json.loads((out / "card.json").read_text())
    written = sorted(card["files"])
    assert written == sorted(_files(out)) and "dataset_info.json" in written and "plots/steps.png" in written
    # What the user adds afterwards stays, whatever its name.
    (out / "notes.md").write_text("mine")
    (out / "data" / "train-extra.parquet").write_bytes(b"mine")
    (out / "plots" / "mine.png").write_bytes(b"mine")
    assert _cli(hand_dataset, "-f", "openai", "-o", out, "--overwrite").exit_code == 0
    left = _files(out)
    assert left["notes.md"] == b"mine" and left["data/train-extra.parquet"] == b"mine" and left["plots/mine.png"] == b"mine"
    assert "dataset_info.json" not in left and not any(f.startswith("data/train-0") and f.endswith(".parquet") for f in left)
    assert sorted(json.loads((out / "card.json").read_text())["files"]) == sorted(
        set(left) - {"notes.md", "data/train-extra.parquet", "plots/mine.png"})


def test_a_card_cannot_make_overwrite_delete_outside_the_export(hand_dataset, tmp_path):
    out = tmp_path / "out"
    assert _cli(hand_dataset, "-f", "openai", "-o", out).exit_code == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (out / "link.txt").symlink_to(victim)
    card = json.loads((out / "card.json").read_text())
    card["files"] += [str(victim), "../victim.txt", "link.txt"]
    (out / "card.json").write_text(json.dumps(card))
    assert _cli(hand_dataset, "-f", "openai", "-o", out, "--overwrite").exit_code == 0
    assert victim.read_text() == "keep" and (out / "link.txt").is_symlink()


def _store_with_quarantine(path: Path, trajectories: list[Any], n_quarantined: int) -> Path:
    ds = Dataset.create(path)
    with ds.unit("u0") as w:
        for t in trajectories:
            w.write("trajectories", t)
        for i in range(n_quarantined):
            w.write("quarantine", Quarantined(id=f"q{i}", stage="convert", error="ConversionError: no steps", raw="{}"))
    return path


@pytest.mark.parametrize("case", ["quarantined-only", "no records", "dpo without pairs", "mix of no source",
                                  "kto without labels"])
def test_an_export_with_nothing_to_write_is_one_line_and_writes_nothing(case, tmp_path):
    """Before, each of these wrote one 0-row shard and a card; `datasets.load_dataset` then failed."""
    if case == "quarantined-only":
        src, args = _store_with_quarantine(tmp_path / "src", [], 3), ["-f", "trl-sft"]
        expected = r"nothing to export: \S+ holds no trajectories; its 3 quarantined records are never exported"
    elif case == "no records":
        src, args = _data.store(tmp_path / "src"), ["-f", "openai"]
        expected = r"nothing to export: \S+ holds no trajectories$"
    elif case == "dpo without pairs":
        src, args = _data.store(tmp_path / "src", [_data.tool_traj()]), ["-f", "trl-dpo"]
        expected = r"nothing to export: \S+ holds no pairs$"
    elif case == "mix of no source":
        src, args = _data.store(tmp_path / "src", [_data.tool_traj()]), ["-f", "trl-sft", "--mix", "nosuch=1"]
        expected = r"none of the 1 trajectories of \S+ gives a trl-sft row \(1 source not in --mix\)"
    else:
        src = _store_with_quarantine(tmp_path / "src", [_data.interleaved_traj()], 2)
        args = ["-f", "trl-kto"]
        expected = (r"none of the 1 trajectories of \S+ gives a trl-kto row \(1 no success label\); "
                    r"its 2 quarantined records are never exported \(`trajforge view \S+` shows why\)")
    out = tmp_path / "out"
    line = _one_error_line(_cli(src, *args, "-o", out))
    assert re.search(expected, line), line
    assert not out.exists()


def test_the_summary_counts_the_quarantined_records_it_did_not_export(tmp_path):
    src = _store_with_quarantine(tmp_path / "src", [_data.tool_traj()], 2)
    result = _cli(src, "-f", "trl-sft", "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert re.search(r"quarantined in the source, not exported\s*│\s*2\s*│", result.output), result.output


@pytest.mark.parametrize("good,bad", [(3, 7), (8, 13), (5, 3), (19, 11)])
def test_kto_weights_keep_the_weighted_balance_in_trls_range(tmp_path, good, bad):
    """Rounded to nearest, each of these gave weights whose weighted ratio fell below 1 (TRL asks for [1, 4/3])."""
    records = [_data.labeled_traj(f"ok-{i}").model_copy(update={"success": True}) for i in range(good)]
    records += [_data.labeled_traj(f"ko-{i}").model_copy(update={"success": False}) for i in range(bad)]
    src = _data.store(tmp_path / "src", records)
    out = tmp_path / "out"
    assert _cli(src, "-f", "trl-kto", "--kto-mode", "trajectory", "-o", out).exit_code == 0
    labels = json.loads((out / "card.json").read_text())["distributions"]["kto_labels"]
    assert (labels["desirable"], labels["undesirable"]) == (good, bad)
    weights = re.search(r"desirable_weight=([\d.]+), undesirable_weight=([\d.]+)", (out / "README.md").read_text())
    assert weights is not None
    desirable, undesirable = float(weights[1]), float(weights[2])
    assert 1 <= desirable * good / (undesirable * bad) <= 4 / 3


def test_bad_tokenizer_and_web_limit_are_one_line(hand_dataset, tmp_path):
    line = _one_error_line(_cli(hand_dataset, "-f", "tokenized", "--tokenizer", "/nonexistent", "-o", tmp_path / "a"))
    assert line == "error: --tokenizer /nonexistent: no such directory (give a tokenizer directory with a chat template)"
    line = _one_error_line(_cli(hand_dataset, "-f", "trl-sft", "--web-max-chars", "-1", "-o", tmp_path / "b"))
    assert line == "error: --web-max-chars must be >= 0 (0: pages are not cut), got -1"
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
