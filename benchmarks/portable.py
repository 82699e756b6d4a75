"""The Beam stages on Beam's portable runner path against the in-process FnApiRunner.

`python -m benchmarks.portable [--records N]`

Builds N ADP records (the shipped samples with unique ids, see `benchmarks.convert`; every
record's content repeats every 87 records, so dedup has clusters to find), then runs convert,
filter (rule chain) and dedup twice, each run in its own process: on the default FnApiRunner,
and with `--runner PortableRunner --job_endpoint=embed --environment_type=EXTERNAL` against an SDK
worker pool started for the benchmark, as a Dataflow, Flink or Spark job runs them. Per stage:
records/s on both paths (the portable path's ratio, target >= 0.8: only small elements, shard
paths and chunk summaries, cross the portability layer, so it should cost little), whether the
outputs are equal (ids and counts), and the peak RSS of the driver and of the SDK worker.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._common import print_rows, row, write_results
from benchmarks.convert import build_input

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.8
CHAIN = [{"name": "well_formed"}, {"name": "no_loops", "k": 3}, {"name": "pii", "mode": "scrub"},
         {"name": "max_step_tokens", "max_tokens": 8192}]
STAGES = ("convert", "filter", "dedup")


def run_stage(stage: str, src: str, out: str, runner: str, beam_args: list[str]) -> dict[str, Any]:
    """One stage in this process (the child side): seconds, the output's counts, peak RSS."""
    from schemas.store import Dataset

    t0 = time.perf_counter()
    if stage == "convert":
        from pipelines.convert import run_convert

        # workers=1: one process on both paths (the embedded job service gives a job one SDK worker).
        run_convert("adp", [src], out, runner=runner, beam_args=beam_args, workers=0 if beam_args else 1)
    elif stage == "filter":
        from pipelines.filter import run_filter

        run_filter(src, CHAIN, out, runner=runner, beam_args=beam_args)
    else:
        from pipelines.dedup import run_dedup

        run_dedup(src, out, runner=runner, beam_args=beam_args)
    seconds = time.perf_counter() - t0
    ds = Dataset.open(out)
    counts = {k: v for k, v in ds.manifest()["counts"].items() if ":" not in k}
    return {"seconds": seconds, "counts": counts, "driver_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


class Pool:
    """An SDK worker pool, as the docs start it; its workers' peak RSS is sampled while it runs."""

    def __init__(self, tmp: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={self.port}"],
            cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("the SDK worker pool did not start") from None
                time.sleep(0.2)
        self.peak_mib = 0.0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def args(self) -> list[str]:
        return ["--job_endpoint=embed", "--environment_type=EXTERNAL", f"--environment_config=localhost:{self.port}"]

    def _sample(self) -> None:
        import psutil

        while not self._stop.wait(0.1):
            try:
                for child in psutil.Process(self.proc.pid).children(recursive=True):
                    self.peak_mib = max(self.peak_mib, child.memory_info().rss / 2**20)
            except psutil.Error:
                pass

    def take_peak(self) -> float:
        peak, self.peak_mib = self.peak_mib, 0.0
        return peak

    def stop(self) -> None:
        self._stop.set()
        self._sampler.join()
        os.killpg(self.proc.pid, 15)
        self.proc.wait(timeout=30)


def measure(stage: str, src: Path, out: Path, runner: str, beam_args: list[str]) -> dict[str, Any]:
    """`run_stage` in a child process."""
    cmd = [sys.executable, "-m", "benchmarks.portable", "--child", stage, str(src), str(out), runner, *beam_args]
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{stage} on {runner} failed: {done.stderr.strip()[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        stage, src, out, runner, *beam_args = sys.argv[2:]
        print(json.dumps(run_stage(stage, src, out, runner, beam_args)))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=20_000)
    a = ap.parse_args(argv)

    from pipelines.beam_runner import DEFAULT_RUNNER

    tmp = Path(tempfile.mkdtemp(prefix="trajforge-bench-portable-"))
    pool = Pool(tmp)
    rows: list[dict[str, Any]] = []
    details: dict[str, Any] = {}
    try:
        data = tmp / "input.jsonl"
        size = build_input(data, a.records)
        print(f"input: {a.records:,} ADP records, {size / 2**20:,.0f} MiB; SDK worker pool on port {pool.port}")
        inputs = {"local": data, "portable": data}
        for stage in STAGES:
            got = {}
            for path, runner, beam_args in (("local", DEFAULT_RUNNER, []), ("portable", "PortableRunner", pool.args())):
                pool.take_peak()
                r = measure(stage, inputs[path], tmp / f"{stage}-{path}", runner, beam_args)
                r["worker_rss_mib"] = pool.take_peak() if path == "portable" else None
                got[path] = r
                inputs[path] = tmp / f"{stage}-{path}"
            local, portable = got["local"], got["portable"]
            n = local["counts"]["in"]
            equal = local["counts"] == portable["counts"] and _ids(tmp / f"{stage}-local") == _ids(tmp / f"{stage}-portable")
            ratio = local["seconds"] / portable["seconds"]
            print(f"{stage}: FnApiRunner {n / local['seconds']:,.0f} records/s ({local['seconds']:.1f}s), portable "
                  f"{n / portable['seconds']:,.0f} records/s ({portable['seconds']:.1f}s): ratio {ratio:.2f} "
                  f"(target >= {TARGET}); outputs equal: {equal}; peak RSS driver {portable['driver_rss_mib']:.0f} "
                  f"MiB + SDK worker {portable['worker_rss_mib']:.0f} MiB (FnApiRunner process "
                  f"{local['driver_rss_mib']:.0f} MiB)", flush=True)
            rows.append(row(f"{stage} on the portable path", n / portable["seconds"], "records/s",
                            n / local["seconds"], "FnApiRunner in-process records/s", f">= {TARGET}",
                            ratio >= TARGET))
            rows.append(row(f"{stage}: portable output equals FnApiRunner's (ids, counts)", float(equal), "bool",
                            target="== 1", passed=equal))
            details[stage] = got
        print_rows("Beam stages: portable path vs FnApiRunner", rows)
        path = write_results("portable", rows, records=a.records, input_mib=round(size / 2**20, 1), stages=details)
        print(f"results: {path}")
    finally:
        pool.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _ids(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    from schemas.store import Dataset

    ds = Dataset.open(path)
    return sorted(i for f in ds.shard_files() for i in pq.read_table(f, columns=["id"]).column(0).to_pylist())


if __name__ == "__main__":
    main()
