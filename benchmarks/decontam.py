"""Benchmark: decontamination of synthetic trajectories against benchmark items, next to dedup.

`python -m benchmarks.decontam [--records 50000] [--references 10000] [--planted 500]`

Writes N synthetic tool-use trajectories (benchmarks/dedup.py's generator, no duplicates) and R
benchmark items (random 40-word texts of the same vocabulary); P records get a test item planted:
a third its whole text as their task, a third a 13-word span of it in their answer, a third a
small edit of it as their task (MinHash). Times `run_decontam` (13-grams, threshold 0.8) and, as
the reference measured in the same run on the same shards, `run_dedup` (threshold 0.8, 128
permutations), the stage whose MinHash machinery it shares. Rows: records/s of both and their
ratio (target >= 0.5: decontamination signs the instruction and hashes every 13-gram of the whole
trajectory, where dedup signs one text, and each worker builds the index of the test items),
recall of the planted records (target 1.0) and false drops (target 0).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import row, write_results
from benchmarks.dedup import VOCAB, synthetic_rows


def _plant(rows: list[dict[str, Any]], refs: list[str], planted: int, rng: np.random.Generator) -> dict[str, str]:
    """Put test items into `planted` random rows; returns row id -> how."""
    how: dict[str, str] = {}
    for k, r in enumerate(rng.choice(len(rows), size=planted, replace=False).tolist()):
        ref = refs[k % len(refs)].split()
        steps = rows[r]["steps"]
        if k % 3 == 0:
            steps[0]["content"] = " ".join(ref)
            how[rows[r]["id"]] = "exact"
        elif k % 3 == 1:
            start = int(rng.integers(0, len(ref) - 13))
            steps[3]["content"] = f"{steps[3]['content']} {' '.join(ref[start:start + 13])}"
            how[rows[r]["id"]] = "n-gram"
        else:
            edited = list(ref)
            edited[int(rng.integers(0, len(ref)))] = VOCAB[int(rng.integers(0, len(VOCAB)))]
            steps[0]["content"] = " ".join(edited)
            how[rows[r]["id"]] = "similar"
    return how


def _dataset(path: Path, n: int, refs: list[str], planted: int, shard_rows: int) -> dict[str, str]:
    from schemas.store import Dataset

    rng = np.random.default_rng(1)
    rows = [r for r, _, _ in synthetic_rows(n, near_rate=0.0, exact_rate=0.0, seed=0)]
    how = _plant(rows, refs, planted, rng)
    ds = Dataset.create(path, stage="synthetic", overwrite=True)
    for unit, start in enumerate(range(0, n, shard_rows)):
        with ds.unit(f"syn-{unit:05d}", max_rows=shard_rows) as u:
            for r in rows[start:start + shard_rows]:
                u.write_row("trajectories", r)
    ds.mark_complete()
    return how


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.decontam", description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--references", type=int, default=10_000)
    ap.add_argument("--planted", type=int, default=501)
    ap.add_argument("--shard-rows", type=int, default=25_000)
    args = ap.parse_args(argv)

    from filters.decontam import Reference
    from pipelines.decontam import run_decontam
    from pipelines.dedup import run_dedup
    from schemas.store import Dataset

    rng = np.random.default_rng(2)
    refs = [" ".join(VOCAB[i] for i in rng.integers(0, len(VOCAB), 40)) for _ in range(args.references)]
    references = [Reference(f"bench-{i}", "file bench.jsonl", text, text) for i, text in enumerate(refs)]
    work = Path(tempfile.mkdtemp(prefix="trajforge-bench-decontam-"))
    try:
        how = _dataset(work / "in", args.records, refs, args.planted, args.shard_rows)
        started = time.perf_counter()
        summary = run_decontam(str(work / "in"), str(work / "decontam"), references)
        ours = time.perf_counter() - started
        started = time.perf_counter()
        run_dedup(str(work / "in"), str(work / "dedup"))
        dedup = time.perf_counter() - started
        dropped = {f.record.id: f.decision.reason for f in Dataset.open(work / "decontam").iter_records("filtered")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    found = sum(1 for rid in how if rid in dropped)
    false = sum(1 for rid in dropped if rid not in how)
    ours_rps, dedup_rps = args.records / ours, args.records / dedup
    rows = [
        row(f"decontaminate records/s, {args.records:,} records vs {args.references:,} test items", ours_rps,
            "records/s", dedup_rps, "dedup records/s on the same shards", ">= 0.5", ours_rps >= 0.5 * dedup_rps),
        row("recall of planted test items (exact, 13-gram, edited)", found / len(how), "fraction", target="1.0",
            passed=found == len(how)),
        row("records dropped without a planted item", float(false), "records", target="0", passed=false == 0),
    ]
    print(f"decontaminate: {ours_rps:,.0f} records/s ({ours:.1f}s), dedup {dedup_rps:,.0f} records/s ({dedup:.1f}s); "
          f"planted found {found}/{len(how)}, false drops {false}; by kind {summary.counts}")
    print(f"wrote {write_results('decontam', rows, records=args.records, references=args.references)}")


if __name__ == "__main__":
    main()
