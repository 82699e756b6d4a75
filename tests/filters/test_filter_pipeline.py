"""The Beam filter pipeline end to end through the CLI: counts add up, nothing vanishes, re-runs skip."""

from __future__ import annotations

import orjson
import yaml
from typer.testing import CliRunner

from filters.base import BaseFilter, register
from flows.cli import app
from pipelines.filter import run_filter
from schemas.models import ApiAction, MessageAction
from schemas.store import Dataset
from tests.filters.conftest import llm_config, make_dataset, records


@register("test_explode")
class Explode(BaseFilter):
    """Raises on record test/5, to check that a crashing filter quarantines instead of failing."""

    def decide(self, record):
        if record.id == "test/5":
            raise RuntimeError("boom")
        from filters.base import keep

        return keep(record)


def _bad_inputs():
    recs = records(10)
    recs[0].steps[1] = ApiAction(function="search", arguments={}, tool_call_id="call_0")
    recs[4].steps[3] = MessageAction(content="reach me at x@y.com")
    recs[6].steps = recs[6].steps[:3]
    return recs


def _check_balanced(out):
    ds = Dataset.open(out)
    m = ds.manifest()
    assert m["complete"]
    c = m["counts"]
    assert c["in"] == c["kept"] + c["filtered"] + c["quarantined"]
    assert ds.count("trajectories") == c["kept"]
    assert ds.count("filtered") == c["filtered"]
    assert ds.count("quarantine") == c["quarantined"]
    for unit in m["units"].values():
        uc = unit["counts"]
        assert uc["in"] == uc.get("kept", 0) + uc.get("filtered", 0) + uc.get("quarantined", 0)
    return c


def test_cli_filter_end_to_end_and_idempotent_rerun(tmp_path):
    make_dataset(tmp_path / "in", _bad_inputs())
    config = tmp_path / "filters.yaml"
    config.write_text(yaml.safe_dump([
        {"name": "well_formed"}, {"name": "tool_calls_valid"}, {"name": "pii", "mode": "scrub"},
        {"name": "test_explode"}, {"name": "final_answer"}, {"name": "max_step_tokens", "max_tokens": 4096},
    ]))
    args = ["filter", str(tmp_path / "in"), "--config", str(config), "--output", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "in 10 = kept 7 + filtered 2 + quarantined 1" in result.output
    c = _check_balanced(tmp_path / "out")
    assert c["filtered:tool_calls_valid"] == 1 and c["filtered:final_answer"] == 1
    out = Dataset.open(tmp_path / "out")
    reasons = {f.record.id: (f.decision.filter, f.decision.reason) for f in out.iter_records("filtered")}
    assert reasons == {"test/0": ("tool_calls_valid", "missing argument 'query' for 'search'"),
                       "test/6": ("final_answer", "no final answer: last action is api call 'search'")}
    q = list(out.iter_records("quarantine"))
    assert [(x.id, x.stage) for x in q] == [("test/5", "filter")]
    assert "RuntimeError: boom" in q[0].error and orjson.loads(q[0].raw)["id"] == "test/5"
    scrubbed = {t.id: t for t in out.iter_records()}["test/4"]
    assert scrubbed.steps[3].content == "reach me at <EMAIL>" and scrubbed.details["pii"]["scrubbed"] == 1
    units = out.manifest()["units"]
    assert len(units) == 3  # one unit per input shard

    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "(0/3 shards run" in again.output
    assert Dataset.open(tmp_path / "out").manifest()["units"] == units
    assert _check_balanced(tmp_path / "out") == c


def test_resume_after_lost_unit_and_config_change(tmp_path):
    make_dataset(tmp_path / "in", records(8))
    cfg = "- {name: final_answer}\n"
    run_filter(str(tmp_path / "in"), cfg, str(tmp_path / "out"))
    ds = Dataset.open(tmp_path / "out")
    manifest = ds.manifest()
    first = sorted(manifest["units"])[0]
    del manifest["units"][first]  # as if the run had been killed before this unit committed
    ds._write_manifest(manifest)
    s = run_filter(str(tmp_path / "in"), cfg, str(tmp_path / "out"))
    assert s.shards_done == 1 and s.counts["in"] == 8 and s.counts["kept"] == 8
    result = CliRunner().invoke(app, ["filter", str(tmp_path / "in"), "-c", str(_write(tmp_path, "- {name: pii}\n")),
                                      "-o", str(tmp_path / "out")])
    assert result.exit_code == 1 and "config hash" in result.output


def _write(tmp_path, text):
    p = tmp_path / "other.yaml"
    p.write_text(text)
    return p


def test_pipeline_with_judge_quarantines_failed_judgements(tmp_path, judge_server):
    make_dataset(tmp_path / "in", records(6), per_unit=3)
    cfg = [{"name": "well_formed"}, {"name": "quality_judge", "min_score": 3, "llm": llm_config(judge_server)}]
    s = run_filter(str(tmp_path / "in"), cfg, str(tmp_path / "out"), concurrency=4)
    c = _check_balanced(tmp_path / "out")
    assert (c["in"], c["kept"], c["filtered"], c["quarantined"]) == (6, 4, 1, 1)
    assert c["quarantined:judge"] == 1 and s.balanced
    out = Dataset.open(tmp_path / "out")
    kept = list(out.iter_records())
    assert all(t.details["judge"]["quality"]["score"] == 4 for t in kept)
    [q] = list(out.iter_records("quarantine"))
    assert q.id == "test/3" and q.stage == "judge"


def test_cli_reports_bad_config(tmp_path):
    make_dataset(tmp_path / "in", records(2))
    result = CliRunner().invoke(app, ["filter", str(tmp_path / "in"), "-c", str(_write(tmp_path, "- {name: nope}\n")),
                                      "-o", str(tmp_path / "out")])
    assert result.exit_code == 1 and "unknown filter 'nope'" in result.output
