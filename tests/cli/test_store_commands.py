"""`trajforge schema`, `validate` and `stats` on good and bad dataset directories."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.cli import app
from schemas.json_schema import committed
from schemas.models import Quarantined
from schemas.store import MANIFEST, Dataset
from tests.factories import adp_trajectories, tool_trajectory

runner = CliRunner()


@pytest.fixture()
def dataset(tmp_path, adp_dir):
    ds = Dataset.create(tmp_path / "ds", stage="test")
    records = {r.id: r for r in adp_trajectories(adp_dir)}  # upstream repeats whole records
    with ds.unit("u0", max_rows=40) as unit:
        unit.write_many("trajectories", records.values())
        unit.write("trajectories", tool_trajectory(1, success=False))
        unit.write("quarantine", Quarantined(id="q1", stage="convert", error="ConversionError: no id", raw="{}"))
        unit.write("quarantine", Quarantined(id="q2", stage="parse", error="JSONDecodeError: truncated", raw="{"))
    return ds


def test_schema_prints_the_committed_json_schema():
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    assert result.output == committed()
    assert json.loads(result.output)["$defs"]["Pair"]["properties"]["prefix_len"]["type"] == "integer"


def test_validate_ok(dataset):
    result = runner.invoke(app, ["validate", str(dataset.path)])
    assert result.exit_code == 0, result.output
    assert f"ok: {dataset.count() + 2} records valid" in result.output


def test_validate_reports_invalid_records(dataset, tmp_path):
    bad = Dataset.create(tmp_path / "bad")
    row = {"id": "b1", "source": "x", "steps": [{"kind": "api", "function": "f", "arguments": "{not json"}]}
    with bad.unit("u0") as unit:
        unit.write_row("trajectories", row)
        unit.write("trajectories", tool_trajectory(1))
        unit.write("trajectories", tool_trajectory(1))
    result = runner.invoke(app, ["validate", str(bad.path)])
    assert result.exit_code == 1
    assert "trajectories record 'b1'" in result.output
    assert "trajectories record 'test/1': duplicate id" in result.output
    assert "2 invalid record(s)" in result.output


def test_stats_json_matches_the_records(dataset, adp_dir):
    result = runner.invoke(app, ["stats", str(dataset.path), "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    records = list(dataset.iter_records())
    assert stats["records"] == len(records)
    by_source = {row["source"]: row["records"] for row in stats["sources"]}
    assert by_source["test"] == 1 and by_source["agenttuning_os"] == 5
    assert sum(by_source.values()) == len(records)
    steps = sorted(len(r.steps) for r in records)
    assert stats["steps_per_trajectory"]["min"] == steps[0]
    assert stats["steps_per_trajectory"]["max"] == steps[-1]
    kinds = {row["kind"]: row["steps"] for row in stats["step_kinds"]}
    assert kinds["api"] == sum(1 for r in records for s in r.steps if s.kind == "api")
    tools = {row["function"]: row["calls"] for row in stats["tools_used"]}
    calls = {}
    for r in records:
        for s in r.steps:
            if s.kind == "api":
                calls[s.function] = calls.get(s.function, 0) + 1
    assert tools == dict(sorted(calls.items(), key=lambda kv: (-kv[1], kv[0]))[:50])
    assert {(r["stage"], r["error"]) for r in stats["quarantine_reasons"]} == {
        ("convert", "ConversionError"),
        ("parse", "JSONDecodeError"),
    }
    assert {row["success"]: row["records"] for row in stats["outcomes"]}["false"] == 1
    assert stats["reward"]["count"] == 1


def test_stats_table_output(dataset):
    result = runner.invoke(app, ["stats", str(dataset.path)])
    assert result.exit_code == 0
    assert "records per source" in result.output and "quarantine reasons" in result.output


@pytest.mark.parametrize("problem", ["missing", "truncated", "foreign"])
def test_expected_errors_are_one_line_without_traceback(dataset, tmp_path, problem):
    path = dataset.path
    if problem == "missing":
        path = tmp_path / "nowhere"
        expected = "no such dataset directory"
    elif problem == "truncated":
        (path / MANIFEST).write_text('{"format": "trajforge-dat')
        expected = "manifest is truncated"
    else:
        pq.write_table(pa.table({"a": [1]}), dataset.shard_files()[0])
        expected = "foreign Parquet schema"
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "stats", str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], proc.stderr


def test_stats_counts_the_episodes_a_simulated_user_broke(tmp_path):
    """Why an export is empty: episodes kept but marked broken by the user check (`on_broken: mark`)."""
    broken = {"ok": False, "turns": [{"step": 2, "label": "leaked_goal", "by": "rule", "reason": "r"}], "checked": 1,
              "broken": 1}
    fine = {"ok": True, "turns": [], "checked": 1, "broken": 0}
    ds = Dataset.create(tmp_path / "ds", stage="test")
    with ds.unit("u0") as unit:
        for i, fidelity in enumerate([broken, broken, fine, None]):
            record = tool_trajectory(i)
            if fidelity is not None:
                record = record.model_copy(update={"details": {"user_fidelity": fidelity}})
            unit.write("trajectories", record)
    result = runner.invoke(app, ["stats", str(ds.path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["user_fidelity"] == {"checked": 3, "broken": 2}
    result = runner.invoke(app, ["stats", str(ds.path)])
    assert result.exit_code == 0
    assert "simulated user: checked 3 broken 2" in " ".join(result.output.split())
