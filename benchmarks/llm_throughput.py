"""Throughput of trajforge's LLM layer (and peers) against the fake server, vs the ideal C/L.

The default job is 2,048 requests: a multiple of the capacity (64). With a fixed latency L every
slot serves its requests one after another, so a job of N requests needs at least ceil(N/C)
rounds of L; for N = 2,000 that is 32 rounds, and no client could reach more than 0.977 of C/L.
The bound for the job actually run is printed beside the ratio.

The multi-endpoint case runs the same job over three fake servers of different capacity (by
default 16, 16 and 32 slots: the same 64 in all) listed as `endpoints:` of one config, and
compares the rate with the sum of their ideal capacities (target >= 0.9).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from backends.fake_server import spawn

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "llm_throughput.json"
VENVS = ROOT / "benchmarks" / ".venvs"


def start_server(latency: float, capacity: int) -> tuple[subprocess.Popen[str], str]:
    """Fake server in its own process: client and server must not share one GIL."""
    return spawn("--latency", str(latency), "--capacity", str(capacity), cwd=str(ROOT))


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process, from /proc (None where there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prompts(n: int) -> list[str]:
    return [f"Write one sentence about item number {i}." for i in range(n)]


async def run_trajforge(servers: list[tuple[str, int]], n: int, cache_dir: str) -> dict[str, Any]:
    """The job through one client: one server as `base_url`, several as `endpoints`."""
    from backends import LLMConfig, LLMRequestError, make_llm

    where: dict[str, Any] = (
        {"base_url": servers[0][0], "max_concurrency": servers[0][1]} if len(servers) == 1
        else {"endpoints": [{"base_url": url, "max_concurrency": cap} for url, cap in servers]}
    )
    cfg = LLMConfig(
        backend="openai", model="fake-model", api_key_env=None, request_timeout_s=30, max_tokens=64,
        cache_path=os.path.join(cache_dir, "cache.sqlite"), ledger_path=os.path.join(cache_dir, "ledger.jsonl"),
        **where,
    )
    async with make_llm(cfg) as llm:
        async def one(p: str) -> bool:
            try:
                await llm.chat([{"role": "user", "content": p}])
                return True
            except LLMRequestError:
                return False

        items = prompts(n)
        c0, t0 = time.process_time(), time.perf_counter()
        ok = await asyncio.gather(*(one(p) for p in items))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {
            "answered": sum(ok), "ledgered": len(llm.ledger.records), "elapsed_s": elapsed,
            "client_cpu_us_per_request": cpu / n * 1e6, "stats": llm.stats.as_dict(),
        }


def measure_trajforge(procs: list[subprocess.Popen[str]], servers: list[tuple[str, int]], n: int,
                      ideal: float) -> dict[str, Any]:
    """One run on a fresh cache, with the client's and the fake servers' CPU per request."""
    server_cpu0 = [cpu_seconds(p.pid) for p in procs]
    with tempfile.TemporaryDirectory() as tmp:
        r = asyncio.run(run_trajforge(servers, n, tmp))
    server_cpu1 = [cpu_seconds(p.pid) for p in procs]
    if None not in server_cpu0 and None not in server_cpu1:
        r["server_cpu_us_per_request"] = sum(b - a for a, b in zip(server_cpu0, server_cpu1)) / n * 1e6  # type: ignore[operator]
    rps = n / r["elapsed_s"]
    r.update(rps=rps, ratio=rps / ideal, lost=n - r["answered"] - r["ledgered"])
    return r


# Peer jobs run inside their own venvs (their pins clash with ours); each prints one JSON line.
CURATOR_JOB = r"""
import json, os, sys, tempfile, time
os.environ["CURATOR_DISABLE_CACHE"] = "true"
os.environ.setdefault("CURATOR_CACHE_DIR", tempfile.mkdtemp())
# Offline machine: point tiktoken at the cl100k_base file litellm ships instead of downloading it.
import importlib.util
_tok = importlib.util.find_spec("litellm.litellm_core_utils.tokenizers")
if _tok is not None and _tok.submodule_search_locations:
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", list(_tok.submodule_search_locations)[0])
from bespokelabs import curator
base_url, n, capacity = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

class Gen(curator.LLM):
    def prompt(self, row):
        return row["prompt"]

    def parse(self, row, response):
        return {"prompt": row["prompt"], "response": response}

llm = Gen(
    model_name="gpt-4o-mini", backend="openai", generation_params={"max_tokens": 64},
    backend_params={
        "base_url": base_url, "api_key": "sk-bench", "max_concurrent_requests": capacity,
        "max_requests_per_minute": 10_000_000, "max_tokens_per_minute": 10_000_000_000,
        "max_retries": 3, "require_all_responses": False,
    },
)
rows = [{"prompt": f"Write one sentence about item number {i}."} for i in range(n)]
t0 = time.perf_counter()
out = llm(rows)
elapsed = time.perf_counter() - t0
ds = getattr(out, "dataset", out)
print(json.dumps({"answered": len(ds), "elapsed_s": elapsed}))
"""

DISTILABEL_JOB = r"""
import json, os, sys, tempfile, time
os.environ.setdefault("DISTILABEL_CACHE_DIR", tempfile.mkdtemp())
from distilabel.models import OpenAILLM
from distilabel.pipeline import Pipeline
from distilabel.steps import LoadDataFromDicts
from distilabel.steps.tasks import TextGeneration
base_url, n, capacity = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [{"instruction": f"Write one sentence about item number {i}."} for i in range(n)]
with Pipeline(name="llm-throughput") as pipeline:
    load = LoadDataFromDicts(data=rows, batch_size=capacity)
    gen = TextGeneration(
        llm=OpenAILLM(model="fake-model", base_url=base_url, api_key="sk-bench", max_retries=3,
                      generation_kwargs={"max_new_tokens": 64}),
        input_batch_size=capacity,
    )
    load >> gen
t0 = time.perf_counter()
distiset = pipeline.run(use_cache=False)
elapsed = time.perf_counter() - t0
ds = distiset["default"]["train"]
answered = sum(1 for g in ds["generation"] if g)
print(json.dumps({"answered": answered, "elapsed_s": elapsed}))
"""

PEERS = {
    "curator": ("bespokelabs-curator", CURATOR_JOB),
    "distilabel": ("distilabel[openai] requests", DISTILABEL_JOB),
}


def ensure_venv(name: str, requirement: str) -> Path:
    """A private venv per peer under benchmarks/.venvs (git-ignored); created once."""
    py = VENVS / name / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENVS / name)], check=True)
    check = subprocess.run([str(py), "-m", "pip", "show", requirement.split("[")[0]], capture_output=True)
    if check.returncode != 0:
        print(f"installing {requirement} into {py.parent.parent} ...", flush=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *requirement.split()], check=True)
    return py


def run_peer(name: str, base_url: str, n: int, capacity: int, timeout_s: float) -> dict[str, Any]:
    requirement, job = PEERS[name]
    try:
        py = ensure_venv(name, requirement)
    except (subprocess.CalledProcessError, OSError) as exc:
        return {"error": f"could not install {requirement}: {exc}"}
    try:
        proc = subprocess.run(
            [str(py), "-c", job, base_url, str(n), str(capacity)],
            capture_output=True, text=True, timeout=timeout_s, cwd=tempfile.gettempdir(),
        )
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout_s:.0f}s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-800:]}"}
    return json.loads(lines[-1])


def measure_endpoints(capacities: list[int], latency: float, n: int) -> dict[str, Any]:
    """The job over several servers (one config, `endpoints:`) vs the sum of their ideal capacities."""
    ideal = sum(capacities) / latency
    started: list[subprocess.Popen[str]] = []
    try:
        servers = []
        for cap in capacities:
            proc, url = start_server(latency, cap)
            started.append(proc)
            servers.append((url, cap))
        r = measure_trajforge(started, servers, n, ideal)
    finally:
        for proc in started:
            proc.terminate()
            proc.wait()
    r.update(capacities=capacities, ideal_rps=ideal)
    ok = {url: e["ok"] for url, e in r["stats"]["endpoints"].items()}
    print(f"trajforge over {len(capacities)} endpoints (capacities {capacities}): {r['rps']:.1f} req/s, sum of ideal "
          f"capacities {ideal:.1f} req/s, ratio {r['ratio']:.3f} (target >= 0.9); answered {r['answered']}, "
          f"lost {r['lost']}; answers per endpoint {list(ok.values())}", flush=True)
    return r


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=2048, help="a multiple of --capacity keeps C/L reachable")
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--capacity", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1, help="trajforge runs; the median one is reported")
    ap.add_argument("--no-peers", action="store_true", help="only measure trajforge")
    ap.add_argument("--peer-timeout", type=float, default=300.0, help="seconds before a peer run is abandoned")
    ap.add_argument("--endpoint-capacities", default="16,16,32",
                    help="capacities of the multi-endpoint case's servers ('' to skip it)")
    a = ap.parse_args(argv)
    ideal = a.capacity / a.latency
    # With a fixed latency no client does better than ceil(N/C) rounds of L.
    bound = a.requests / (math.ceil(a.requests / a.capacity) * a.latency)
    print(f"job: {a.requests} requests, capacity {a.capacity}, latency {a.latency}s; ideal C/L {ideal:.1f} req/s; "
          f"best possible for this job {bound:.1f} req/s ({bound / ideal:.3f} of ideal)")
    result: dict[str, Any] = {
        "requests": a.requests, "latency_s": a.latency, "capacity": a.capacity, "ideal_rps": ideal,
        "job_bound_rps": bound,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    proc, base_url = start_server(a.latency, a.capacity)
    try:
        runs = []
        for _ in range(a.repeat):
            r = measure_trajforge([proc], [(base_url, a.capacity)], a.requests, ideal)
            runs.append(r)
            server = r.get("server_cpu_us_per_request")
            print(f"trajforge: {r['rps']:.1f} req/s, ideal {ideal:.1f} req/s, ratio {r['ratio']:.3f} (target >= 0.95); "
                  f"answered {r['answered']}, ledgered {r['ledgered']}, lost {r['lost']}; CPU per request: "
                  f"client {r['client_cpu_us_per_request']:.0f} us, server "
                  + (f"{server:.0f} us" if server is not None else "unknown"), flush=True)
        r = sorted(runs, key=lambda x: x["rps"])[len(runs) // 2]
        rps = r["rps"]
        result["trajforge"] = r
        if a.repeat > 1:
            result["trajforge_runs"] = runs
            print(f"trajforge median of {a.repeat}: ratio {r['ratio']:.3f}; lost in all runs: "
                  f"{sum(x['lost'] for x in runs)}")
        if not a.no_peers:
            for name in PEERS:
                pr = run_peer(name, base_url, a.requests, a.capacity, a.peer_timeout)
                result[name] = pr
                if "error" in pr:
                    print(f"{name}: not measured: {pr['error']}")
                    continue
                prps = a.requests / pr["elapsed_s"]
                pr.update(rps=prps, ratio=prps / ideal, trajforge_speedup=rps / prps)
                print(f"{name}: {prps:.1f} req/s, ratio {prps / ideal:.3f}, answered {pr['answered']}; "
                      f"trajforge is {rps / prps:.2f}x faster")
    finally:
        proc.terminate()
        proc.wait()
    capacities = [int(c) for c in a.endpoint_capacities.split(",") if c.strip()]
    if capacities:
        result["multi_endpoint"] = measure_endpoints(capacities, a.latency, a.requests)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
