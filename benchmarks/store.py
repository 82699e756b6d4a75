"""Shard store benchmark: write and read N synthetic trajectories (5-30 steps each).

Prints write and read records/s, peak RSS, and the ratio of the store's read speed to
reading the same Parquet files with bare pyarrow (the limit). Targets: ratio >= 0.5,
peak RSS < 2 GB. Rows are built from a pool of step structs so the figure measures the
store, not the synthetic data generator.

    python -m benchmarks.store [--records 1000000]
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Iterator

import pyarrow.parquet as pq

from benchmarks._common import Timer, main_over_records, peak_rss_mb, row
from schemas.arrow import step_to_row
from schemas.models import ApiAction, CodeAction, MessageAction, TextObservation
from schemas.store import Dataset


def step_pool(rng: random.Random, size: int = 512) -> list[dict[str, Any]]:
    """Step rows to draw from, so a benchmark measures its subject, not the data generator."""
    pool = []
    for i in range(size):
        words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "order", "refund", "user"]) for _ in range(rng.randint(5, 60)))
        kind = i % 4
        if kind == 0:
            step = ApiAction(function=f"tool_{i % 12}", arguments={"query": words[:40], "limit": i % 10}, thought=words[:80])
        elif kind == 1:
            step = TextObservation(content=words, source="environment", name=f"tool_{i % 12}")
        elif kind == 2:
            step = CodeAction(language="python", content=f"print({i})\n# {words}", thought=words[:50])
        else:
            step = MessageAction(content=words)
        pool.append(step_to_row(step))
    return pool


def synthetic_rows(n: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    pool = step_pool(rng)
    for i in range(n):
        yield {
            "id": f"bench/{i}",
            "source": f"source_{i % 7}",
            "steps": [pool[rng.randrange(len(pool))] for _ in range(rng.randint(5, 30))],
            "tools": [],
            "reward": rng.random(),
            "success": i % 3 == 0,
            "provenance": {"method": "synthetic", "seed": seed, "parent_ids": []},
            "details": None,
        }


def _best_of(times: int, read: Any, expected: int) -> Timer:
    best = None
    for _ in range(times):
        with Timer() as timer:
            got = read()
        assert got == expected, (got, expected)
        best = timer if best is None or timer.seconds < best.seconds else best
    return best


def run(records: int, workdir: Path) -> list[dict[str, Any]]:
    ds = Dataset.create(workdir / "ds", stage="bench")
    with Timer() as write:
        with ds.unit("bench") as unit:
            for r in synthetic_rows(records):
                unit.write_row("trajectories", r)
    rss_after_write = peak_rss_mb()
    files = ds.shard_files()
    size_mb = sum(f.stat().st_size for f in files) / 2**20

    def read_bare() -> int:
        return sum(b.num_rows for f in files for b in pq.ParquetFile(f).iter_batches(batch_size=4096))

    def read_store() -> int:
        return sum(b.num_rows for b in ds.iter_batches(batch_size=4096))

    read_bare()  # warm the page cache so neither side pays for the first disk read
    bare, store = _best_of(2, read_bare, records), _best_of(2, read_store, records)
    # Python-object reads for reference: what a consumer iterating dicts gets.
    sample = min(records, 100_000)
    with Timer() as py_rows:
        for n, _ in enumerate(ds.iter_rows(batch_size=4096), 1):
            if n >= sample:
                break
    peak = peak_rss_mb()
    print(f"{records} records, {len(files)} shards, {size_mb:.1f} MiB on disk; peak RSS after write {rss_after_write:.0f} MiB")
    return [
        row("write records/s", records / write.seconds, "rec/s"),
        row("read records/s (store, Arrow batches)", records / store.seconds, "rec/s",
            reference=records / bare.seconds, reference_name="bare pyarrow iter_batches",
            target=">= 0.5", passed=(bare.seconds / store.seconds) >= 0.5),
        row("read records/s (store, Python dicts)", sample / py_rows.seconds, "rec/s"),
        row("peak RSS", peak, "MiB", reference=2048, reference_name="limit 2 GiB", target="< 2048",
            passed=peak < 2048),
    ]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    return main_over_records("store", "store benchmark", run, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
