"""Truncated answers are not training data: `trajforge fake-server --faults truncated` against a rollout job.

An answer cut short (finish_reason=length) is retried within the retry budget; one still cut after
that is recorded as a failed step (train=false) and counted by reason, never stored as a trainable
step. Also: `--stall-s` sets how long a stall fault lasts.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from schemas.store import Dataset
from tests.conftest import REPO


def _fake_server(*args: str, log: Path) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "fake-server", "--port", "0", "--log-jsonl", str(log),
                             *args], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("fake-server listening on "), line
        yield line.split()[-1]
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def truncating_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    log = tmp_path / "requests.jsonl"
    for url in _fake_server("--faults", "truncated", "--fault-rate", "0.4", "--seed", "7", log=log):
        yield url, log


def test_truncated_answers_are_retried_then_recorded_as_failed_untrainable_steps(tmp_path, truncating_server):
    base_url, log = truncating_server
    config = tmp_path / "rollout.yaml"
    config.write_text(yaml.safe_dump({
        "env": "retail", "tasks": {"n": 24}, "max_steps": 1, "max_parse_failures": 1, "agent_mode": "text",
        "keep_failed": True, "concurrency": 4, "unit_tasks": 8,
        "llm": {"backend": "openai", "base_url": base_url, "model": "fake-model", "api_key_env": None,
                "max_retries": 1, "backoff_base_s": 0.001, "request_timeout_s": 10},
    }))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["generate", "--method", "rollout", "--config", str(config), "--output", str(out)])
    assert result.exit_code == 0, result.output

    outcomes = Counter(orjson.loads(line)["outcome"] for line in log.read_text().splitlines())
    assert outcomes["truncated"] > 0 and outcomes["ok"] > 0, outcomes
    ds = Dataset.open(out)
    trajectories = list(ds.iter_records())
    assert len(trajectories) == 24
    failed_truncated = trainable_cut = whole = 0
    for t in trajectories:
        instruction = t.steps[1].content  # after the system prompt
        for step in t.steps[2:]:
            if step.kind == "message" and step.train:
                # A whole answer of the fake server echoes the whole request.
                if step.content != f"echo[0]: {instruction}":
                    trainable_cut += 1
                whole += 1
            elif step.kind == "text" and step.source == "agent":
                assert step.train is False and step.label == "bad"
                assert step.extra["parse_error"].startswith("truncated answer"), step.extra
                assert instruction.startswith(step.content.removeprefix("echo[0]: ")) and len(step.content) < len(
                    f"echo[0]: {instruction}")
                failed_truncated += 1
    assert trainable_cut == 0, "a cut answer was stored as a trainable step"
    assert failed_truncated > 0 and whole > 0
    # Retried first: more answers were cut than were finally recorded as cut (a retry fixed the rest).
    assert outcomes["truncated"] > failed_truncated
    counts = ds.manifest()["counts"]
    assert counts["failed_step:truncated"] == failed_truncated
    shown = " ".join(result.output.replace("│", " ").split())
    assert f"LLM truncated {failed_truncated}" in shown and f"failed steps (truncated answer) {failed_truncated}" in shown


def test_stall_faults_last_as_long_as_asked(tmp_path):
    import asyncio

    from backends.config import LLMConfig
    from backends.registry import make_llm

    for url in _fake_server("--faults", "stall", "--fault-rate", "1", "--stall-s", "0.3", log=tmp_path / "log.jsonl"):
        async def ask() -> str:
            async with make_llm(LLMConfig(backend="openai", base_url=url, api_key_env=None, max_retries=0,
                                          request_timeout_s=10)) as llm:
                return (await llm.chat([{"role": "user", "content": "ping"}]))[0].text

        started = time.monotonic()
        assert "ping" in asyncio.run(ask())
        assert 0.3 <= time.monotonic() - started < 5


def test_fake_server_refuses_unknown_fault_kinds():
    result = CliRunner().invoke(app, ["fake-server", "--faults", "truncated,explode"])
    assert result.exit_code == 1 and "unknown fault kind(s) explode" in result.output


def test_unusable_answers_in_tools_mode_are_failed_steps_with_usage_and_no_task_is_lost(tmp_path):
    """Cut, unparseable (garbage tool-call arguments) and refused (400 tool_use_failed) answers on the CLI path:
    each one still unusable after the retries is a failed step with its reason and its usage; every task
    writes its trajectory; the summary counts each failure once, the same in the records and the LLM counts."""
    log = tmp_path / "requests.jsonl"
    config = tmp_path / "rollout.yaml"
    out = tmp_path / "out"
    for base_url in _fake_server("--faults", "garbage,refused,truncated", "--fault-rate", "0.5", "--seed", "3",
                                 log=log):
        config.write_text(yaml.safe_dump({
            "env": "retail", "tasks": {"n": 12}, "max_steps": 2, "max_parse_failures": 3, "agent_mode": "tools",
            "keep_failed": True, "concurrency": 4, "unit_tasks": 6,
            "llm": {"backend": "openai", "base_url": base_url, "model": "fake-model", "api_key_env": None,
                    "max_retries": 0, "backoff_base_s": 0.001, "request_timeout_s": 10,
                    "price": {"prompt_per_million": 1.0, "completion_per_million": 2.0}},
        }))
        result = CliRunner().invoke(app, ["generate", "--method", "rollout", "--config", str(config),
                                          "--output", str(out)])
    assert result.exit_code == 0, result.output
    outcomes = Counter(orjson.loads(line)["outcome"] for line in log.read_text().splitlines())
    assert {"garbage", "refused", "truncated", "ok"} <= set(outcomes), outcomes

    ds = Dataset.open(out)
    assert not list(ds.iter_records("quarantine"))
    trajectories = list(ds.iter_records())
    assert len(trajectories) == 12
    failed: Counter[str] = Counter()
    for t in trajectories:
        made = [s for s in t.steps if s.usage is not None]
        for step in t.steps:
            if step.kind == "text" and step.source == "agent":
                assert step.train is False and step.label == "bad" and step.usage is not None
                failed[step.extra["parse_error"].split(" ")[0]] += 1
            elif step.kind in ("api", "message"):
                assert step.usage is not None and step.usage.model == "openai:fake-model"
                assert step.usage.prompt_tokens > 0 and step.usage.cost_usd > 0
        assert t.details["usage"]["calls"] == len(made)
        assert t.details["usage"]["prompt_tokens"] == sum(s.usage.prompt_tokens for s in made)
    assert failed["truncated"] and failed["unreadable"] and failed["refused"], failed
    counts = ds.manifest()["counts"]
    assert (counts["failed_step:truncated"], counts["failed_step:unreadable"], counts["failed_step:refused"]) == (
        failed["truncated"], failed["unreadable"], failed["refused"])
    run = ds.manifest()["last_run"]
    # One count per failure, wherever it is shown: the records, the manifest, the client's counts.
    assert run["llm"]["truncated"] == failed["truncated"]
    assert run["llm"]["unusable"] == failed["unreadable"] + failed["refused"]
    assert run["usage"]["calls"] == run["llm"]["requests"] == sum(t.details["usage"]["calls"] for t in trajectories)
    assert run["usage"]["prompt_tokens"] == run["llm"]["prompt_tokens"]
    assert run["usage"]["cost_usd"] == pytest.approx(run["llm"]["cost_usd"])
    assert run["success_rate"] == {"method": "rollout", "env": "retail", "successes": 0, "episodes": 12, "rate": 0.0}
    shown = " ".join(result.output.replace("│", " ").split())
    assert f"LLM truncated {failed['truncated']}" in shown and "successes (rollout on retail) 0 of 12 episodes" in shown
    assert f"failed steps (refused answer) {failed['refused']}" in shown and "price per million tokens" in shown
