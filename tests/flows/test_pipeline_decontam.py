"""Decontamination inside the pipeline flow: first stage, drops records and their pairs, counts on the card."""

from __future__ import annotations

import json

import yaml

from envs.registry import make_env
from schemas.store import Dataset
from tests.flows.test_pipeline_flow import ADP_FILES


def test_decontaminate_runs_first_drops_records_and_pairs_and_the_card_says_so(prefect_harness, tmp_path):
    from flows.pipeline import pipeline_flow

    # The first ADP record's own problem (its first user turn is a worked example all records share).
    first = json.loads(ADP_FILES[0].read_text())[0]
    problem = [c["content"] for c in first["content"] if c["class_"] == "text_observation"
               and c.get("source") == "user"][1].split("My problem is:")[1].strip()
    leaked_task = make_env("retail", seed=0).generate_tasks(2, seed=0)[0]
    refs = tmp_path / "bench.jsonl"
    refs.write_text(json.dumps({"id": "bench-1", "question": problem}) + "\n"
                    + json.dumps({"id": "bench-2", "instruction": leaked_task.instruction}) + "\n")
    cfg = {
        "output": str(tmp_path / "out"),
        "convert": [{"name": "adp", "source": "adp", "inputs": [str(ADP_FILES[0])]}],
        "generate": [{"name": "mcts", "method": "mcts_splice", "agent": "scripted", "env": "retail",
                      "env_config": {"seed": 0}, "tasks": {"n": 2}, "verifier": "rules", "revision": "template",
                      "search": {"iterations": 2, "generations": 3, "max_depth": 4}}],
        "decontaminate": {"references": [str(refs)]},
        "dedup": {"threshold": 0.8},
        "mix": {"name": "mix", "seed": 0},
        "export": ["trl-sft", {"format": "trl-dpo", "dataset": "mcts"}],
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    result = pipeline_flow(str(path))
    by = {(r["stage"], r["name"]): r for r in result["stages"]}
    assert [k[0] for k in by][:4] == ["convert", "generate", "decontaminate", "decontaminate"]

    out = tmp_path / "out"
    adp_counts, mcts_counts = by[("decontaminate", "adp")]["counts"], by[("decontaminate", "mcts")]["counts"]
    assert adp_counts["filtered"] == 1 and adp_counts["in"] == adp_counts["kept"] + 1
    assert adp_counts["decontaminate:file bench.jsonl"] == 1
    generated = Dataset.open(out / "generate" / "mcts")
    of_task = [t.id for t in generated.iter_records() if t.provenance.task_id == leaked_task.id]
    assert of_task and mcts_counts["filtered"] == len(of_task)
    (dropped,) = [f for f in Dataset.open(out / "decontaminate" / "adp").iter_records("filtered")]
    assert dropped.decision.filter == "decontaminate" and dropped.decision.reason.startswith(
        "13-gram overlap with file bench.jsonl bench-1: ")
    # Pairs go with their trajectories (all of this run's pairs are of the leaked task), and the DPO export
    # reads the decontaminated dataset.
    kept = Dataset.open(out / "decontaminate" / "mcts")
    assert mcts_counts["pairs_in"] == generated.count("pairs") > 0
    assert kept.count("pairs") == generated.count("pairs") - mcts_counts["pairs_dropped"] == 0
    assert by[("export", "mcts-trl-dpo")]["counts"]["in"] == 0
    # Downstream stages read what decontamination kept.
    assert by[("dedup", "adp")]["counts"]["in"] == adp_counts["kept"]
    card = (out / "export" / "mix-trl-sft" / "README.md").read_text()
    assert "## Decontamination" in card and "file bench.jsonl (2)" in card
    assert f"| dropped | {adp_counts['filtered'] + mcts_counts['filtered']} |" in card
    assert "bench-1" in card
    report = by[("decontaminate", "mcts")]["report"]
    assert report["dropped_by_kind"] == {"exact instruction": len(of_task)}
