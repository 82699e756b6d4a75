"""The convert pipeline end to end (FnApiRunner): counts, equality with direct conversion,
dedup across inputs, idempotent re-runs, resume after SIGKILL, nothing temporary left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from pipelines.convert import ConvertError, run_convert
from pipelines.inputs import plan_chunks
from schemas.store import MANIFEST, Dataset
from tests.pipelines._data import direct, uniform, write_jsonl, write_parquet

REPO = Path(__file__).resolve().parents[2]


def _temp_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).iterdir()}


def _running(process) -> bool:
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _leftovers(output: Path) -> list[Path]:
    return [p for p in output.rglob("*") if p.name.startswith(".tmp-")]


def _records(output: Path) -> dict:
    ds = Dataset.open(output)
    records = list(ds.iter_records())
    return {t.id: t for t in records}, len(records)


def test_adp_samples_convert_like_direct_conversion_and_rerun_is_idempotent(tmp_path, adp_files, adp_records,
                                                                          monkeypatch):
    # A temp dir of this test's own: other processes on the machine use the shared one.
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    before = _temp_dirs()
    output = tmp_path / "out"
    inputs = [str(f) for f in adp_files]
    summary = run_convert("adp", inputs, str(output), chunk_size=3)
    expected = direct(adp_records)
    c = summary.counts
    assert c["in"] == len(adp_records)
    assert c["quarantined"] == 0
    assert c["out"] == len(expected)
    assert c["duplicate"] == len(adp_records) - len(expected)  # the samples repeat a few records
    assert c["in"] == c["out"] + c["quarantined"] + c["duplicate"]
    got, n = _records(output)
    assert n == len(expected) and got == expected
    assert summary.chunks == summary.chunks_done == len(plan_chunks(inputs, 3))
    assert Dataset.open(output).complete
    assert not _leftovers(output) and _temp_dirs() == before

    again = run_convert("adp", inputs, str(output), chunk_size=3)
    assert again.chunks_done == 0 and again.chunks_skipped == summary.chunks
    assert again.counts == summary.counts
    assert _records(output) == (got, n)


def test_all_formats_convert_to_the_same_records(tmp_path, adp_records):
    import datasets

    records = uniform(adp_records)
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(records).save_to_disk(str(saved))
    inputs = [
        write_jsonl(tmp_path / "r.jsonl", records),
        write_jsonl(tmp_path / "r.jsonl.gz", records),
        write_jsonl(tmp_path / "r.jsonl.zst", records),
        write_parquet(tmp_path / "r.parquet", records),
        saved,
    ]
    summary = run_convert("adp", [str(p) for p in inputs], str(tmp_path / "out"), chunk_size=20)
    expected = direct(records)
    # Every format yields the same trajectories, so all copies after the first are duplicates.
    c = summary.counts
    assert (c["in"], c["out"], c["quarantined"], c["duplicate"]) == (
        5 * len(records), len(expected), 0, 4 * len(records))
    got, n = _records(tmp_path / "out")
    assert n == len(expected) and got == expected
    # The first input in order wins: every kept record comes from r.jsonl's units.
    ds = Dataset.open(tmp_path / "out")
    jsonl_units = {c.unit for c in plan_chunks([str(inputs[0])], 20)}
    kept = {name for name, u in ds.finished_units().items() if u["counts"].get("out")}
    assert kept == jsonl_units


_KILLABLE = textwrap.dedent(
    """
    import sys, time
    from schemas.store import Dataset
    commit = Dataset.commit_staged
    def slow_commit(self, name, staged):
        commit(self, name, staged)
        time.sleep(0.3)  # widen the window between unit commits so the test can kill mid-way
    Dataset.commit_staged = slow_commit
    from pipelines.convert import run_convert
    run_convert("adp", [sys.argv[1]], sys.argv[2], chunk_size=int(sys.argv[3]), workers=int(sys.argv[4]))
    """
)


def test_killed_run_resumes_with_nothing_lost_and_nothing_twice(tmp_path, adp_records):
    records = adp_records * 2  # every record twice: duplicates across chunks too
    source = write_jsonl(tmp_path / "in.jsonl", records)
    output = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLABLE, str(source), str(output), "10", "1"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    finished = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            finished = len(Dataset(output).finished_units()) if (output / MANIFEST).exists() else 0
        except Exception:
            finished = 0
        if finished >= 1:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    total = len(plan_chunks([str(source)], 10))
    assert 1 <= len(Dataset(output).finished_units()) < total
    assert list(output.glob(".tmp-convert-*")), "the killed run should have left its staging dir"

    summary = run_convert("adp", [str(source)], str(output), chunk_size=10)
    assert summary.chunks_skipped >= 1 and summary.chunks_done + summary.chunks_skipped == total
    expected = direct(records)
    c = summary.counts
    assert (c["in"], c["out"], c["quarantined"]) == (len(records), len(expected), 0)
    assert c["duplicate"] == len(records) - len(expected)
    got, n = _records(output)
    assert n == len(expected) and got == expected
    assert not _leftovers(output) and not list(output.glob(".tmp-*"))


_SLOW_CONVERT = textwrap.dedent(
    """
    import sys, time
    import pipelines.convert as convert
    real = convert.convert_chunk
    def slow(*args, **kwargs):
        time.sleep(0.25)  # a chunk takes a while, so the test can kill half-way through converting
        return real(*args, **kwargs)
    convert.convert_chunk = slow
    convert.run_convert("adp", [sys.argv[1]], sys.argv[2], chunk_size=int(sys.argv[3]), workers=1)
    """
)


def test_rerun_after_a_kill_half_way_converts_only_what_was_not_converted(tmp_path, adp_records, monkeypatch):
    import pipelines.convert as convert

    records = adp_records * 2  # duplicates across chunks: the cross-chunk rule must hold for reused chunks
    source = write_jsonl(tmp_path / "in.jsonl", records)
    chunk_size = -(-len(records) // 12)
    total = len(plan_chunks([str(source)], chunk_size))
    assert total == 12
    output = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_CONVERT, str(source), str(output), str(chunk_size)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    staged = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        staged = len(list(output.glob(".tmp-convert-staged/*.result.json")))
        if staged >= total // 2:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert staged >= total // 2 and not Dataset(output).finished_units()

    converted = []
    real = convert.convert_chunk
    monkeypatch.setattr(convert, "convert_chunk", lambda chunk, *a, **kw: converted.append(chunk.unit) or real(chunk, *a, **kw))
    summary = run_convert("adp", [str(source)], str(output), chunk_size=chunk_size, workers=1)
    assert len(converted) <= 0.6 * total, f"re-run converted {len(converted)} of {total} chunks"
    assert summary.chunks_reused == total - len(converted) >= total // 2
    expected = direct(records)
    c = summary.counts
    assert (c["in"], c["out"], c["quarantined"], c["duplicate"]) == (
        len(records), len(expected), 0, len(records) - len(expected))
    got, n = _records(output)
    assert n == len(expected) and got == expected
    assert not _leftovers(output) and not list(output.glob(".tmp-*"))


def test_worker_processes_give_the_same_dataset_as_in_process(tmp_path, adp_files, adp_records):
    inputs = [str(f) for f in adp_files]
    one = run_convert("adp", inputs, str(tmp_path / "one"), chunk_size=5, workers=1)
    two = run_convert("adp", inputs, str(tmp_path / "two"), chunk_size=5, workers=2)
    assert (one.workers, two.workers) == (1, 2)
    assert two.counts == one.counts and two.counts["out"] == len(direct(adp_records))
    assert _records(tmp_path / "two") == _records(tmp_path / "one")
    assert not _leftovers(tmp_path / "two")


def test_local_workers_start_only_where_they_pay_off():
    from pipelines.convert import AUTO_WORKERS_MIN_RECORDS as big, DEFAULT_RUNNER as local, local_workers

    assert local_workers(0, local, [], big, cpus=4) == 4
    assert local_workers(0, local, [], big - 1, cpus=4) == 1  # small input: start-up would cost more
    assert local_workers(0, local, [], big, cpus=1) == 1
    assert local_workers(3, local, [], 10, cpus=1) == 3  # asked for explicitly
    assert local_workers(0, "FnApiRunner", [], big, cpus=2) == 2
    # Another runner, or Beam options that already choose, are left alone; asking there too is an error.
    assert local_workers(0, "DataflowRunner", [], big, cpus=4) == 1
    assert local_workers(0, local, ["--direct_num_workers=3"], big, cpus=4) == 1
    with pytest.raises(ConvertError, match="runner is DataflowRunner"):
        local_workers(2, "DataflowRunner", [], big)
    with pytest.raises(ConvertError, match="--direct_num_workers is also given"):
        local_workers(2, local, ["--direct_num_workers=3"], big)


def test_killed_run_with_worker_processes_leaves_no_worker_behind_and_resumes(tmp_path, adp_records):
    import psutil

    records = adp_records * 60
    source = write_jsonl(tmp_path / "in.jsonl", records)
    output = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLABLE, str(source), str(output), "50", "2"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workers: list[psutil.Process] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        if list(output.glob(".tmp-convert-staged/*.parquet")):  # the workers are converting
            workers = psutil.Process(proc.pid).children(recursive=True)
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert len(workers) >= 2
    # Each worker notices its driver is gone and exits at once (a zombie has exited: this
    # container's init may never reap it).
    _, alive = psutil.wait_procs(workers, timeout=2)
    alive = [p for p in alive if _running(p)]
    assert not alive, [p.cmdline() for p in alive]
    assert not Dataset(output).complete

    summary = run_convert("adp", [str(source)], str(output), chunk_size=50)
    c = summary.counts
    expected = direct(records)
    assert (c["in"], c["out"], c["quarantined"]) == (len(records), len(expected), 0)
    got, n = _records(output)
    assert n == len(expected) and got == expected
    assert not _leftovers(output) and not list(output.glob(".tmp-*"))


def test_duplicate_decision_keeps_the_committed_copy_else_the_first_in_input_order():
    """Within a chunk, across chunks and inputs, and against a unit an earlier run committed."""
    from pipelines.convert_work import COMMITTED, ChunkResult, losers_of_partition, partitioned_ids

    later = ChunkResult("u-1-0", (1, 0), ids=["a", "b", "a", "c", "old"])
    first = ChunkResult("u-0-3", (0, 3), ids=["b", "d", "d"])
    committed = (COMMITTED[0], COMMITTED[1], COMMITTED[3], ["old"], None)
    groups: dict[int, list] = {}
    for result in (later, first):
        for part, group in partitioned_ids(result, 4):
            groups.setdefault(part, []).append(group)
    groups.setdefault(next(p for p, g in partitioned_ids(ChunkResult("x", (0, 0), ids=["old"]), 4)), []).append(committed)
    assert sum(len(g[3]) for gs in groups.values() for g in gs) == 9
    losers = sorted(loser for item in groups.items() for loser in losers_of_partition(item))
    # "a": 2nd copy in the same chunk; "b": the later input's copy; "d": 2nd copy; "old": committed wins.
    assert losers == [("u-0-3", 2), ("u-1-0", 1), ("u-1-0", 2), ("u-1-0", 4)]
