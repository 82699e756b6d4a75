"""`trajforge serve --pool`: the pipeline deployed to a Prefect work pool whose two process workers
(started with the docs' commands) run several flow runs at once, with different configs, one of
them twice. Every run completes, outputs are right, and concurrent runs share nothing they clash on."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

from backends.fake_server import FakeServer, Rule
from schemas.store import Dataset
from tests.conftest import REPO

POOL = "trajforge-pool"
SAMPLES = REPO / "samples" / "adp"
DONE = "All done successfully. Is there anything else?"
WAITING = "waiting for pipeline run "


def _agent(body: dict):
    return DONE if body.get("tools") else None


def _held_until_waited_on(logs: list[Path]):
    """The agent of config a: its first answer waits until the other run of a waits for the output's
    lock (a worker's log says so), so the two runs surely overlap."""
    def answer(body: dict):
        deadline = time.time() + 60
        while time.time() < deadline and not any(WAITING in log.read_text() for log in logs if log.exists()):
            time.sleep(0.2)
        return _agent(body)
    return answer


def _write(tmp: Path, name: str, cfg: dict) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _configs(tmp: Path, slow: str, fast: list[str], cache: Path) -> dict[str, Path]:
    llm = {"backend": "openai", "model": "fake-model", "api_key_env": None, "max_retries": 0,
           "request_timeout_s": 10, "cache_path": str(cache)}  # one response cache shared by all runs
    rollout = {"name": "rollout", "method": "rollout", "env": "retail", "max_steps": 2, "keep_failed": True,
               "unit_tasks": 1, "concurrency": 2}
    return {
        "a": _write(tmp, "a", {
            "output": str(tmp / "out-a"),
            "convert": [{"name": "adp", "source": "adp", "inputs": [str(SAMPLES / "agenttuning_os" / "sample_std.json")]}],
            "generate": [{**rollout, "tasks": {"n": 2}, "env_config": {"seed": 0}, "llm": {**llm, "base_url": slow}}]}),
        "b": _write(tmp, "b", {
            "output": str(tmp / "out-b"),
            "generate": [{**rollout, "tasks": {"n": 3, "seed": 1}, "env_config": {"seed": 1},
                          "llm": {**llm, "endpoints": [{"base_url": u, "max_concurrency": 2} for u in fast]}}]}),
        "c": _write(tmp, "c", {
            "output": str(tmp / "out-c"),
            "convert": [{"name": "db", "source": "adp", "inputs": [str(SAMPLES / "agenttuning_db" / "sample_std.json")]}]}),
    }


def _prefect(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prefect", *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)


async def _submit(api: str, deployment: str, configs: list[Path]) -> list[str]:
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}):
        runs = [await run_deployment(deployment, parameters={"config_path": str(c)}, timeout=0) for c in configs]
    return [str(r.id) for r in runs]


async def _states(api: str, ids: list[str]) -> dict[str, object]:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}):
        async with get_client() as client:
            return {i: await client.read_flow_run(i) for i in ids}


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the worker's session, then SIGKILL whatever of it (flow runs included) is left."""
    family = [proc, *psutil.Process(proc.pid).children(recursive=True)] if proc.poll() is None else []
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=15)
    psutil.wait_procs([p for p in family if isinstance(p, psutil.Process)], timeout=15)


def _runs(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "_runs.jsonl").read_text().splitlines()]


def test_two_workers_run_several_deployments_at_once_without_clashing(prefect_server, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_API_URL=prefect_server, PREFECT_HOME=str(tmp_path / "prefect-home"),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_WORKER_QUERY_SECONDS="1",
               PYTHONPATH=str(REPO), COLUMNS="200")
    cache = tmp_path / "shared-cache.sqlite"
    workers: list[subprocess.Popen] = []
    logs = [tmp_path / f"worker{i}.log" for i in (1, 2)]
    with FakeServer(rules=[Rule(fn=_held_until_waited_on(logs))]) as slow, \
            FakeServer(rules=[Rule(fn=_agent)]) as fast1, FakeServer(rules=[Rule(fn=_agent)]) as fast2:
        configs = _configs(tmp_path, slow.base_url, [fast1.base_url, fast2.base_url], cache)
        try:
            made = _prefect(["work-pool", "create", POOL, "--type", "process"], env, tmp_path)
            assert made.returncode == 0, made.stdout + made.stderr
            for i, log in enumerate(logs, 1):
                workers.append(subprocess.Popen(
                    [sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--limit", "2",
                     "--name", f"worker-{i}"], env=env, cwd=tmp_path, stdout=log.open("wb"),
                    stderr=subprocess.STDOUT, start_new_session=True))
            served = subprocess.run([sys.executable, "-m", "flows.cli", "serve", str(configs["a"]), "--pool", POOL,
                                     "--name", "nightly"], env=env, cwd=tmp_path, capture_output=True, text=True,
                                    timeout=120)
            assert served.returncode == 0, served.stdout + served.stderr
            assert "deployed trajforge-pipeline/nightly" in served.stdout
            order = [configs["a"], configs["b"], configs["a"], configs["c"]]
            ids = asyncio.run(_submit(prefect_server, "trajforge-pipeline/nightly", order))
            deadline = time.time() + 150
            while True:
                runs = asyncio.run(_states(prefect_server, ids))
                if all(r.state.is_final() for r in runs.values()):
                    break
                for w, log in zip(workers, logs):
                    assert w.poll() is None, log.read_text()[-3000:]
                assert time.time() < deadline, {i: r.state.name for i, r in runs.items()}
                time.sleep(1)
        finally:
            for w in workers:
                _stop(w)
        for w in workers:
            assert w.returncode is not None
        worker_logs = [log.read_text() for log in logs]
        assert all(r.state.is_completed() for r in runs.values()), (
            {i: r.state.message for i, r in runs.items()}, worker_logs[0][-3000:], worker_logs[1][-3000:])
        calls = len([e for s in (slow, fast1, fast2) for e in s.log if e["outcome"] == "ok"])

    # Both workers ran flow runs.
    ran_by = [set(re.findall(r"/runs/flow-run/([0-9a-f-]{36})", log)) & set(ids) for log in worker_logs]
    assert all(ran_by) and ran_by[0] | ran_by[1] == set(ids)

    # Config a, run twice at once: one run did the work, the other found it done.
    a_runs = _runs(tmp_path / "out-a")
    assert sorted(r["flow_run_id"] for r in a_runs) == sorted([ids[0], ids[2]])
    reasons = sorted(tuple(s["reason"] for s in r["stages"]) for r in a_runs)
    assert reasons[0] == ("ran", "ran") and all(x.startswith("skipped") for x in reasons[1])
    first, second = sorted((runs[i] for i in (ids[0], ids[2])), key=lambda r: r.end_time)
    assert second.start_time < first.end_time  # they overlapped: the second waited for the lock
    assert WAITING + str(first.id) in worker_logs[0] + worker_logs[1]
    gen_a = Dataset.open(tmp_path / "out-a" / "generate" / "rollout")
    assert gen_a.complete and gen_a.count() == 2 == len(gen_a.ids())

    # Config b: its own output, both endpoints used and counted in the run's summary.
    gen_b = Dataset.open(tmp_path / "out-b" / "generate" / "rollout")
    assert gen_b.complete and gen_b.count() == 3 == len(gen_b.ids())
    [b_run] = _runs(tmp_path / "out-b")
    counts = b_run["stages"][0]["counts"]
    for url in (fast1.base_url, fast2.base_url):
        assert counts[f"llm_endpoint:{url}|ok"] > 0
    assert counts[f"llm_endpoint:{fast1.base_url}|calls"] + counts[f"llm_endpoint:{fast2.base_url}|calls"] \
        == counts["llm_calls"]

    # Config c.
    [c_run] = _runs(tmp_path / "out-c")
    assert c_run["stages"][0]["counts"]["out"] == Dataset.open(tmp_path / "out-c" / "convert" / "db").count() == 5

    # The shared response cache holds every answer once: no call made twice, none lost.
    with sqlite3.connect(cache) as db:
        assert db.execute("SELECT COUNT(*) FROM responses").fetchone()[0] == calls
