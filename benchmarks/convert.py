"""Convert throughput: trajforge's conversion path and Beam pipeline vs the parse-only limit.

`python -m benchmarks.convert [--records N]` builds a JSONL input of N records (the shipped ADP
sample_std records repeated with unique ids; default 20,000, about 500 MiB; use
`--records 200000` for the full size), then measures
  (a) parse-only: read the file line by line with orjson and do nothing else (the limit);
  (b) the conversion path in one process: read + parse + converter + Arrow batch + staged
      Parquet shards, the duplicate decision, and the commit (`convert_chunk`, `positions` +
      `pick_losers`, `write_unit`: exactly what the pipeline's steps run, minus Beam);
  (c) the full Beam pipeline (`run_convert`, what `trajforge convert` runs: FnApiRunner, by
      default in-process like the CLI; `--beam-workers 2` for worker processes).
The ratio (b)/(a) is the per-core figure against the target; (c)/(a) is also printed. Both
are also given in CPU seconds of this process, which a busy machine disturbs less.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from benchmarks._common import peak_rss_mb, print_rows, row, write_results

ROOT = Path(__file__).resolve().parent.parent

TARGET = 0.5
ADP_DIR = ROOT / "samples" / "adp"


def build_input(path: Path, n: int, adp_dir: Path = ADP_DIR) -> int:
    """N records cycling through the ADP samples, each with a unique id; returns bytes written."""
    samples = [r for f in sorted(adp_dir.glob("*/sample_std.json")) for r in orjson.loads(f.read_bytes())]
    if not samples:
        raise SystemExit(f"no ADP samples under {adp_dir}")
    with open(path, "wb") as fh:
        for i in range(n):
            record = dict(samples[i % len(samples)])
            record["id"] = f"{record['id']}-bench{i}"
            fh.write(orjson.dumps(record) + b"\n")
    return path.stat().st_size


def parse_only(path: Path) -> tuple[int, float, float]:
    """(records, wall seconds, CPU seconds) of reading and parsing every line."""
    loads = orjson.loads
    n = 0
    t0, c0 = time.perf_counter(), time.process_time()
    with open(path, "rb") as fh:
        for line in fh:
            loads(line)
            n += 1
    return n, time.perf_counter() - t0, time.process_time() - c0


def conversion_path(
    path: Path, out: Path, source: str, chunk_size: int
) -> tuple[Counter[str], float, float, dict[str, float]]:
    """The pipeline's steps in-process and sequential (no Beam), timed by phase.

    Returns (counts, wall seconds, CPU seconds, seconds per phase).
    """
    from converters.registry import get_converter
    from pipelines.convert_work import convert_chunk, pick_losers, positions, write_unit
    from pipelines.inputs import plan_chunks
    from schemas.store import DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS, Dataset

    fn = get_converter(source).fn
    t0, c0 = time.perf_counter(), time.process_time()
    ds = Dataset.create(out, stage="convert", overwrite=True)
    spill = out / ".tmp-bench-spill"
    spill.mkdir()
    totals: Counter[str] = Counter()
    phases = {"plan": 0.0, "read+parse+convert+batch+stage shards": 0.0, "duplicate decision": 0.0, "commit": 0.0}
    t = time.perf_counter()
    chunks = plan_chunks([str(path)], chunk_size)
    phases["plan"] = time.perf_counter() - t
    t = time.perf_counter()
    limits = {"max_rows": DEFAULT_MAX_ROWS, "max_bytes": DEFAULT_MAX_BYTES}
    results = [convert_chunk(chunk, fn, ds, spill, **limits) for chunk in chunks]
    phases["read+parse+convert+batch+stage shards"] = time.perf_counter() - t
    t = time.perf_counter()
    by_id: dict[str, list[Any]] = {}
    for result in results:
        for id_, position in positions(result):
            by_id.setdefault(id_, []).append(position)
    losers: dict[str, list[int]] = {}
    for item in by_id.items():
        for unit, seq in pick_losers(item):
            losers.setdefault(unit, []).append(seq)
    phases["duplicate decision"] = time.perf_counter() - t
    t = time.perf_counter()
    for result in results:
        totals.update(write_unit(result, ds, losers.get(result.unit, ()), **limits))
    phases["commit"] = time.perf_counter() - t
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    shutil.rmtree(spill)
    return totals, elapsed, cpu, {k: round(v, 2) for k, v in phases.items()}


def converter_share(path: Path, source: str, sample: int = 2000) -> dict[str, float]:
    """Microseconds per record of each step on the first `sample` records (explains the ratio)."""
    from converters.registry import get_converter
    from pipelines.columns import trajectories_to_batch

    fn = get_converter(source).fn
    with open(path, "rb") as fh:
        lines = [fh.readline() for _ in range(sample)]
    lines = [line for line in lines if line]
    trajectories_to_batch([fn(orjson.loads(line)) for line in lines[:100]])  # one-time costs (imports, allocator)
    t = time.perf_counter()
    raws = [orjson.loads(line) for line in lines]
    t_parse = time.perf_counter() - t
    t = time.perf_counter()
    trajs = [fn(r) for r in raws]
    t_conv = time.perf_counter() - t
    t = time.perf_counter()
    trajectories_to_batch(trajs)
    t_rows = time.perf_counter() - t
    per = 1e6 / len(lines)
    return {"parse_us": round(t_parse * per), "converter_us": round(t_conv * per), "arrow_rows_us": round(t_rows * per)}


def beam_pipeline(path: Path, out: Path, source: str, chunk_size: int, workers: int) -> tuple[Counter[str], float]:
    from pipelines.convert import run_convert

    args = [] if workers <= 1 else [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    summary = run_convert(source, [str(path)], str(out), chunk_size=chunk_size, beam_args=args, overwrite=True)
    return summary.counts, summary.seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000, help="input size (200000 for the full run)")
    parser.add_argument("--chunk-size", type=int, default=5000)
    parser.add_argument("--beam-workers", type=int, default=1,
                        help="FnApiRunner worker processes (1: in-process, as `trajforge convert` runs; 0: skip Beam)")
    parser.add_argument("--source", default="adp")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="trajforge-bench-convert-"))
    try:
        path = tmp / "input.jsonl"
        t = time.perf_counter()
        size = build_input(path, args.records)
        print(f"input: {args.records:,} records, {size / 2**20:,.0f} MiB ({time.perf_counter() - t:.1f}s to build)")
        parse_only(path)  # warm the page cache so both readers start equal
        n, t_parse, cpu_parse = parse_only(path)
        parse_rate = n / t_parse
        print(f"(a) parse-only (orjson, line by line): {parse_rate:,.0f} records/s ({t_parse:.1f}s, "
              f"{cpu_parse:.1f} CPU s)")

        steps = converter_share(path, args.source)
        print(f"    per record on 2,000 records: {steps}")

        counts, t_path, cpu_path, phases = conversion_path(path, tmp / "out-path", args.source, args.chunk_size)
        assert counts["in"] == n == counts["out"] + counts["quarantined"] + counts["duplicate"], counts
        path_rate = n / t_path
        ratio = path_rate / parse_rate
        cpu_ratio = cpu_parse / cpu_path
        print(f"(b) conversion path (1 process): {path_rate:,.0f} records/s ({t_path:.1f}s; {phases}); "
              f"ratio {ratio:.2f} (target >= {TARGET}); in CPU seconds {cpu_ratio:.2f}")
        shutil.rmtree(tmp / "out-path")

        beam: dict[str, Any] = {}
        if args.beam_workers > 0:
            counts_b, t_beam = beam_pipeline(path, tmp / "out-beam", args.source, args.chunk_size, args.beam_workers)
            assert counts_b["in"] == n and counts_b["out"] == counts["out"], counts_b
            beam_rate = n / t_beam
            beam = {"records_per_s": round(beam_rate), "seconds": round(t_beam, 2), "workers": args.beam_workers,
                    "ratio_vs_parse_only": round(beam_rate / parse_rate, 3)}
            print(f"(c) Beam pipeline (FnApiRunner, {args.beam_workers} worker process(es)): {beam_rate:,.0f} "
                  f"records/s ({t_beam:.1f}s); ratio vs parse-only {beam_rate / parse_rate:.2f}")
        reference = "parse-only: orjson.loads per line, 1 process"
        rows = [
            row("parse-only (reference)", parse_rate, "records/s"),
            row("conversion path, 1 process", path_rate, "records/s", parse_rate, reference,
                f">= {TARGET}", ratio >= TARGET),
        ]
        if beam:
            rows.append(row(f"Beam pipeline, FnApiRunner x{args.beam_workers}", beam["records_per_s"], "records/s",
                            parse_rate, reference, "", None))
        print_rows("convert throughput", rows)
        path_out = write_results(
            "convert", rows, records=n, input_mib=round(size / 2**20, 1), source=args.source,
            chunk_size=args.chunk_size, reference={"name": reference, "records_per_s": round(parse_rate)},
            ratio=round(ratio, 3), cpu_ratio=round(cpu_ratio, 3), target=TARGET,
            conversion_path={"seconds": round(t_path, 2), "cpu_seconds": round(cpu_path, 2), "phases_s": phases,
                             "per_record_us": steps},
            beam_pipeline=beam, peak_rss_mib={"driver": round(peak_rss_mb(), 1)},
        )
        print(f"results: {path_out}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
