"""The export card's model usage and success rate, and datasets written before steps had `usage`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from flows.cli import app
from pipelines.mix import run_mix
from schemas.arrow import STEP_TYPE, TRAJECTORY_SCHEMA
from schemas.models import Usage
from schemas.store import Dataset
from tests.export import _data

PRICED = Usage(model="openai:m", prompt_tokens=100, completion_tokens=10, latency_s=1.5, retries=1, cost_usd=0.002)
CACHED = Usage(model="openai:m", prompt_tokens=100, completion_tokens=10, latency_s=0.0, cost_usd=0.0, cached=True)


def _generated(tid: str, env: str, success: bool, *usages: Usage):
    t = _data.tool_traj(tid, source="rollout").model_copy(update={"success": success})
    t.provenance.method = "rollout"
    t.details = {"task": {"id": tid, "env": "browser"}, "env": {"name": env, "config": {}}}
    actions = [s for s in t.steps if s.kind in ("api", "message")]
    for step, usage in zip(actions, usages):
        step.usage = usage
    return t


def _old_shards(path: Path) -> None:
    """Rewrite the dataset's trajectory shards as written before steps had `usage`."""
    old_step = pa.struct([f for f in STEP_TYPE if f.name != "usage"])
    old = pa.schema([pa.field(f.name, pa.list_(old_step)) if f.name == "steps" else f for f in TRAJECTORY_SCHEMA])
    for file in Dataset.open(path).shard_files("trajectories"):
        rows = pq.read_table(file).to_pylist()
        for row in rows:
            for step in row["steps"]:
                del step["usage"]
        pq.write_table(pa.Table.from_pylist(rows, schema=old), file)


def test_the_card_shows_usage_and_success_rate_per_method_and_environment(tmp_path):
    src = _data.store(tmp_path / "ds", [
        _generated("a", "retail", True, PRICED, CACHED),
        _generated("b", "retail", False, PRICED),
        _generated("c", "browser", True, Usage(model="openai:m", prompt_tokens=7, completion_tokens=3)),  # no price
        _data.masked_traj(),  # converted: no usage, no env
    ])
    out = tmp_path / "sft"
    result = CliRunner().invoke(app, ["export", str(src), "--format", "trl-sft", "--output", str(out)])
    assert result.exit_code == 0, result.output
    card = json.loads((out / "card.json").read_text())["usage"]
    # Usage behind the exported rows (b failed: left out); outcomes over every input with a known success.
    assert card["usage"] == [
        {"method": "rollout", "env": "browser", "calls": 1, "cached": 0, "prompt_tokens": 7, "completion_tokens": 3,
         "latency_s": 0.0, "cost_usd": None},
        {"method": "rollout", "env": "retail", "calls": 2, "cached": 1, "prompt_tokens": 200, "completion_tokens": 20,
         "latency_s": 1.5, "cost_usd": 0.002}]
    assert card["usage_total"]["calls"] == 3 and card["usage_total"]["cost_usd"] is None
    assert {(o["method"], o["env"]): (o["successes"], o["episodes"]) for o in card["outcomes"]} == {
        ("rollout", "retail"): (1, 2), ("rollout", "browser"): (1, 1), ("-", "-"): (1, 1)}
    readme = (out / "README.md").read_text()
    assert "## Model usage" in readme and "unknown (calls without llm.price)" in readme
    assert "| rollout | retail | 1 | 2 | 50.0% |" in readme


def test_datasets_written_before_steps_had_usage_still_read_export_and_mix(tmp_path):
    old = _data.store(tmp_path / "old", [_data.tool_traj("o1"), _data.tool_traj("o2")])
    _old_shards(old)
    assert "usage" not in str(pq.read_schema(Dataset.open(old).shard_files()[0]).field("steps").type)
    records = list(Dataset.open(old).iter_records())
    assert [r.id for r in records] == ["o1", "o2"] and all(s.usage is None for r in records for s in r.steps)

    result = CliRunner().invoke(app, ["export", str(old), "--format", "trl-sft", "--output", str(tmp_path / "e")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "e" / "card.json").read_text())["counts"]["rows"] == 2

    new = _data.store(tmp_path / "new", [_generated("n1", "retail", True, PRICED)])
    run_mix([str(old), str(new)], str(tmp_path / "mix"))
    mixed = {t.id: t for t in Dataset.open(tmp_path / "mix").iter_records()}
    assert set(mixed) == {"o1", "o2", "n1"}
    assert [s.usage for s in mixed["n1"].steps if s.usage is not None] == [PRICED]
    assert all(s.usage is None for s in mixed["o1"].steps)
