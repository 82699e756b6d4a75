"""Filter, dedup, mix and the DPO export inside the pipeline flow: contents, counts, artifacts."""

from __future__ import annotations

import asyncio
import glob
import json

import datasets
import yaml

from backends.fake_server import FakeServer, Rule
from schemas.store import Dataset
from tests.flows.test_pipeline_flow import ADP_FILES, _agent, _artifacts, _runs


def _config(tmp, base_url):
    cfg = {
        "output": str(tmp / "out"),
        "llm": {"backend": "openai", "base_url": base_url, "model": "fake-model", "api_key_env": "TRAJFORGE_TEST_KEY",
                "max_retries": 0, "request_timeout_s": 5},
        "convert": [{"name": "adp", "source": "adp", "inputs": [str(p) for p in ADP_FILES]}],
        "generate": [{"name": "mcts", "method": "mcts_splice", "agent": "scripted", "env": "retail",
                      "env_config": {"seed": 0}, "tasks": {"n": 2}, "verifier": "rules", "revision": "template",
                      "search": {"iterations": 2, "generations": 3, "max_depth": 4}}],
        "filter": {"chain": [{"name": "well_formed"}, {"name": "final_answer"}]},
        "dedup": {"threshold": 0.8},
        "mix": {"name": "mix", "seed": 0},
        "export": ["trl-sft", {"format": "trl-dpo", "dataset": "mcts"}],
    }
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_filter_dedup_mix_and_dpo_in_the_flow(prefect_harness, tmp_path, monkeypatch):
    from flows.pipeline import pipeline_flow

    monkeypatch.setenv("TRAJFORGE_TEST_KEY", "x")
    with FakeServer(rules=[Rule(fn=_agent)]) as server:
        result = pipeline_flow(str(_config(tmp_path, server.base_url)))
    out = tmp_path / "out"
    by = {(r["stage"], r["name"]): r for r in result["stages"]}
    assert [k[0] for k in by] == ["convert", "generate", "filter", "filter", "dedup", "dedup", "mix", "export", "export"]

    for stage in ("filter", "dedup"):
        for name in ("adp", "mcts"):
            c = by[(stage, name)]["counts"]
            assert c["in"] == c["kept"] + c["filtered"] + c["quarantined"]
            ds = Dataset.open(out / stage / name)
            assert ds.count() == c["kept"] and ds.count("filtered") == c["filtered"]
            dropped = sum(v for k, v in c.items() if k.startswith("filtered:"))
            assert dropped == c["filtered"]
    # The filter's input is the stage before it; the mix writes what dedup kept, per source.
    assert by[("filter", "adp")]["counts"]["in"] == by[("convert", "adp")]["counts"]["out"]
    assert by[("dedup", "mcts")]["counts"]["in"] == by[("filter", "mcts")]["counts"]["kept"]
    mix = by[("mix", "mix")]["counts"]
    assert mix["written"] == Dataset.open(out / "mix" / "mix").count() == \
        by[("dedup", "adp")]["counts"]["kept"] + by[("dedup", "mcts")]["counts"]["kept"]
    assert by[("filter", "mcts")]["counts"]["filtered"] >= 1  # failed paths end on no final answer
    assert any(k.startswith("reason:final_answer:") for k in by[("filter", "mcts")]["counts"])

    dpo = by[("export", "mcts-trl-dpo")]["counts"]
    # Step-level rows: a fork's trajectory-level and step-level pairs give the same row, written once.
    assert dpo["in"] == Dataset.open(out / "generate" / "mcts").count("pairs") == \
        dpo["exported"] + dpo.get("skipped:duplicate of an earlier row", 0)
    assert dpo["exported"] > 0
    rows = datasets.load_dataset("parquet", data_files=glob.glob(str(out / "export" / "mcts-trl-dpo" / "data" / "*.parquet")),
                                 split="train", cache_dir=str(tmp_path / ".hf"))
    assert len(rows) == dpo["rows"] and all(r["chosen"] != r["rejected"] for r in rows)
    assert (out / "export" / "mcts-trl-dpo" / "plots" / "steps.png").is_file()

    arts = {a.key: a for a in asyncio.run(_artifacts(_runs(out)[0]["flow_run_id"]))}
    md = arts["trajforge-pipeline-summary"].data
    assert "| filter | mcts | ran |" in md and "| mix | mix | ran |" in md and "**Counts by reason**" in md
    reason = next(k for k in by[("filter", "mcts")]["counts"] if k.startswith("reason:final_answer:"))
    assert f"| filter | mcts | {reason} | {by[('filter', 'mcts')]['counts'][reason]} |" in md
    assert str(out / "mix" / "mix") in md
    assert str(out / "export" / "mcts-trl-dpo") in arts["trajforge-export-mcts-trl-dpo"].data
    assert json.loads((out / "_runs.jsonl").read_text().splitlines()[0])["output"] == str(out)
