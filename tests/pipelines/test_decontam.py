"""Decontamination: the reference index's rules, test splits of task sources, and `trajforge decontaminate`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import pyarrow as pa

from envs.tasks import TaskFileError, TaskSourceConfig, held_out_tasks, load_tasks
from filters.decontam import Reference, ReferenceFileError, ReferenceIndex, file_references, record_texts
from schemas.arrow import TRAJECTORY_SCHEMA, trajectory_to_row
from schemas.models import MessageAction, TextObservation, Trajectory
from schemas.store import Dataset
from tests.conftest import REPO
from tests.envs.mcp_support import TASKS

SCENARIO = ("You want to exchange the water bottle and the desk lamp. You want to exchange the water bottle to a "
            "bigger one, and the desk lamp to a less bright one.")


def _record(rid: str, *turns: str, instruction: str | None = None) -> Trajectory:
    steps = [TextObservation(content="You are a helpful agent. Follow the policy.", source="environment", name="system")]
    for k, turn in enumerate(turns):
        steps.append(TextObservation(content=turn, source="user") if k % 2 == 0 else MessageAction(content=turn))
    details = {"task": {"id": "t", "env": "mcp", "instruction": instruction}} if instruction else {}
    return Trajectory(id=rid, source="test", steps=steps, details=details)


def test_index_matches_exact_similar_and_ngram_and_never_the_system_prompt() -> None:
    refs = [Reference("bench-1", "file b.jsonl", "Cancel order #W1 because I no longer need it.", SCENARIO),
            Reference("bench-2", "file b.jsonl", "Click the OK button.", "Click the OK button.")]
    index = ReferenceIndex(refs)
    exact = index.match("cancel order #w1, because I no longer need it", "")
    assert exact is not None and exact.kind == "exact instruction" and exact.reference.id == "bench-1"
    similar = index.match("Please exchange the water bottle and the desk lamp: the water bottle to a bigger one, "
                          "and the desk lamp to a less bright one", "")
    assert similar is None or similar.kind != "exact instruction"
    overlap = index.match("Hi", "I was told: you want to exchange the water bottle to a bigger one, and the desk lamp "
                                "to a dimmer one.")
    assert overlap is not None and overlap.kind == "n-gram" and overlap.reference.id == "bench-1"
    assert overlap.evidence.startswith("you want to exchange the water bottle")
    assert overlap.reason(13).startswith("13-gram overlap with file b.jsonl bench-1: ")
    assert index.match("Click the ok button!", "").kind == "exact instruction"  # type: ignore[union-attr]
    assert index.match("Click the cancel button.", "Nothing in common here at all.") is None
    assert ReferenceIndex(refs, min_ngrams=50).match("Hi", SCENARIO) is None  # fewer overlapping n-grams than asked
    # Instructions come from details.task, else the first user turn; the system step is never text of the record.
    table = pa.Table.from_pylist([trajectory_to_row(_record("a", "Hello there", "Hi!", instruction="Do X")),
                                  trajectory_to_row(_record("b", "Hello there", "Hi!"))], schema=TRAJECTORY_SCHEMA)
    (ia, ta), (ib, tb) = record_texts(table)
    assert ia == "Do X" and ib == "Hello there" and "policy" not in ta and ta == "Hello there\nHi!"


def test_similar_instructions_match_by_minhash() -> None:
    base = ("I received my order and want to exchange the mechanical keyboard for the same one with clicky "
            "switches and the smart thermostat for one compatible with Google Home")
    index = ReferenceIndex([Reference("r", "s", base, base)], ngram=40)  # n-grams longer than the texts: MinHash only
    hit = index.match(base.replace("I received", "I have received"), "")
    assert hit is not None and hit.kind == "similar instruction" and 0.8 <= hit.score < 1.0
    assert index.match("I want to return a skateboard and a garden hose from my delivered orders please", "") is None


def test_task_sources_with_a_test_split(tmp_path: Path) -> None:
    tau2 = held_out_tasks(TaskSourceConfig(source="tau2", path=TASKS, split="train", n=2), "mcp")
    assert tau2 is not None and len(tau2) == 40 and {t.metadata["split"] for t in tau2} == {"test"}
    assert held_out_tasks(TaskSourceConfig(source="env"), "retail") is None
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "a", "instruction": "Train on me."}) + "\n"
                     + json.dumps({"id": "b", "instruction": "Test me.", "metadata": {"split": "test"}}) + "\n")
    with pytest.raises(TaskFileError, match=r"tasks.jsonl: 1 task\(s\) marked metadata.split: test \(b\)"):
        load_tasks(TaskSourceConfig(source="jsonl", path=str(tasks)), "retail")
    assert [t.id for t in held_out_tasks(TaskSourceConfig(source="jsonl", path=str(tasks)), "retail")] == ["b"]
    assert len(load_tasks(TaskSourceConfig(source="jsonl", path=str(tasks), allow_test_split=True), "retail")) == 2
    # MiniWoB: seeds from 100000 on are the test split (refused before any page is opened).
    with pytest.raises(TaskFileError, match=r"miniwob: 1 task\(s\) of the test split \(seeds from 100000"):
        load_tasks(TaskSourceConfig(source="miniwob", split="test", options={"tasks": ["click-button"]}), "browser")
    bad = tmp_path / "refs.jsonl"
    bad.write_text('"a benchmark question"\n{"broken\n')
    with pytest.raises(ReferenceFileError, match=r"refs.jsonl:2: not JSON"):
        file_references(bad)


def test_cli_decontaminate_drops_tau2_test_overlaps_and_named_items_then_resumes(tmp_path: Path) -> None:
    train = load_tasks(TaskSourceConfig(source="tau2", path=TASKS), "mcp")
    records = [_record(f"gen/{t.id}", t.instruction, "Sure.", instruction=t.instruction) for t in train]
    records.append(_record("conv/bench", "What is the capital of the small country of Freedonia in the year 1933?"))
    ds = Dataset.create(tmp_path / "in", stage="test")
    with ds.unit("u0") as u:
        u.write_many("trajectories", records)
    ds.mark_complete({})
    refs = tmp_path / "bench.jsonl"
    refs.write_text(json.dumps({"id": "q7", "question": "What is the capital of the small country of Freedonia in the "
                                                        "year 1933?", "answer": "Fredonia City"}) + "\n")
    config = tmp_path / "tau2.yaml"
    config.write_text(f"env: mcp\ntasks: {{source: tau2, path: '{TASKS}', split: train}}\n")
    cmd = [sys.executable, "-m", "flows.cli", "decontaminate", str(tmp_path / "in"), "-o", str(tmp_path / "out"),
           "--tasks", str(config), "--reference", str(refs)]
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = Dataset.open(tmp_path / "out")
    dropped = {f.record.id: f.decision for f in out.iter_records("filtered")}
    # tau2 retail's own train split: 20 of its 74 tasks share a 13-gram with a test task (templated families).
    assert len(dropped) == 21 and out.count() == len(records) - 21
    assert dropped["conv/bench"].reason.startswith("exact instruction with file bench.jsonl q7")
    assert dropped["gen/tau2-retail-13"].reason.startswith("13-gram overlap with tau2 test tasks tau2-retail-12")
    report = out.manifest()["decontamination"]
    assert report["dropped_by_source"] == {"file bench.jsonl": 1, "tau2 test tasks": 20}
    assert report["references"] == {"file bench.jsonl": 1, "tau2 test tasks": 40} and len(report["examples"]) == 10
    assert "in 75 = kept 54 + dropped 21" in done.stdout and "e.g. conv/bench ~ file bench.jsonl q7" in done.stdout
    assert "tau2-retail-12 (n-gram): 'you just got into gaming" in done.stdout

    from typer.testing import CliRunner

    from flows.cli import app

    again = CliRunner().invoke(app, cmd[3:])
    assert again.exit_code == 0 and "(0/1 shards run" in again.output  # resumed: nothing to redo
    missing = CliRunner().invoke(app, cmd[3:7])
    assert missing.exit_code != 0 and "give the test data to check against" in missing.output

    from converters.export import ExportConfig, export

    export(tmp_path / "out", tmp_path / "sft", ExportConfig(format="trl-sft", include_failed=True))
    card = (tmp_path / "sft" / "README.md").read_text()
    assert "## Decontamination" in card and "| dropped: tau2 test tasks | 20 |" in card


def test_a_templated_instruction_counts_only_by_its_n_grams():
    """MiniWoB's test seeds are references whose words other seeds share by design: no exact or similar match."""
    from filters.decontam import Reference, ReferenceIndex

    words = "close the dialog box by clicking the x"
    index = ReferenceIndex([Reference("miniwob/click-dialog/100000", "miniwob test tasks", words, words, templated=True),
                            Reference("tau2-retail-1", "tau2 test tasks", "cancel my order", "cancel my order")])
    assert index.match(words, "") is None
    assert index.match("Cancel my order", "").kind == "exact instruction"  # other references still match
    long = "please open the settings page and then close the dialog box by clicking the x in its corner"
    templated = ReferenceIndex([Reference("t", "miniwob test tasks", long, long, templated=True)], ngram=5)
    assert templated.match("something else", long).kind == "n-gram"
