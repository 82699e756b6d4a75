"""The shard store: bounded shards, atomic units, resume, recovery and clear errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.models import SCHEMA_VERSION, Quarantined
from schemas.store import MANIFEST, Dataset, StoreError
from tests.conftest import REPO
from tests.factories import pair, tool_trajectory


def _visible_parquet(ds: Dataset) -> list[str]:
    return sorted(p.name for t in ("trajectories", "pairs", "quarantine", "filtered") for p in (ds.path / t).iterdir())


def test_units_write_bounded_zstd_shards_and_read_back(tmp_path):
    ds = Dataset.create(tmp_path / "ds", stage="test", config_hash="h1")
    records = [tool_trajectory(i) for i in range(25)]
    with ds.unit("u0", max_rows=10, row_group_rows=4) as unit:
        unit.write_many("trajectories", records)
        unit.write("pairs", pair(0))
        unit.write("quarantine", Quarantined(id="q0", stage="convert", error="bad", raw="{}"))
    files = ds.shard_files("trajectories")
    assert [f.name for f in files] == ["u0-00000.parquet", "u0-00001.parquet", "u0-00002.parquet"]
    assert [pq.ParquetFile(f).metadata.num_rows for f in files] == [10, 10, 5]
    assert pq.ParquetFile(files[0]).metadata.row_group(0).column(0).compression == "ZSTD"
    assert list(ds.iter_records()) == records
    assert [p.id for p in ds.iter_records("pairs")] == ["pair/0"]
    assert ds.count("quarantine") == 1
    manifest = json.loads((ds.path / MANIFEST).read_text())
    assert manifest["config_hash"] == "h1" and manifest["schema_version"] == SCHEMA_VERSION
    assert manifest["units"]["u0"]["counts"] == {"trajectories": 25, "pairs": 1, "quarantine": 1}
    assert [e["rows"] for e in manifest["units"]["u0"]["tables"]["trajectories"]] == [10, 10, 5]


def test_byte_limit_rolls_shards(tmp_path):
    ds = Dataset.create(tmp_path / "ds")
    with ds.unit("u0", max_bytes=1, row_group_rows=3) as unit:
        unit.write_many("trajectories", [tool_trajectory(i) for i in range(9)])
    assert len(ds.shard_files()) == 3  # every row group overshoots 1 byte, so each closes a shard
    assert ds.count() == 9


def test_reader_streams_bounded_batches(tmp_path):
    ds = Dataset.create(tmp_path / "ds")
    with ds.unit("u0") as unit:
        unit.write_many("trajectories", [tool_trajectory(i) for i in range(50)])
    batches = list(ds.iter_batches(batch_size=8, columns=["id"]))
    assert max(b.num_rows for b in batches) <= 8
    assert sum(b.num_rows for b in batches) == 50


def test_failed_unit_leaves_nothing_visible(tmp_path):
    ds = Dataset.create(tmp_path / "ds")
    with pytest.raises(RuntimeError):
        with ds.unit("u0", max_rows=2) as unit:
            unit.write_many("trajectories", [tool_trajectory(i) for i in range(5)])
            raise RuntimeError("boom")
    assert ds.count() == 0 and not ds.is_finished("u0")
    assert _visible_parquet(ds) == []


def test_second_commit_of_a_unit_is_dropped(tmp_path):
    ds = Dataset.create(tmp_path / "ds")
    for _ in range(2):
        with ds.unit("u0") as unit:
            unit.write_many("trajectories", [tool_trajectory(i) for i in range(3)])
    assert ds.count() == 3 and len(ds.ids()) == 3
    assert _visible_parquet(ds) == ["u0-00000.parquet"]


_KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {repo!r})
    from schemas.store import Dataset
    from tests.factories import tool_trajectory
    ds = Dataset.create({path!r}, stage="test", config_hash="h")
    for u in range(100):
        name = f"unit-{{u:03d}}"
        if ds.is_finished(name):
            continue
        with ds.unit(name, max_rows=5, row_group_rows=5) as unit:
            for i in range(20):
                unit.write("trajectories", tool_trajectory(u * 100 + i))
                time.sleep(0.002)
        print(name, flush=True)
    """
)


def test_killed_writer_leaves_no_partial_shard_and_resume_completes(tmp_path):
    path = tmp_path / "ds"
    script = _KILLED_WRITER.format(repo=str(REPO), path=str(path))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    # Let a few units finish, then kill mid-unit.
    for _ in range(3):
        assert proc.stdout.readline().startswith("unit-")
    time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    ds = Dataset.open(path)
    finished = len(ds.finished_units())
    assert 3 <= finished < 100
    # Readers see exactly the finished units, whatever temp files the kill left behind.
    assert ds.count() == finished * 20 == len(ds.ids())
    assert sum(1 for _ in ds.iter_rows()) == finished * 20
    ds.recover()
    assert not [p for t in ("trajectories",) for p in (path / t).iterdir() if p.name.startswith(".tmp-")]
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    ds = Dataset.open(path)
    ids = [row["id"] for row in ds.iter_rows(columns=["id"])]
    assert len(ids) == 2000 and len(set(ids)) == 2000


def test_recover_removes_only_files_trajforge_names_temporary(tmp_path):
    ds = Dataset.create(tmp_path / "ds")
    with ds.unit("u0") as unit:
        unit.write("trajectories", tool_trajectory(0))
    orphan = ds.path / "trajectories" / "u9-00000.parquet"
    orphan.write_bytes((ds.shard_files()[0]).read_bytes())
    (ds.path / "trajectories" / ".tmp-u8-00000-abc.parquet").write_bytes(b"partial")
    (ds.path / ".tmp-_manifest.json.0123abcd").write_bytes(b'{"half')  # killed mid manifest write
    assert ds.count() == 1  # orphans are never read
    removed = {p.name for p in ds.recover()}
    assert removed == {".tmp-u8-00000-abc.parquet", ".tmp-_manifest.json.0123abcd"}
    # An unlisted shard under a final name may be someone's own file: it stays, unread.
    assert orphan.exists() and ds.count() == 1 and (ds.path / "_manifest.json").exists()


def test_a_commit_cut_after_its_renames_is_undone_by_recover(tmp_path, monkeypatch):
    """Killed between renaming a unit's shards into place and listing them: the next run's
    `recover` removes exactly those shards (by the commit's journal), never a listed one."""
    ds = Dataset.create(tmp_path / "ds")
    with ds.unit("kept") as unit:
        unit.write("trajectories", tool_trajectory(0))
    kept = ds.shard_files()[0]

    def killed(_self, _manifest):
        raise KeyboardInterrupt  # stands in for SIGKILL: nothing after this line runs

    monkeypatch.setattr(Dataset, "_write_manifest", killed)
    with pytest.raises(KeyboardInterrupt), ds.unit("rollout-3f2a9c") as unit:
        unit.write_many("trajectories", [tool_trajectory(i) for i in range(1, 4)])
    monkeypatch.undo()
    cut = ds.path / "trajectories" / "rollout-3f2a9c-00000.parquet"
    assert cut.is_file() and ds.count() == 1  # renamed into place, not listed, never read
    # A journal naming a listed shard (forged, or stale) removes nothing that is listed.
    (ds.path / ".commit-forged.json").write_bytes(json.dumps(
        {"unit": "nope", "files": [f"trajectories/{kept.name}", "../outside.parquet"]}).encode())
    (tmp_path / "outside.parquet").write_bytes(b"not ours")
    cut_journal = ds.path / ".tmp-.commit-0a1b.json.2c3d"  # a writer killed while writing its journal
    cut_journal.write_bytes(b'{"unit": "x", "fi')

    removed = ds.recover()
    assert removed == [cut_journal, cut]
    assert kept.is_file() and (tmp_path / "outside.parquet").exists()
    assert not list(ds.path.glob(".commit-*")) and ds.count() == 1
    with ds.unit("rollout-77b0e1") as unit:  # the re-run's unit, under another random name
        unit.write_many("trajectories", [tool_trajectory(i) for i in range(1, 4)])
    assert ds.count() == 4 and sorted(p.name for p in (ds.path / "trajectories").iterdir()) == sorted(
        f.name for f in ds.shard_files())


def test_config_hash_mismatch_is_refused_unless_overwrite(tmp_path):
    ds = Dataset.create(tmp_path / "ds", config_hash="a")
    with ds.unit("u0") as unit:
        unit.write("trajectories", tool_trajectory(0))
    with pytest.raises(StoreError, match="config hash a.*this run has b"):
        Dataset.create(tmp_path / "ds", config_hash="b")
    fresh = Dataset.create(tmp_path / "ds", config_hash="b", overwrite=True)
    assert fresh.count() == 0 and fresh.config_hash == "b"
    assert list((tmp_path / "ds" / "trajectories").glob("*.parquet")) == []


def test_truncated_manifest_is_a_clear_error(tmp_path):
    ds = Dataset.create(tmp_path / "ds")
    text = (ds.path / MANIFEST).read_text()
    (ds.path / MANIFEST).write_text(text[: len(text) // 2])
    with pytest.raises(StoreError, match=r"_manifest.json: manifest is truncated or not JSON"):
        Dataset.open(ds.path)


def test_wrong_schema_version_is_a_clear_error(tmp_path):
    ds = Dataset.create(tmp_path / "ds")
    manifest = json.loads((ds.path / MANIFEST).read_text())
    manifest["schema_version"] = "0.1"
    (ds.path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=r"schema version '0.1' is not supported"):
        Dataset.open(ds.path)


def test_missing_manifest_is_a_clear_error(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(StoreError, match="missing manifest; .* is not a trajforge dataset"):
        Dataset.open(tmp_path / "plain")


def test_corrupt_and_foreign_parquet_are_clear_errors(tmp_path):
    ds = Dataset.create(tmp_path / "ds")
    with ds.unit("u0") as unit:
        unit.write("trajectories", tool_trajectory(0))
    shard = ds.shard_files()[0]
    pq.write_table(pa.table({"x": [1, 2]}), shard)
    with pytest.raises(StoreError, match=rf"{shard.name}: foreign Parquet schema"):
        list(ds.iter_rows())
    shard.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(StoreError, match=rf"{shard.name}: not a readable Parquet file"):
        list(ds.iter_rows())
    shard.unlink()
    with pytest.raises(StoreError, match="listed in the manifest is missing"):
        list(ds.iter_rows())
