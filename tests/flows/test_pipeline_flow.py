"""The Prefect pipeline flow end to end: fake LLM server, ADP samples, retail rollouts, TRL SFT export."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from backends.fake_server import FakeServer, Rule
from schemas.store import Dataset
from tests.conftest import REPO

SAMPLES = REPO / "samples" / "adp"
ADP_FILES = [SAMPLES / "agenttuning_os" / "sample_std.json", SAMPLES / "agenttuning_db" / "sample_std.json"]
DONE = "All done successfully. Is there anything else?"


def _agent(body: dict):
    return DONE if body.get("tools") else None


def _config(tmp: Path, base_url: str, n_tasks: int = 2, **extra) -> Path:
    cfg = {
        "output": str(tmp / "out"),
        "llm": {"backend": "openai", "base_url": base_url, "model": "fake-model", "api_key_env": "TRAJFORGE_TEST_KEY",
                "max_retries": 0, "backoff_base_s": 0.01, "request_timeout_s": 5},
        "convert": [{"name": "adp", "source": "adp", "inputs": [str(p) for p in ADP_FILES]}],
        "generate": [{"name": "rollout", "method": "rollout", "env": "retail", "env_config": {"seed": 0},
                      "tasks": {"n": n_tasks}, "max_steps": 3, "keep_failed": True, "unit_tasks": 1, "concurrency": 1}],
        "export": ["trl-sft"],
        **extra,
    }
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


async def _artifacts(flow_run_id: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async with get_client() as client:
        return await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))


def _runs(out: Path) -> list[dict]:
    f = out / "_runs.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def test_pipeline_flow_runs_every_stage_then_skips(prefect_harness, tmp_path):
    from flows.pipeline import pipeline_flow

    expected_adp = sum(len(json.loads(p.read_text())) for p in ADP_FILES)
    with FakeServer(rules=[Rule(fn=_agent)]) as server:
        config = _config(tmp_path, server.base_url)
        first = pipeline_flow(str(config))
        calls = len([e for e in server.log if "body" in e])
        second = pipeline_flow(str(config))
        assert len([e for e in server.log if "body" in e]) == calls  # no LLM call again
    out = tmp_path / "out"
    # The agent only says it is done, so both rollouts fail: their SFT export has no row, and the run
    # writes none (`datasets` could not load it), says why and goes on.
    empty = (f"skipped: nothing to export: none of the 2 trajectories of {out / 'generate' / 'rollout'} gives a "
             "trl-sft row (2 success = false (--include-failed keeps it))")
    assert [(r["stage"], r["name"], r["reason"]) for r in first["stages"]] == [
        ("convert", "adp", "ran"), ("generate", "rollout", "ran"),
        ("export", "adp-trl-sft", "ran"), ("export", "rollout-trl-sft", empty)]
    assert all(r["reason"].startswith("skipped") for r in second["stages"])
    assert [r["counts"] for r in second["stages"]] == [r["counts"] for r in first["stages"]]
    assert not (out / "export" / "rollout-trl-sft").exists()

    conv, gen = Dataset.open(out / "convert" / "adp"), Dataset.open(out / "generate" / "rollout")
    assert conv.complete and gen.complete
    assert conv.count() == first["stages"][0]["counts"]["out"] > 0
    assert first["stages"][0]["counts"]["in"] == expected_adp
    assert gen.count() == 2
    assert len(conv.ids()) == conv.count() and len(gen.ids()) == 2  # no duplicates after the re-run
    export = out / "export" / "adp-trl-sft"
    assert (export / "README.md").is_file() and list((export / "data").glob("train-*.parquet"))
    for name, ds in (("adp", conv), ("rollout", gen)):
        assert first["stages"][[r["name"] for r in first["stages"]].index(f"{name}-trl-sft")]["counts"]["in"] \
            == ds.count()

    # The summary's usage, cost and success rate (the fake server is a remote model without a price).
    from flows.run_summary import llm_cost, success_line, unusable_answers, usage_line

    generated = first["stages"][1]
    assert generated["counts"]["llm_prompt_tokens"] > 0 and generated["counts"]["llm_cost_usd"] is None
    assert success_line(generated) == "  generate rollout (rollout on retail): successes = 0 of 2 episodes (0.0%)"
    assert llm_cost(first["stages"]) == "unknown: no llm.price for this remote model"
    assert unusable_answers(first["stages"]) == "truncated answers 0, other unusable answers 0"
    assert f"tokens {generated['counts']['llm_prompt_tokens']:,} prompt" in usage_line(generated)

    runs = _runs(out)
    assert len(runs) == 2 and runs[0]["flow_run_id"] and runs[0]["flow_run_id"] != runs[1]["flow_run_id"]
    arts = asyncio.run(_artifacts(runs[0]["flow_run_id"]))
    by_key = {a.key: a for a in arts}
    summary = by_key["trajforge-pipeline-summary"]
    assert "| convert | adp | ran |" in summary.data and "| generate | rollout | ran |" in summary.data
    assert "(file://" in summary.data
    assert str(out / "export" / "adp-trl-sft") in by_key["trajforge-export-adp-trl-sft"].data
    assert "trajforge-export-rollout-trl-sft" not in by_key  # no link to an export that was not written
    again = asyncio.run(_artifacts(runs[1]["flow_run_id"]))
    assert any(a.key == "trajforge-pipeline-summary" and "skipped" in a.data for a in again)


def _env(api_url: str) -> dict:
    return {**os.environ, "PREFECT_API_URL": api_url, "TRAJFORGE_TEST_KEY": "x",
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _cli() -> list[str]:
    return [sys.executable, "-m", "flows.cli"]


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_killed_mid_generation_then_rerun_completes_without_duplicates(prefect_harness, tmp_path):
    from flows.pipeline import pipeline_flow

    with FakeServer(rules=[Rule(fn=_agent)], latency=0.5) as server:
        config = _config(tmp_path, server.base_url, n_tasks=6)
        gen = tmp_path / "out" / "generate" / "rollout"
        proc = subprocess.Popen([*_cli(), "run", str(config)], cwd=REPO, env=_env(prefect_harness),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.time() + 240  # generous: parallel tests load the machine
            while time.time() < deadline:  # wait until a unit is finished, then kill mid-generation
                if (gen / "_manifest.json").exists() and Dataset.open(gen).finished_units():
                    break
                assert proc.poll() is None, "trajforge run ended before it could be killed"
                time.sleep(0.2)
            else:
                pytest.fail("generation never finished a unit")
        finally:
            _kill(proc)
        assert not Dataset.open(gen).complete
        result = pipeline_flow(str(config))
    ds = Dataset.open(gen)
    assert ds.complete and ds.count() == 6 and len(ds.ids()) == 6
    assert [r["reason"] for r in result["stages"]][:2] == ["skipped: complete with the same config hash", "ran"]


def test_serve_runs_on_an_interval(prefect_server, tmp_path):
    with FakeServer(rules=[Rule(fn=_agent)]) as server:
        config = _config(tmp_path, server.base_url, n_tasks=1)
        out = tmp_path / "out"
        log = open(tmp_path / "serve.log", "wb")  # a file, not a pipe: a full pipe would block the server
        env = {**_env(prefect_server), "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
        proc = subprocess.Popen([*_cli(), "serve", str(config), "--interval", "5", "--name", "test-serve"],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.time() + 240  # a loaded machine (parallel tests) starts the server slowly
            while time.time() < deadline and not _runs(out):
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
                time.sleep(0.5)
        finally:
            _kill(proc)
            log.close()
    runs = _runs(out)
    assert runs, "no scheduled run finished within 240 s:\n" + (tmp_path / "serve.log").read_text()[-3000:]
    assert {s["stage"] for s in runs[0]["stages"]} == {"convert", "generate", "export"}
    run = asyncio.run(_flow_run(prefect_server, runs[0]["flow_run_id"]))
    deadline = time.time() + 60  # the flow writes its run line just before Prefect records it completed
    while not run.state.is_final() and time.time() < deadline:
        time.sleep(0.5)
        run = asyncio.run(_flow_run(prefect_server, runs[0]["flow_run_id"]))
    assert run.auto_scheduled and run.deployment_id is not None  # made by the schedule, not by hand
    assert run.state.is_completed()


async def _flow_run(api_url: str, flow_run_id: str):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}):
        async with get_client() as client:
            return await client.read_flow_run(flow_run_id)
