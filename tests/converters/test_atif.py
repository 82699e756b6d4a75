"""ATIF in and out: `trajforge convert --source atif` and `trajforge export --format atif`, round trips of
ATIF files written from the RFC's field list and of trajectories trajforge generated."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from converters.export import ExportConfig, export
from flows.cli import app
from schemas.models import (ApiAction, CodeAction, ImageObservation, ImageRef, JsonObservation, MessageAction,
                            TextObservation, Trajectory, WebObservation)
from schemas.store import Dataset
from tests.cli_errors import one_error_line
from tests.conftest import REPO
from tests.factories import SEARCH_TOOL, tool_trajectory

FIXTURES = REPO / "tests" / "converters" / "fixtures" / "atif"
FILES = [FIXTURES / "weather_multi_tool.json", FIXTURES / "subagent_system.json", FIXTURES / "minimal.jsonl"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=REPO, env={**os.environ},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _in_process(*args: str) -> str:
    """The same command line through the CLI app in this process (no interpreter start)."""
    done = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    return done.output


def _originals() -> dict[str, dict]:
    rows = [json.loads(FILES[0].read_text()), json.loads(FILES[1].read_text())]
    rows += [json.loads(line) for line in FILES[2].read_text().splitlines()]
    return {r["session_id"]: r for r in rows}


def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(glob.glob(str(out / "data" / "*.jsonl")))
            for line in Path(f).read_text().splitlines()]


def test_cli_converts_atif_files_and_exports_them_back_unchanged(tmp_path: Path) -> None:
    done = _cli("convert", "--source", "atif", *[a for f in FILES for a in ("--input", str(f))],
                "--output", str(tmp_path / "ds"))
    assert "in 5 = out 4 + quarantined 1" in done.stdout
    ds = Dataset.open(tmp_path / "ds")
    (bad,) = list(ds.iter_records("quarantine"))
    assert "record 'broken-1': `steps[0].source` is 'robot', expected one of system, user, agent" in bad.error
    records = {t.provenance.source_id: t for t in ds.iter_records()}
    weather = records["7c1e2f0a-weather-001"]
    assert weather.provenance.source_format == "ATIF-v1.4" and weather.provenance.model == "example-model-large"
    kinds = [(s.kind, getattr(s, "source", None), getattr(s, "name", None)) for s in weather.steps]
    assert kinds == [("text", "environment", "system"), ("text", "user", None), ("api", None, None), ("api", None, None),
                     ("text", "environment", "get_forecast"), ("text", "environment", "get_forecast"),
                     ("message", None, None)]
    first_call, second_call = weather.steps[2], weather.steps[3]
    assert first_call.thought == "I'll check the forecast for both cities." and first_call.reasoning.startswith("Two")
    assert (first_call.tool_call_id, second_call.arguments) == ("call_lis", {"city": "Porto", "day": "tomorrow"})
    assert weather.steps[5].tool_call_id == "call_opo" and weather.steps[5].content.startswith("Porto tomorrow")
    assert weather.steps[0].train is False
    metrics = weather.steps[6].extra["atif"]["metrics"]  # kept whole: tokens, cost, token ids, logprobs, extras
    assert metrics["cached_tokens"] == 256 and metrics["logprobs"] == [-0.01, -0.2, -0.03]
    usage = weather.steps[6].usage  # the step's own usage: what run summaries, cards and evals sum
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cost_usd) == (
        metrics["prompt_tokens"], metrics["completion_tokens"], metrics.get("cost_usd"))
    assert usage.prompt_tokens and weather.steps[1].usage is None  # a user turn has none
    assert weather.details["atif"]["final_metrics"]["total_cost_usd"] == 0.0021
    sub = records["repo-fix-42"]
    ref = next(s for s in sub.steps if s.tool_call_id == "t2" and s.kind == "text")
    assert ref.name == "delegate" and ref.extra["atif"]["result"]["subagent_trajectory_ref"][0]["session_id"] == \
        "repo-fix-42-sub-1"

    _in_process("export", str(tmp_path / "ds"), "--format", "atif", "--output", str(tmp_path / "atif"))
    back = {r["session_id"]: r for r in _lines(tmp_path / "atif")}
    originals = _originals()
    assert set(back) == set(originals) - {"broken-1"}
    for session, row in back.items():
        assert row == originals[session], session
    assert "ATIF" in (tmp_path / "atif" / "README.md").read_text()


def _hand_made() -> list[Trajectory]:
    """Steps ATIF has no kind for, masks, labels, rewards, failed steps and parallel calls."""
    base = tool_trajectory(7, masked=(1,))
    base.steps[1].label = "bad"
    base.steps[3].reward = 0.5
    odd = Trajectory(
        id="hand/odd", source="hand", tools=[SEARCH_TOOL], reward=0.25, success=False,
        steps=[TextObservation(content="You are a web agent.", source="environment", name="system", train=False),
               TextObservation(content="Open the shop and count items.", source="user"),
               WebObservation(url="http://shop.test/", axtree="[1] link 'Items'", html="<a>Items</a>"),
               TextObservation(content="<tool_call>{broken", source="agent", train=False, label="bad",
                               extra={"parse_error": "not JSON"}),
               TextObservation(content="Error: unreadable", source="environment", name="parse_error", train=False),
               ApiAction(function="search", arguments={"query": "a"}, tool_call_id="c1", thought="Two lookups."),
               ApiAction(function="search", arguments={"query": "b"}, tool_call_id="c2"),
               JsonObservation(content={"hits": 2}, name="search", tool_call_id="c1"),
               TextObservation(content="3 hits", source="environment", name="search", tool_call_id="c2"),
               CodeAction(language="python", content="print(2 + 3)", thought="Add them."),
               TextObservation(content="5", source="environment"),
               ImageObservation(image=ImageRef(path="shots/1.png")),
               MessageAction(content="There are 5 items.", reasoning="2 + 3", extra={"kind": "revision"})],
        details={"evaluation": {"reward": 0.25, "reason": "partial"}})
    return [base, odd]


def _mcts_records(tmp_path: Path) -> list[Trajectory]:
    """Spliced and masked trajectories from a real search (Agent-R on retail, the scripted agent)."""
    from envs.spec import EnvFactory
    from generators.registry import get_method
    from generators.runner import load_config
    from generators.scripted import ScriptedRetailLLM

    cfg = load_config({"method": "mcts_splice", "env": "retail", "env_config": {"seed": 0}, "tasks": {"n": 1},
                       "verifier": "rules", "revision": "template", "concurrency": 1,
                       "search": {"iterations": 2, "generations": 3, "max_depth": 4},
                       "llm": {"backend": "fake", "model": "scripted"}})
    ds = Dataset.create(tmp_path / "mcts", stage="test")
    method = get_method(cfg.method)(cfg, ScriptedRetailLLM(EnvFactory(cfg).tasks()))
    asyncio.run(method.run(method.tasks(), ds))
    return list(ds.iter_records())


def test_generated_trajectories_survive_export_as_atif_and_conversion_back(tmp_path: Path) -> None:
    originals = _mcts_records(tmp_path) + _hand_made()
    assert any(not s.train for t in originals for s in t.steps) and any(t.id.endswith("/spliced") for t in originals)
    ds = Dataset.create(tmp_path / "in", stage="test")
    with ds.unit("u") as u:
        u.write_many("trajectories", originals)
    ds.mark_complete({})
    report = export(tmp_path / "in", tmp_path / "atif", ExportConfig(format="atif"))
    assert report.records_exported == len(originals)  # an interchange format: failed trajectories too
    lines = _lines(tmp_path / "atif")
    odd = next(r for r in lines if r["session_id"] == "hand/odd")
    assert [s["source"] for s in odd["steps"]] == ["system", "user", "system", "agent", "agent", "agent", "agent"]
    assert [c["function_name"] for c in odd["steps"][4]["tool_calls"]] == ["search", "search"]
    assert [r["source_call_id"] for r in odd["steps"][4]["observation"]["results"]] == ["c1", "c2"]
    assert odd["steps"][5]["tool_calls"][0] == {"tool_call_id": "call_6_0", "function_name": "python",
                                                "arguments": {"code": "print(2 + 3)"}}
    assert odd["agent"] == {"name": "hand", "version": "unknown"} and odd["schema_version"] == "ATIF-v1.4"

    source = tmp_path / "atif.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    _in_process("convert", "--source", "atif", "--input", str(source), "--output", str(tmp_path / "back"))
    back = {t.id: t for t in Dataset.open(tmp_path / "back").iter_records()}
    assert set(back) == {t.id for t in originals}
    for original in originals:
        again = back[original.id]
        assert again.model_dump(mode="json") == original.model_dump(mode="json"), original.id


def test_sources_and_export_help_list_atif() -> None:
    runner = CliRunner()
    sources = runner.invoke(app, ["sources"], env={"COLUMNS": "200"})
    assert sources.exit_code == 0 and "atif" in sources.output and "harbor ATIF" in sources.output
    helped = runner.invoke(app, ["export", "--help"], env={"COLUMNS": "200"})
    assert helped.exit_code == 0 and "atif" in helped.output


def test_a_line_with_a_utf8_byte_order_mark_is_read(tmp_path: Path) -> None:
    valid = FILES[2].read_text().splitlines()[:2]
    source = tmp_path / "bom.jsonl"
    source.write_bytes("\ufeff".encode() + "\n".join(valid).encode() + b"\n")  # as Windows tools write it
    out = _in_process("convert", "--source", "atif", "--input", str(source), "--output", str(tmp_path / "ds"))
    assert "in 2 = out 2 + quarantined 0" in out
    assert {t.provenance.source_id for t in Dataset.open(tmp_path / "ds").iter_records()} == {"min-1", "min-2"}


def test_convert_fails_when_every_record_was_quarantined(tmp_path: Path, adp_dir: Path) -> None:
    adp = adp_dir / "agenttuning_os" / "sample_std.json"
    n = len(json.loads(adp.read_text()))
    result = CliRunner().invoke(app, ["convert", "--source", "atif", "--input", str(adp), "--output",
                                      str(tmp_path / "ds")], env={"COLUMNS": "200"})
    one_error_line(result, f"all {n} records were quarantined", str(tmp_path / "ds" / "quarantine"))


def test_export_as_atif_says_how_to_read_it_not_to_train_it(tmp_path: Path) -> None:
    ds = Dataset.create(tmp_path / "in", stage="test")
    with ds.unit("u") as u:
        u.write_many("trajectories", [tool_trajectory()])
    ds.mark_complete({})
    out = _in_process("export", str(tmp_path / "in"), "--format", "atif", "--output", str(tmp_path / "atif"))
    assert "train with" not in out and "not a training format" in out
    assert "trajforge convert --source atif --input" in out
