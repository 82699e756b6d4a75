"""The API key reaches no output of any stage: data, cache, ledger, state, logs, console, Prefect.

tests/backends/test_secrets.py covers the LLM layer on its own. Here every stage runs with a
key in the environment against a server that sends it and echoes it back in error bodies (as
hosted APIs do on a 401): the pipeline flow in process (convert, generate, an LLM judge
filter, dedup, mix, export, with its Prefect artifacts and logs), then the same stages
through the CLI.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from backends.fake_server import Fault, FakeServer, Rule
from tests.conftest import REPO
from tests.reliability._jobs import body_ref, retail_agent

KEY_ENV = "TRAJFORGE_RELIABILITY_KEY"
ADP = REPO / "samples" / "adp" / "agenttuning_os" / "sample_std.json"


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    value = f"sk-trajforge-SECRET-{secrets.token_hex(12)}"
    monkeypatch.setenv(KEY_ENV, value)
    return value


def _server(key: str) -> FakeServer:
    """Agent and judge answers; about one request in five is refused with the key in the error body."""
    def refuse(body: dict[str, Any]) -> Any:
        if int(body_ref(body), 16) % 5 == 0:
            return Fault("401", message=f"Incorrect API key provided: {key}")
        return None

    def judge(body: dict[str, Any]) -> Any:
        return {"score": 4, "reason": "fine"} if not body.get("tools") else None

    return FakeServer(rules=[Rule(fn=refuse), Rule(fn=retail_agent), Rule(fn=judge)])


def _llm(server: FakeServer, **extra: Any) -> dict[str, Any]:
    return {"backend": "openai", "base_url": server.base_url, "model": "fake-model", "api_key_env": KEY_ENV,
            "max_retries": 1, "backoff_base_s": 0.001, "request_timeout_s": 10, **extra}


def _judge_chain(server: FakeServer, cache: Path) -> list[dict[str, Any]]:
    return [{"name": "well_formed", "require_action": False},
            {"name": "quality_judge", "min_score": 3, "on_failure": "quarantine",
             "llm": _llm(server, cache_path=str(cache), ledger_path=str(cache.with_suffix(".ledger.jsonl")))}]


def _leaks(root: Path, key: str) -> list[str]:
    needle = key.encode()
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _assert_key_was_used(server: FakeServer) -> None:
    requests = [e for e in server.log if "body" in e]
    assert requests and all(e["has_auth"] for e in requests), "the key was not sent"
    assert any(e["outcome"] == "401" for e in requests), "no error body echoed the key"


async def _prefect_texts(flow_run_id: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId

    async with get_client() as client:
        arts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
        logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return [str(a.data) + str(a.description) for a in arts] + [log.message for log in logs]


def test_pipeline_flow_leaks_no_key(tmp_path, key, prefect_api, capfd, caplog):
    import json

    from flows.pipeline import pipeline_flow

    caplog.set_level("DEBUG")
    out = tmp_path / "out"
    with _server(key) as server:
        config = tmp_path / "pipeline.yaml"
        config.write_text(yaml.safe_dump({
            "output": str(out), "llm": _llm(server), "retries": 0,
            "convert": [{"name": "adp", "source": "adp", "inputs": [str(ADP)]}],
            "generate": [{"name": "rollout", "method": "rollout", "env": "retail", "env_config": {"seed": 0},
                          "tasks": {"n": 6}, "max_steps": 3, "keep_failed": True, "unit_tasks": 2, "concurrency": 2}],
            "filter": {"chain": _judge_chain(server, out / "judge_cache.sqlite")},
            "dedup": {"threshold": 0.9},
            "mix": {"weights": {"adp": 1.0, "rollout": 1.0}, "seed": 0},
            "export": ["trl-sft", "openai"],
        }))
        result = pipeline_flow(str(config))
        _assert_key_was_used(server)
        assert key not in str(server.log)

    stages = {(r["stage"], r["name"]) for r in result["stages"]}
    assert {("filter", "rollout"), ("dedup", "adp"), ("mix", "mix"), ("export", "mix-openai")} <= stages
    gen_quarantine = [r for r in result["stages"] if r["stage"] == "generate"][0]["counts"].get("quarantine", 0)
    assert gen_quarantine > 0, "no generation request failed: the redaction of failures was not exercised"
    assert (out / "generate" / "rollout" / "_llm_ledger.jsonl").read_text().strip()
    assert (out / "judge_cache.sqlite").exists() and (out / "generate" / "rollout" / "_llm_cache.sqlite").exists()

    assert not _leaks(tmp_path, key), "the key is in these files"
    captured = capfd.readouterr()
    assert key not in captured.out + captured.err and key not in caplog.text
    run_id = json.loads((out / "_runs.jsonl").read_text().splitlines()[-1])["flow_run_id"]
    texts = asyncio.run(_prefect_texts(run_id))
    assert any("trajforge pipeline" in t for t in texts), "no artifact of the run was found"
    assert not [t for t in texts if key in t], "the key is in a Prefect artifact or log"


def test_cli_stages_leak_no_key(tmp_path, key, caplog):
    from flows.cli import app

    caplog.set_level("DEBUG")
    runner = CliRunner()
    outputs: list[str] = []

    def cli(*args: str) -> None:
        result = runner.invoke(app, [str(a) for a in args])
        outputs.append(result.output)
        assert result.exit_code == 0, result.output[-2000:]

    with _server(key) as server:
        gen_cfg, chain = tmp_path / "rollout.yaml", tmp_path / "filters.yaml"
        gen_cfg.write_text(yaml.safe_dump({
            "method": "rollout", "env": "retail", "env_config": {"seed": 0}, "tasks": {"n": 6}, "max_steps": 3,
            "keep_failed": True, "unit_tasks": 2, "concurrency": 2, "llm": _llm(server)}))
        chain.write_text(yaml.safe_dump(_judge_chain(server, tmp_path / "judge_cache.sqlite")))
        cli("convert", "--source", "adp", "--input", ADP, "--output", tmp_path / "adp")
        cli("generate", "--method", "rollout", "--config", gen_cfg, "--output", tmp_path / "gen")
        cli("filter", tmp_path / "gen", "--config", chain, "--output", tmp_path / "filtered")
        _assert_key_was_used(server)
    cli("dedup", tmp_path / "filtered", "--output", tmp_path / "dedup")
    cli("mix", tmp_path / "dedup", tmp_path / "adp", "--output", tmp_path / "mix")
    cli("export", tmp_path / "mix", "--format", "trl-sft", "--output", tmp_path / "export")
    cli("stats", tmp_path / "gen")
    cli("validate", tmp_path / "filtered")

    assert "quarantined" in outputs[1] and (tmp_path / "gen" / "_llm_ledger.jsonl").read_text().strip()
    assert not [o for o in outputs if key in o], "the key was printed"
    assert key not in caplog.text
    assert not _leaks(tmp_path, key), "the key is in these files"
