"""convert, filter and dedup through Beam's portability layer, the way Dataflow, Flink and Spark run
them: `--runner PortableRunner --job_endpoint=embed --environment_type=EXTERNAL` with an SDK worker
pool in its own process and working directory. Each output must equal the in-process FnApiRunner's."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import psutil
import pyarrow.parquet as pq
import pytest
import yaml

from backends.fake_server import FakeServer, Rule
from pipelines.convert import run_convert
from pipelines.dedup import CLUSTERS_FILE, run_dedup
from pipelines.filter import run_filter
from schemas.store import Dataset
from tests.conftest import REPO
from tests.pipelines import _custom


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkerPool:
    """`python -m apache_beam.runners.worker.worker_pool_main` as the docs start it, in its own session."""

    def __init__(self, cwd: Path) -> None:
        self.port = _free_port()
        # The pool starts each SDK worker with `python` from PATH: the venv's must come first.
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               "PYTHONPATH": str(REPO)}
        self.log = open(cwd / "pool.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={self.port}"],
            cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 60
        while True:
            assert self.proc.poll() is None, (cwd / "pool.log").read_text()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert time.time() < deadline, "the worker pool did not listen within 60 s"
                time.sleep(0.2)

    def args(self) -> list[str]:
        return ["--runner", "PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
                f"--environment_config=localhost:{self.port}"]

    def workers(self) -> list[psutil.Process]:
        """SDK worker processes the pool started and that are still running."""
        try:
            return [p for p in psutil.Process(self.proc.pid).children(recursive=True) if p.is_running()
                    and p.status() != psutil.STATUS_ZOMBIE]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        self.log.close()


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[WorkerPool]:
    pool = WorkerPool(tmp_path_factory.mktemp("pool-cwd"))
    try:
        yield pool
    finally:
        group = pool.proc.pid
        pool.stop()
        deadline = time.time() + 10
        while _alive(group):  # nothing of the pool's session is left
            assert time.time() < deadline, "processes of the worker pool's group still run"
            time.sleep(0.1)


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _cli(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _input(tmp: Path, adp_records: list[dict]) -> Path:
    """The shipped samples plus copies under new ids (duplicates for dedup), one repeated record
    (a duplicate for convert) and one broken line (quarantined)."""
    lines = [orjson.dumps(r) for r in adp_records]
    lines += [orjson.dumps({**r, "id": f"copy-{i}-{r['id']}"}) for i, r in enumerate(adp_records[::9])]
    lines += [orjson.dumps(adp_records[3]), b'{"id": "broken", "content": [']
    path = tmp / "records.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _ids(path: Path) -> list[str]:
    return sorted(t.id for t in Dataset.open(path).iter_records())  # a list: a duplicate would show


def _counts(path: Path) -> dict:
    counts = Dataset.open(path).manifest()["counts"]
    return {k: v for k, v in counts.items() if not k.startswith("clusters")} | {"clusters": counts.get("clusters")}


def _filtered(path: Path) -> list[tuple[str, str, str]]:
    return sorted((f.record.id, f.decision.filter, f.decision.reason) for f in Dataset.open(path).iter_records("filtered"))


def _judge(body: dict):
    prompt = body["messages"][-1]["content"]
    if "Rate the quality" not in prompt:
        return None
    return {"score": 2 if "sql" in prompt.lower() else 4, "reason": "scripted"}


def test_convert_filter_dedup_on_the_portable_runner_match_fnapirunner(pool, tmp_path, adp_records):
    driver = tmp_path / "driver"  # the CLI runs here with relative paths; the pool runs elsewhere
    driver.mkdir()
    records = _input(driver, adp_records)
    ref = tmp_path / "ref"

    run_convert("adp", [str(records)], str(ref / "convert"), chunk_size=7)
    done = _cli(["convert", "--source", "adp", "--input", records.name, "--output", "convert", "--chunk-size", "7",
                 *pool.args()], driver)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _ids(driver / "convert") == _ids(ref / "convert") and len(_ids(ref / "convert")) > 80
    assert _counts(driver / "convert") == _counts(ref / "convert")
    assert _counts(ref / "convert")["quarantined"] == 1 and _counts(ref / "convert")["duplicate"] >= 1

    with FakeServer(rules=[Rule(fn=_judge)]) as server:
        chain = [{"name": "well_formed"}, {"name": "no_loops", "k": 3}, {"name": "pii", "mode": "scrub"},
                 {"name": "quality_judge", "min_score": 3,
                  "llm": {"backend": "openai", "base_url": server.base_url, "model": "fake-model",
                          "api_key_env": None, "max_retries": 0, "cache_path": "judge-cache.sqlite"}}]
        (driver / "chain.yaml").write_text(yaml.safe_dump(chain))
        ref_chain = [{**c, "llm": {**c["llm"], "cache_path": str(tmp_path / "ref-cache.sqlite")}} if "llm" in c else c
                     for c in chain]
        run_filter(str(ref / "convert"), ref_chain, str(ref / "filter"))
        done = _cli(["filter", "convert", "--config", "chain.yaml", "--output", "filter", *pool.args()], driver)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (driver / "judge-cache.sqlite").is_file()  # a relative path means the driver's directory
    assert _ids(driver / "filter") == _ids(ref / "filter")
    assert _filtered(driver / "filter") == _filtered(ref / "filter") and _filtered(ref / "filter")
    assert _counts(driver / "filter") == _counts(ref / "filter")

    run_dedup(str(ref / "filter"), str(ref / "dedup"))
    done = _cli(["dedup", "filter", "--output", "dedup", *pool.args()], driver)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _ids(driver / "dedup") == _ids(ref / "dedup")
    assert _filtered(driver / "dedup") == _filtered(ref / "dedup") and _filtered(ref / "dedup")
    assert _counts(driver / "dedup") == _counts(ref / "dedup")
    clusters = [pq.read_table(d / "dedup" / CLUSTERS_FILE).to_pylist() for d in (driver, ref)]
    assert clusters[0] == clusters[1] and clusters[0]
    assert not list(driver.rglob(".tmp-*")), "staging left behind"


def test_a_converter_and_a_filter_registered_by_user_code_reach_the_workers(pool, tmp_path, adp_files, monkeypatch):
    from converters.registry import ConverterInfo, _REGISTRY as converters
    from filters.base import _REGISTRY as filters

    monkeypatch.setitem(converters, _custom.CONVERTER, ConverterInfo(_custom.CONVERTER, _custom.adp_tagged, [], ""))
    monkeypatch.setitem(filters, _custom.FILTER, _custom.MaxSteps)
    inputs = [str(f) for f in adp_files[:4]]
    run_convert(_custom.CONVERTER, inputs, str(tmp_path / "ref"))
    run_convert(_custom.CONVERTER, inputs, str(tmp_path / "conv"), runner="PortableRunner", beam_args=pool.args()[2:])
    records = list(Dataset.open(tmp_path / "conv").iter_records())
    assert records and all(t.details["converted_by"] == _custom.CONVERTER for t in records)
    assert _ids(tmp_path / "conv") == _ids(tmp_path / "ref")

    chain = [{"name": _custom.FILTER, "limit": 8}]
    run_filter(str(tmp_path / "ref"), chain, str(tmp_path / "ref-filter"))
    run_filter(str(tmp_path / "conv"), chain, str(tmp_path / "filter"), runner="PortableRunner",
               beam_args=pool.args()[2:])
    assert _filtered(tmp_path / "filter") == _filtered(tmp_path / "ref-filter")
    assert {f[1] for f in _filtered(tmp_path / "filter")} == {_custom.FILTER}


def test_a_killed_portable_job_leaves_no_worker_and_resumes(pool, tmp_path, adp_files):
    source = tmp_path / "in"
    run_convert("adp", [str(f) for f in adp_files], str(source), chunk_size=4)
    assert len(Dataset.open(source).shard_files("trajectories")) > 15
    chain = tmp_path / "chain.yaml"
    slow = [{"name": "quality_judge", "min_score": 3, "llm": {"backend": "openai", "model": "fake-model",
                                                              "api_key_env": None, "max_retries": 0}}]
    out = tmp_path / "out"
    with FakeServer(rules=[Rule(fn=_judge)]) as server:
        slow[0]["llm"]["base_url"] = server.base_url
        chain.write_text(yaml.safe_dump(slow))
        run_filter(str(source), slow, str(tmp_path / "ref"))
        server.config.latency = 0.2  # slow judging, so the job is killed with shards still to do
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        job = subprocess.Popen([sys.executable, "-m", "flows.cli", "filter", str(source), "--config", str(chain),
                                "--output", str(out), *pool.args()], cwd=tmp_path, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.time() + 120
            while not ((out / "_manifest.json").exists() and len(Dataset.open(out).finished_units()) >= 2):
                assert job.poll() is None, "the job ended before it could be killed"
                assert time.time() < deadline, "no unit finished within 120 s"
                time.sleep(0.1)
            assert pool.workers(), "the job runs on no SDK worker of the pool"
        finally:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        deadline = time.time() + 20
        while pool.workers():  # a worker whose job service is gone exits
            assert time.time() < deadline, f"SDK workers left running: {pool.workers()}"
            time.sleep(0.2)
        partial = Dataset.open(out)
        assert not partial.complete and 2 <= len(partial.finished_units()) < len(Dataset.open(source).shard_files())
        server.config.latency = 0.0
        again = _cli(["filter", str(source), "--config", str(chain), "--output", str(out), *pool.args()], tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r"\((\d+)/(\d+) shards run", again.stdout).group(1) != re.search(
        r"\((\d+)/(\d+) shards run", again.stdout).group(2)  # resumed: finished shards were not run again
    assert _ids(out) == _ids(tmp_path / "ref") and _filtered(out) == _filtered(tmp_path / "ref")
    assert _counts(out) == _counts(tmp_path / "ref")
    assert not pool.workers()


def test_portable_settings_that_cannot_work_fail_with_one_line(tmp_path, adp_files):
    source = tmp_path / "in"
    run_convert("adp", [str(adp_files[0])], str(source))
    port = _free_port()  # nothing listens there
    no_pool = _cli(["dedup", str(source), "--output", "out", "--runner", "PortableRunner", "--job_endpoint=embed",
                    "--environment_type=EXTERNAL", f"--environment_config=localhost:{port}"], tmp_path)
    assert no_pool.returncode == 1
    [line] = no_pool.stderr.strip().splitlines()
    assert line.startswith("error: ") and line.endswith(
        f"no SDK worker pool answers at localhost:{port} (Connection refused); start one with: "
        f"python -m apache_beam.runners.worker.worker_pool_main --service_port={port}")
    process = _cli(["convert", "--source", "adp", "--input", str(adp_files[0]), "--output", "out2",
                    "--runner", "PortableRunner", "--job_endpoint=embed", "--environment_type=PROCESS"], tmp_path)
    assert process.returncode == 1 and len(process.stderr.strip().splitlines()) == 1
    assert "cannot start PROCESS workers" in process.stderr and "Traceback" not in process.stderr
