"""Whole jobs: a faulty 1,000-request run loses nothing; a killed run resumes without repeats."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from backends import LLMConfig, LLMRequestError, make_llm

REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("resume_job.py")


def test_1000_requests_with_20pct_faults_all_accounted(fake_server, client, tmp_path):
    srv = fake_server(fault_rate=0.2, stall_s=1.0, retry_after=0.001, seed=7)
    ledger = tmp_path / "ledger.jsonl"

    async def go():
        async with client(
            srv, max_concurrency=64, min_concurrency=16, request_timeout_s=0.25, max_retries=2,
            ledger_path=str(ledger), cache_path=str(tmp_path / "c.sqlite"),
        ) as llm:
            async def one(i):
                try:
                    return (await llm.chat([{"role": "user", "content": f"job {i}"}]))[0]
                except LLMRequestError as exc:
                    return exc

            return await asyncio.gather(*(one(i) for i in range(1000))), llm.stats

    results, stats = asyncio.run(go())
    answered = [r for r in results if not isinstance(r, Exception)]
    failed = [r for r in results if isinstance(r, LLMRequestError)]
    ledger_lines = ledger.read_text().splitlines()
    assert len(answered) + len(failed) == 1000
    assert len(ledger_lines) == len(failed) == stats.failures
    assert {json.loads(line)["key"] for line in ledger_lines} == {e.key for e in failed}
    assert len(answered) >= 950
    outcomes = collections.Counter(e["outcome"] for e in srv.log)
    for kind in ("429", "500", "stall", "malformed", "truncated", "disconnect"):
        assert outcomes[kind] > 0, f"fault {kind} was never injected: {outcomes}"
    assert stats.retries > 100


def _cached_prompts(base_url: str, cache: Path, prompts: list[str]) -> set[str]:
    """Which prompts a job with this config finds in the cache (same key builder as the job)."""
    cfg = LLMConfig(backend="openai", model="fake-model", base_url=base_url, api_key_env=None, cache_path=str(cache))
    llm = make_llm(cfg)
    try:
        return {
            p for p in prompts
            if llm.cache.get(llm.request_key(llm._build([{"role": "user", "content": p}], None, None, 1, {}, None)))
        }
    finally:
        llm.cache.close()


def test_killed_job_resumes_without_repeating_completed_requests(fake_server, tmp_path):
    n = 200
    prompts = [f"item {i}" for i in range(n)]
    srv = fake_server(latency=0.03)
    cache, out = tmp_path / "cache.sqlite", tmp_path / "out.json"
    cmd = [sys.executable, str(JOB), srv.base_url, str(cache), str(out), str(n)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    proc = subprocess.Popen(cmd, env=env)
    deadline = time.time() + 30
    while sum(e["outcome"] == "ok" for e in srv.log) < 60:
        assert time.time() < deadline and proc.poll() is None, "job ended before it could be killed"
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    first_run = len(srv.log)
    time.sleep(0.1)  # let in-flight server handlers finish logging
    done_before = _cached_prompts(srv.base_url, cache, prompts)
    assert 50 <= len(done_before) < n

    subprocess.run(cmd, env=env, check=True, timeout=60)
    second = srv.log[first_run:]
    asked_again = {e["body"]["messages"][-1]["content"] for e in second}
    assert not (asked_again & done_before), "a request completed before the kill was sent again"
    assert asked_again | done_before == set(prompts)
    # Only calls in flight at the kill may have been answered twice (at most max_concurrency=8).
    ok_counts = collections.Counter(e["body"]["messages"][-1]["content"] for e in srv.log if e["outcome"] == "ok")
    assert sum(c - 1 for c in ok_counts.values()) <= 8
    results = json.loads(out.read_text())
    assert results == {p: f"echo[0]: {p}" for p in prompts}

    # A third run over a finished job asks the server nothing.
    before = len(srv.log)
    subprocess.run(cmd, env=env, check=True, timeout=60)
    assert len(srv.log) == before
