"""One model on several servers: spread by free capacity, a dead server taken out, its requests
resent elsewhere (once), the server probed back in; per-endpoint counts in the summaries."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from backends import LLMConfig, LLMRequestError, make_llm
from backends.fake_server import Fault, FakeServer, Rule, spawn
from schemas.store import Dataset
from tests.conftest import REPO


def _endpoints_config(urls_caps: list[tuple[str, int]], **extra) -> LLMConfig:
    base = dict(backend="openai", model="fake-model", api_key_env=None, request_timeout_s=5.0, max_retries=0,
                backoff_base_s=0.001, backoff_max_s=0.01, endpoint_probe_s=0.3,
                endpoints=[{"base_url": u, "max_concurrency": c} for u, c in urls_caps])
    base.update(extra)
    return LLMConfig(**base)


def _ask(llm, prompt: str):
    return llm.chat([{"role": "user", "content": prompt}])


def test_config_rejects_endpoints_with_base_url_or_a_local_backend():
    with pytest.raises(ValueError, match="base_url or endpoints"):
        LLMConfig(base_url="http://a/v1", endpoints=[{"base_url": "http://b/v1"}])
    with pytest.raises(ValueError, match="openai backend"):
        LLMConfig(backend="llamacpp", endpoints=[{"base_url": "http://b/v1"}])
    with pytest.raises(ValueError, match="repeat"):
        LLMConfig(endpoints=[{"base_url": "http://b/v1"}, {"base_url": "http://b/v1/"}])


def test_requests_spread_by_free_capacity_and_weight(fake_server):
    # 0.2 s per answer: the servers' time, not the client's own per-request work, sets who is free first, on a
    # loaded machine too (at 0.05 s a full parallel test run once split 27/73 instead of about 20/80).
    small, big = fake_server(latency=0.2, capacity=2), fake_server(latency=0.2, capacity=8)

    async def go(cfg):
        async with make_llm(cfg) as llm:
            await asyncio.gather(*(_ask(llm, f"p{i}") for i in range(100)))
            return llm.stats

    stats = asyncio.run(go(_endpoints_config([(small.base_url, 2), (big.base_url, 8)])))
    assert small.max_in_flight == 2 and big.max_in_flight == 8  # both filled, neither overrun
    assert stats.endpoints[big.base_url].ok > 3 * stats.endpoints[small.base_url].ok
    assert not [e for s in (small, big) for e in s.log if e["outcome"] != "ok"]

    # Fewer requests than capacity: the weight decides the share (least load per unit of weight).
    a, b = fake_server(latency=0.05), fake_server(latency=0.05)
    cfg = _endpoints_config([(a.base_url, 8), (b.base_url, 8)])
    cfg = cfg.model_copy(update={"endpoints": [cfg.endpoints[0].model_copy(update={"weight": 3.0}), cfg.endpoints[1]]})

    async def trickle():
        async with make_llm(cfg) as llm:
            for round_ in range(10):
                await asyncio.gather(*(_ask(llm, f"w{round_}-{i}") for i in range(4)))

    asyncio.run(trickle())
    assert len(a.asked()) == 30 and len(b.asked()) == 10  # 3 of every 4 in flight go to the heavier one


def test_failing_server_taken_out_probed_back_in_and_requests_counted_once(fake_server, tmp_path):
    healthy = fake_server(latency=0.01)
    # Fails its first 5 answers (500), then recovers: 4 in flight at once take it out, a probe fails.
    flaky = fake_server(latency=0.01, rules=[Rule(answer=Fault("500"), times=5)])
    ledger, cache = tmp_path / "ledger.jsonl", tmp_path / "cache.sqlite"
    # The probe waits longer than the first 40 answers take on a loaded machine (parallel tests).
    cfg = _endpoints_config([(flaky.base_url, 4), (healthy.base_url, 4)], endpoint_failures=3, endpoint_probe_s=2.0,
                            ledger_path=str(ledger), cache_path=str(cache))

    async def go():
        async with make_llm(cfg) as llm:
            first = await asyncio.gather(*(_ask(llm, f"a{i}") for i in range(40)))
            out_after_first = llm.stats.endpoints[flaky.base_url].state
            deadline = time.monotonic() + 30
            second = []
            while llm.stats.endpoints[flaky.base_url].state != "live" or len(second) < 40:
                assert time.monotonic() < deadline, llm.stats
                second += await asyncio.gather(*(_ask(llm, f"b{len(second) + i}") for i in range(8)))
                await asyncio.sleep(0.05)
            return first, second, out_after_first, llm.stats, len(llm.cache)

    first, second, out_after_first, stats, cached = asyncio.run(go())
    ep = stats.endpoints[flaky.base_url]
    assert out_after_first in ("out", "probing")
    assert ep.taken_out >= 1 and ep.probes >= 1 and ep.state == "live" and ep.ok > 0  # back in, serving again
    assert ep.failed == 5 == ep.failed_over  # every failure went on to the healthy server at once
    assert stats.retries == 0 and stats.failures == 0 and not ledger.exists()  # max_retries=0: failover is no retry
    answers = [c[0].text for c in first + second]
    assert len(set(answers)) == len(answers) == cached == stats.requests  # each answered, cached once
    assert stats.calls == sum(e.calls for e in stats.endpoints.values()) == stats.requests + stats.failovers


def test_all_endpoints_down_ledgers_each_request_once(tmp_path):
    dead = [f"http://127.0.0.1:{_closed_port()}/v1" for _ in range(2)]
    ledger = tmp_path / "ledger.jsonl"
    cfg = _endpoints_config([(u, 4) for u in dead], max_retries=2, endpoint_failures=2, endpoint_probe_s=60,
                            ledger_path=str(ledger))

    async def go():
        async with make_llm(cfg) as llm:
            results = await asyncio.gather(*(_ask(llm, f"x{i}") for i in range(10)), return_exceptions=True)
            return results, llm.stats

    t0 = time.monotonic()
    results, stats = asyncio.run(go())
    assert time.monotonic() - t0 < 5  # taken out: no waiting on servers that are gone
    assert all(isinstance(r, LLMRequestError) and r.kind == "connection" for r in results)
    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert len(lines) == 10 == stats.failures and len({x["key"] for x in lines}) == 10
    assert all(e.taken_out == 1 and e.state == "out" for e in stats.endpoints.values())


def test_preflight_needs_one_answering_endpoint(fake_server):
    from backends.openai_backend import endpoint_problem

    live = fake_server()
    dead = [f"http://127.0.0.1:{_closed_port()}/v1" for _ in range(2)]
    assert endpoint_problem(_endpoints_config([(dead[0], 2), (live.base_url, 2)]), timeout_s=5) is None
    problem = endpoint_problem(_endpoints_config([(u, 2) for u in dead]), timeout_s=5)
    assert problem is not None and all(f"{u}: cannot reach the server" in problem for u in dead)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- three server processes, one killed mid-run and started again -----------------------------

LATENCY = 0.2
CAPS = (2, 4, 8)  # ideal rates 10 + 20 + 40 = 70 requests/s


def _ok_prompts(log: Path) -> list[str]:
    if not log.exists():
        return []
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [e["body"]["messages"][-1]["content"] for e in entries if e.get("outcome") == "ok"]


@pytest.mark.serial  # its throughput bound needs the machine to itself
def test_three_servers_one_killed_mid_run_then_restarted(tmp_path):
    logs = [tmp_path / f"server{i}.jsonl" for i in range(3)]
    procs, urls = [], []

    def start(i: int, *port: str) -> None:
        proc, url = spawn(*port, "--latency", str(LATENCY), "--capacity", str(CAPS[i]), "--log-jsonl", str(logs[i]),
                          cwd=str(REPO))
        procs[i:i + 1] = [proc]
        urls[i:i + 1] = [url]

    try:
        for i in range(3):
            start(i)
        ledger, cache = tmp_path / "ledger.jsonl", tmp_path / "cache.sqlite"
        cfg = _endpoints_config(list(zip(urls, CAPS)), endpoint_probe_s=0.3, endpoint_probe_max_s=0.6,
                                ledger_path=str(ledger), cache_path=str(cache))
        first, kill_at, second = 200, 70, 120
        marks: dict[str, float] = {}
        done_times: list[float] = []

        async def go():
            async with make_llm(cfg) as llm:
                async def one(i: int) -> str:
                    [c] = await _ask(llm, f"job {i}")
                    done_times.append(time.monotonic())
                    if len(done_times) == kill_at:
                        procs[2].kill()  # SIGKILL: its connections drop with requests in flight
                        marks["killed"] = time.monotonic()
                    if "restarted" in marks and "back" not in marks and llm.stats.endpoints[urls[2]].state == "live":
                        marks["back"] = time.monotonic()
                    return c.text

                marks["start"] = time.monotonic()
                answers = await asyncio.gather(*(one(i) for i in range(first)))
                marks["first_done"] = time.monotonic()
                out_meanwhile = llm.stats.endpoints[urls[2]].state
                # Started again on its port; the next request after the longest probe wait probes it.
                await asyncio.to_thread(start, 2, "--port", urls[2].rsplit(":", 1)[1].split("/")[0])
                await asyncio.sleep(0.7)
                marks["restarted"] = time.monotonic()
                answers += await asyncio.gather(*(one(i) for i in range(first, first + second)))
                marks["end"] = time.monotonic()
                return answers, out_meanwhile, llm.stats, len(llm.cache)

        answers, out_meanwhile, stats, cached = asyncio.run(go())
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()

    n = first + second
    # Nothing lost, nothing twice: every prompt answered once, cached once, nothing ledgered.
    assert answers == [f"echo[0]: job {i}" for i in range(n)]
    assert cached == n and stats.failures == 0 and stats.retries == 0 and not ledger.exists()
    served = [p for log in logs for p in _ok_prompts(log)]
    assert set(served) == {f"job {i}" for i in range(n)}
    # A server killed between logging an answer and sending it may have served one twice.
    assert len(served) - n <= CAPS[2]

    killed = stats.endpoints[urls[2]]
    assert out_meanwhile in ("out", "probing")
    assert killed.taken_out >= 1 and killed.probes >= 1 and killed.state == "live" and "back" in marks
    assert 1 <= killed.failed_over <= killed.failed
    assert stats.failovers == sum(e.failed_over for e in stats.endpoints.values())
    assert all(stats.endpoints[u].failed == 0 for u in urls[:2])

    # Throughput tracks the live capacity: all three, then two, then three again. Rates over whole
    # phases: answers come in bursts of a server's capacity every LATENCY seconds, which would make
    # the rate within a short window depend on where its edges fall.
    full, reduced = sum(CAPS) / LATENCY, sum(CAPS[:2]) / LATENCY
    after_back = sum(t > marks["back"] for t in done_times)
    phases = [
        ("all three", kill_at / (marks["killed"] - marks["start"]), full),
        ("one killed", (first - kill_at) / (marks["first_done"] - marks["killed"]), reduced),
        ("back", after_back / (marks["end"] - marks["back"]), full),
    ]
    for name, rate, ideal in phases:
        assert 0.7 * ideal <= rate <= 1.15 * ideal, f"{name}: {rate:.0f} req/s against {ideal:.0f} live capacity"


# ---- the command users run --------------------------------------------------------------------


def test_generate_over_two_endpoints_prints_per_endpoint_counts(tmp_path):
    from tests.generators.test_rollout import RetailScript, _retail_tasks

    tasks = _retail_tasks(3)
    secret = "sk-endpoint-secret-0123456789"
    with FakeServer(rules=[Rule(fn=RetailScript(tasks))]) as good, \
            FakeServer(rules=[Rule(answer=Fault("503"))]) as down:
        example = yaml.safe_load((REPO / "configs" / "rollout_retail.yaml").read_text())
        cfg = {**example, "tasks": {"source": "env", "n": 3, "seed": 0}, "llm": {
            "backend": "openai", "model": "fake-model", "api_key_env": None, "max_retries": 0,
            "request_timeout_s": 5, "endpoint_probe_s": 60,
            "endpoints": [{"base_url": down.base_url, "max_concurrency": 4, "api_key_env": "TF_DOWN_KEY"},
                          {"base_url": good.base_url, "max_concurrency": 4}]}}
        path = tmp_path / "rollout.yaml"
        path.write_text(yaml.safe_dump(cfg))
        out = tmp_path / "out"
        cmd = [sys.executable, "-m", "flows.cli", "generate", "--method", "rollout", "--config", str(path),
               "--output", str(out)]
        env = {**os.environ, "TF_DOWN_KEY": secret, "COLUMNS": "200"}
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert all(e["has_auth"] for e in down.log) and not any(e["has_auth"] for e in good.log)
    assert Dataset.open(out).count() == 3
    text = done.stdout + done.stderr
    assert secret not in text
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in done.stdout.splitlines() if "│ http://" in line}
    assert set(rows) == {down.base_url, good.base_url}
    # calls, ok, failed, failed over, taken out, probes, state
    assert rows[down.base_url][1] == "0" and rows[down.base_url][4] == "1" and rows[down.base_url][6] == "out"
    assert rows[good.base_url][2] == "0" and int(rows[good.base_url][1]) > 0
    # Taken out after 3 failures in a row (one more may have been in flight then), never probed in 60 s.
    assert set(collections.Counter(e["outcome"] for e in down.log)) == {"503"} and 3 <= len(down.log) <= 4
