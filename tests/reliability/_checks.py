"""Assertions over a dataset directory that hold after any kill: nothing partial is visible."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from schemas.store import TABLES, TEMP_PREFIX, Dataset


def assert_visible_state_sound(path: Path) -> Dataset | None:
    """What a reader sees is whole: the manifest parses and every listed shard opens with its schema.

    Returns None when the run was killed before it wrote a manifest.
    """
    if not (path / "_manifest.json").exists():
        return None
    ds = Dataset.open(path)
    for table in TABLES:
        files = ds.checked_shard_files(table)
        assert len(files) == len(set(files)), f"{table}: a shard is listed twice"
        rows = sum(_rows(f) for f in files)
        assert rows == ds.count(table), f"{table}: listed rows {ds.count(table)} != rows in the shards {rows}"
    return ds


def assert_clean_layout(ds: Dataset) -> None:
    """After a finished run: no temp files, no unlisted shard, no staging directory."""
    listed = {p.resolve() for table in TABLES for p in ds.shard_files(table)}
    for table in TABLES:
        for file in (ds.path / table).iterdir():
            assert not file.name.startswith(TEMP_PREFIX), f"stray temp file {file}"
            assert file.resolve() in listed, f"shard {file} is not listed in the manifest"
    staging = [p.name for p in ds.path.iterdir() if p.name.startswith(TEMP_PREFIX)]
    assert not staging, f"staging left behind: {staging}"


def assert_no_duplicate_ids(ds: Dataset, table: str = "trajectories") -> list[str]:
    ids = [i for batch in ds.iter_batches(table, columns=["id"]) for i in batch.column(0).to_pylist()]
    repeated = [i for i, n in Counter(ids).items() if n > 1]
    assert not repeated, f"{table}: {len(repeated)} ids written twice, e.g. {repeated[:3]}"
    return ids


def _rows(file: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(file).metadata.num_rows


def assert_tasks_accounted(ds: Dataset, n_tasks: int) -> dict[str, dict]:
    """Every task was committed once and is in the output or quarantined; returns the quarantine rows by task.

    Task ids of one sample per task are `<env task id>#0`; trajectories carry the env task id.
    """
    task_ids = [t for unit in ds.finished_units().values() for t in unit["meta"]["task_ids"]]
    assert len(task_ids) == len(set(task_ids)) == n_tasks, "a task is missing or was committed twice"
    done = {r["provenance"]["task_id"] + "#0" for r in ds.iter_rows()}
    quarantined = {r["location"].removeprefix("task "): r for r in ds.iter_rows("quarantine")}
    assert done | set(quarantined) == set(task_ids), "a task is neither in the output nor quarantined"
    assert not done & set(quarantined), "a task is both in the output and quarantined"
    assert ds.count() + ds.count("quarantine") + ds.count("filtered") == n_tasks
    return quarantined
