"""Benchmark: near-dedup of synthetic trajectories with planted duplicates, against datatrove.

`python -m benchmarks.dedup [--sizes 250000,500000,1000000] [--records N] [--no-datatrove] [--datatrove-max N]`

For each size: write N synthetic tool-use trajectories (a share of them near duplicates made by
small edits, and exact duplicates that differ only in ids / tool_call_ids / whitespace) as a
trajforge dataset and as JSONL; time `run_dedup` (threshold 0.8, 128 permutations) in a child
process (so peak RSS is per run) and datatrove's MinhashDedupSignature / Buckets / Cluster /
Filter stages on the same texts (its own venv, benchmarks/.venvs/datatrove). Prints throughput,
peak RSS and recall of the planted duplicates for both, the throughput ratio,
and the growth of peak RSS from the smallest to the largest size (flat: at most 1.2x).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from benchmarks._common import ensure_venv, print_rows, row, rss_growth_row, write_results

# What datatrove's minhash steps import without declaring them (spacy: its English word tokenizer).
DT_REQUIREMENTS = ["datatrove==0.10.1", "orjson", "regex", "spacy", "tokenizers", "xxhash"]
VOCAB = [f"{a}{b}" for a in ("ka", "lo", "mi", "ne", "po", "ru", "sa", "ti", "vu", "we", "xo", "ya", "ze", "bi", "cu",
                             "da", "fe", "gi", "ho", "ju")
         for b in range(400)]  # 8000 words


def _words(rng: np.random.Generator, n: int) -> list[str]:
    return [VOCAB[i] for i in rng.integers(0, len(VOCAB), n)]


def _row(ident: str, task: str, query: str, answer: str, call_id: str) -> dict[str, Any]:
    """One trajectory row in the Arrow layout (user task, search call, tool result, answer)."""
    def step(kind: str, **kw: Any) -> dict[str, Any]:
        base = {"kind": kind, "tool_call_id": None, "thought": None, "reasoning": None, "function": None,
                "arguments": None, "language": None, "content": None, "source": None, "name": None, "url": None,
                "html": None, "axtree": None, "image": None, "viewport": None, "reward": None, "label": "unknown",
                "train": True, "extra": None}
        base.update(kw)
        return base

    steps = [
        step("text", content=task, source="user"),
        step("api", function="search", arguments=json.dumps({"query": query}), tool_call_id=call_id),
        step("text", content="results: ok", source="environment", tool_call_id=call_id),
        step("message", content=answer),
    ]
    return {"id": ident, "source": "synthetic", "steps": steps, "tools": [], "reward": 1.0, "success": True,
            "provenance": {k: None for k in ("method", "source_dataset", "source_id", "source_format", "model",
                                              "prompt_template_hash", "seed", "task_id", "trajforge_version",
                                              "created_at")} | {"parent_ids": []},
            "details": None}


def synthetic_rows(n: int, *, near_rate: float = 0.1, exact_rate: float = 0.05, seed: int = 0,
                   words: int = 120) -> Iterator[tuple[dict[str, Any], str | None, str]]:
    """(row, id of the original it duplicates or None, 'near'|'exact'|'') for n rows.

    Originals are random word sequences (pairwise Jaccard ~0). A near duplicate replaces one or two
    consecutive words of its original's answer (true 5-gram Jaccard ~0.9); an exact duplicate has a new id,
    new tool_call_ids and different whitespace.
    """
    rng = np.random.default_rng(seed)
    originals: list[tuple[str, list[str], list[str], list[str]]] = []
    for i in range(n):
        ident = f"syn-{i:08d}"
        r = rng.random()
        if originals and r < near_rate + exact_rate:
            orig_id, task, query, answer = originals[int(rng.integers(0, len(originals)))]
            if r < near_rate:
                # A small edit: one or two consecutive words of the answer replaced.
                answer = list(answer)
                span = int(rng.integers(1, 3))
                at = int(rng.integers(0, len(answer) - span + 1))
                answer[at : at + span] = [VOCAB[int(i)] for i in rng.integers(0, len(VOCAB), span)]
                yield _row(ident, " ".join(task), " ".join(query), " ".join(answer), f"c{i}"), orig_id, "near"
            else:
                yield _row(ident, "  ".join(task) + " ", " ".join(query), " ".join(answer).replace(" ", "\n", 1),
                           f"call-{i}"), orig_id, "exact"
            continue
        task, query, answer = _words(rng, words // 3), _words(rng, 6), _words(rng, words - words // 3 - 6)
        if len(originals) < 200_000:  # duplicates refer back to a bounded window of originals
            originals.append((ident, task, query, answer))
        else:
            originals[int(rng.integers(0, len(originals)))] = (ident, task, query, answer)
        yield _row(ident, " ".join(task), " ".join(query), " ".join(answer), f"c{i}"), None, ""


def write_dataset(path: Path, n: int, *, shard_rows: int = 50_000, seed: int = 0, jsonl: Path | None = None,
                  **kw: Any) -> dict[str, tuple[str, str]]:
    """Write n synthetic rows as a dataset (and JSONL texts for datatrove); return planted dupes."""
    from filters.dedup import batch_texts
    import pyarrow as pa
    from schemas.arrow import TRAJECTORY_SCHEMA
    from schemas.store import Dataset

    ds = Dataset.create(path, stage="synthetic", overwrite=True)
    planted: dict[str, tuple[str, str]] = {}
    fh = open(jsonl, "w") if jsonl else None
    gen = synthetic_rows(n, seed=seed, **kw)
    unit, buffer = 0, []

    def flush() -> None:
        nonlocal unit
        with ds.unit(f"syn-{unit:05d}", max_rows=shard_rows) as u:
            for r in buffer:
                u.write_row("trajectories", r)
        if fh:
            _, texts = batch_texts(pa.RecordBatch.from_pylist(buffer, schema=TRAJECTORY_SCHEMA))
            for r, t in zip(buffer, texts):
                fh.write(json.dumps({"id": r["id"], "text": t}) + "\n")
        unit += 1
        buffer.clear()

    for r, orig, kind in gen:
        buffer.append(r)
        if orig:
            planted[r["id"]] = (orig, kind)
        if len(buffer) >= shard_rows:
            flush()
    if buffer:
        flush()
    if fh:
        fh.close()
    ds.mark_complete()
    return planted


def _recall(out: Path, planted: dict[str, tuple[str, str]]) -> float:
    """Share of planted duplicates that ended in the same cluster as their original."""
    import pyarrow.parquet as pq

    from pipelines.dedup import CLUSTERS_FILE

    where = {m: c["cluster_id"] for c in pq.read_table(out / CLUSTERS_FILE).to_pylist() for m in c["members"]}
    hit = sum(1 for d, (o, _) in planted.items() if d in where and where.get(o) == where[d])
    return hit / max(1, len(planted))


def _dt_recall(work: Path, planted: dict[str, tuple[str, str]]) -> float:
    """datatrove removes all but one per cluster: a planted duplicate is found if it or its original was removed."""
    removed: set[str] = set()
    for f in (work / "removed").glob("*"):
        import gzip

        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt") as fh:
            removed.update(json.loads(line)["id"] for line in fh)
    hit = sum(1 for d, (o, _) in planted.items() if d in removed or o in removed)
    return hit / max(1, len(planted))


def _generate(case: Path, n: int, shard_rows: int) -> dict[str, tuple[str, str]]:
    """Write the inputs in a child process: Linux children inherit the parent's peak RSS
    (ru_maxrss survives fork and exec), so generating here would inflate every measurement."""
    code = (
        "import json; from pathlib import Path; from benchmarks.dedup import write_dataset\n"
        f"p = write_dataset(Path({str(case / 'in')!r}), {n}, shard_rows={shard_rows}, "
        f"jsonl=Path({str(case / 'jsonl' / 'data.jsonl')!r}))\n"
        f"Path({str(case / 'planted.json')!r}).write_text(json.dumps(p))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
    return {k: tuple(v) for k, v in json.loads((case / "planted.json").read_text()).items()}


def _run_ours(src: Path, out: Path, beam_args: list[str]) -> dict[str, Any]:
    code = (
        "import json, time, sys\n"
        "from benchmarks._common import peak_rss_mb\n"
        "from pipelines.dedup import run_dedup\n"
        "t = time.perf_counter()\n"
        f"s = run_dedup({str(src)!r}, {str(out)!r}, overwrite=True, beam_args={beam_args!r})\n"
        "print('RESULT', json.dumps({'seconds': time.perf_counter() - t, 'peak_rss_mb': peak_rss_mb(),"
        " 'kept': s.counts['kept'], 'filtered': s.counts['filtered']}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"dedup run failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def _run_datatrove(py: Path, jsonl_dir: Path, work: Path, workers: int) -> dict[str, Any]:
    """datatrove's stats, or {"error": why} so the results say why the comparison is missing."""
    proc = subprocess.run([str(py), str(Path(__file__).with_name("_dedup_datatrove.py")), str(jsonl_dir),
                           str(work), str(workers)], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"datatrove failed: {proc.stderr[-1500:]}", file=sys.stderr)
        return {"error": f"datatrove exited {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _datatrove_python() -> tuple[Path | None, str]:
    try:
        return ensure_venv("datatrove", DT_REQUIREMENTS), ""
    except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
        return None, str(exc)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=None, help="one size (overrides --sizes)")
    ap.add_argument("--sizes", default="250000,500000,1000000")
    ap.add_argument("--shard-rows", type=int, default=50_000)
    # datatrove's multiprocess pool hangs in sandboxes without a working forkserver; 1 worker is the
    # comparable, reliable default (both sides run the same number of workers).
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--no-datatrove", action="store_true")
    # datatrove tokenizes with spacy (a few hundred records/s on one core): bound its share of a long run.
    ap.add_argument("--datatrove-max", type=int, default=None, help="run datatrove only on sizes up to this")
    ap.add_argument("--workdir", default=None, help="scratch dir (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    sizes = [args.records] if args.records else [int(s) for s in args.sizes.split(",")]
    # Beam in-process with one worker thread per core (numpy and I/O release the GIL).
    beam_args = [f"--direct_num_workers={args.workers}", "--direct_running_mode=multi_threading"]
    rows: list[dict[str, Any]] = []
    rss: list[tuple[int, float]] = []
    peer: dict[str, dict[str, Any]] = {}
    dt_python, dt_missing = (None, "--no-datatrove") if args.no_datatrove else _datatrove_python()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="dedup-bench-"))
    try:
        for n in sizes:
            case = root / str(n)
            shutil.rmtree(case, ignore_errors=True)
            (case / "jsonl").mkdir(parents=True)
            planted = _generate(case, n, args.shard_rows)
            ours = _run_ours(case / "in", case / "out", beam_args)
            rate = n / ours["seconds"]
            recall = _recall(case / "out", planted)
            if args.datatrove_max is not None and n > args.datatrove_max:
                dt = {"error": f"size above --datatrove-max {args.datatrove_max:,}"}
            else:
                dt = _run_datatrove(dt_python, case / "jsonl", case / "dt", args.workers) if dt_python else \
                    {"error": dt_missing}
            why = "" if "error" not in dt else f"datatrove not measured: {dt['error']}"
            dt_rate = n / dt["seconds"] if not why else None
            peer[str(n)] = dt | ({"records_per_s": dt_rate, "ratio": rate / dt_rate} if dt_rate else {})
            print(f"{n:,} records: trajforge {rate:,.0f}/s, {ours['peak_rss_mb']:.0f} MiB, recall {recall:.3f}; "
                  + (f"datatrove {dt_rate:,.0f}/s, {dt['peak_rss_mb']:.0f} MiB, ratio {rate / dt_rate:.2f}" if dt_rate
                     else why), flush=True)
            rows.append(row(f"trajforge dedup {n:,} records", rate, "records/s", dt_rate, "datatrove minhash",
                            ">= 1x datatrove", (rate >= dt_rate) if dt_rate else None, why))
            rows.append(row(f"peak RSS at {n:,}", ours["peak_rss_mb"], "MiB",
                            dt.get("peak_rss_mb"), "datatrove minhash"))
            rows.append(row(f"recall of planted dupes at {n:,}", recall, "fraction",
                            _dt_recall(case / "dt", planted) if dt_rate else None, "datatrove minhash", ">= 0.95",
                            recall >= 0.95))
            rss.append((n, ours["peak_rss_mb"]))
            shutil.rmtree(case, ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    if len(rss) > 1:
        rows.append(rss_growth_row(rss))
    print_rows("near-dedup (MinHash LSH, threshold 0.8, 128 perms)", rows)
    path = write_results("dedup", rows, sizes=sizes, workers=args.workers,
                         peak_rss_mb={str(n): round(mb, 1) for n, mb in rss},
                         datatrove_ratio={n: round(p["ratio"], 3) for n, p in peer.items() if "ratio" in p},
                         datatrove=peer)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
