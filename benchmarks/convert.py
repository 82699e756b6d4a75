"""Convert throughput: trajforge's conversion path and Beam pipeline vs the parse-only limit.

`python -m benchmarks.convert [--records N]` builds a JSONL input of N records (the shipped ADP
sample_std records repeated with unique ids; default 20,000, about 500 MiB; use
`--records 200000` for the full size), then measures
  (a) parse-only: read the file line by line with orjson and do nothing else (the limit);
  (b) the conversion path in one process: read + parse + converter + Arrow batch + staged
      Parquet shards, the duplicate decision, and the commit (`convert_chunk`, `partitioned_ids`,
      `losers_of_partition`, `write_unit`: exactly what the pipeline's steps run, minus Beam);
  (c) the full Beam pipeline (`run_convert`, what `trajforge convert` runs: FnApiRunner with its
      default worker processes, one per core from 40,000 records; `--workers N` to choose).
Targets: (c)/(a) >= 0.5, the throughput a user gets; (b)/(a) >= 0.3, the per-core figure, also
given in CPU seconds of this process, which a busy machine disturbs less.
"""

from __future__ import annotations

import argparse
import itertools
import os
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
TARGET_ONE_PROCESS = 0.3
REFERENCE = "parse-only: orjson.loads per line, 1 process"
ADP_DIR = ROOT / "samples" / "adp"
# The standardized samples the input cycles through: a fixed set, so results stay comparable as
# samples of more datasets ship (these 19 are 25 KB per record on average).
DATASETS = (
    "agenttuning_alfworld", "agenttuning_db", "agenttuning_kg", "agenttuning_os", "agenttuning_webshop",
    "android_in_the_wild", "code_feedback", "codeactinstruct", "go-browse-wa", "llava_plus", "mini-coder",
    "nebius_SWE-agent-trajectories", "nnetnav-wa", "orca_agentinstruct", "swe-gym_openhands_sampled_trajectories",
    "swe-smith", "synatra", "toucan_1_5m", "webarena_successful",
)


def build_input(path: Path, n: int, adp_dir: Path = ADP_DIR) -> int:
    """N records cycling through the ADP samples, each with a unique id; returns bytes written."""
    files = [adp_dir / name / "sample_std.json" for name in DATASETS]
    samples = [r for f in files if f.exists() for r in orjson.loads(f.read_bytes())]
    if not samples:
        raise SystemExit(f"no ADP samples under {adp_dir}")
    with open(path, "wb") as fh:
        for i in range(n):
            record = dict(samples[i % len(samples)])
            record["id"] = f"{record['id']}-bench{i}"
            fh.write(orjson.dumps(record) + b"\n")
        # On disk before anything is timed: the kernel writing GBs of dirty pages back in the
        # background would slow whichever phase it overlaps.
        fh.flush()
        os.fsync(fh.fileno())
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
    from pipelines.convert import ID_PARTITIONS
    from pipelines.convert_work import convert_chunk, losers_of_partition, partitioned_ids, write_unit
    from pipelines.inputs import plan_chunks
    from schemas.store import DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS, Dataset

    info = get_converter(source)
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
    results = [convert_chunk(chunk, info, ds, spill, **limits) for chunk in chunks]
    phases["read+parse+convert+batch+stage shards"] = time.perf_counter() - t
    t = time.perf_counter()
    groups: dict[int, list[Any]] = {}
    for result in results:
        for part, group in partitioned_ids(result, ID_PARTITIONS):
            groups.setdefault(part, []).append(group)
    losers: dict[str, list[int]] = {}
    for item in groups.items():
        for unit, seq in losers_of_partition(item):
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
    """Microseconds per record of each step on the first `sample` records (explains the ratio).

    Records stream through as in the pipeline (parse; the row without models where the converter
    builds one, else the converter's model and its row; one at a time), timed on a second pass:
    the first pays for touching fresh memory, once per process.
    """
    from converters.registry import get_converter
    from pipelines.columns import BatchBuilder

    info = get_converter(source)
    clock = time.perf_counter
    with open(path, "rb") as fh:
        lines = [line for line in itertools.islice(fh, sample) if line.strip()]
    timings: dict[str, float] = {}
    for _ in range(2):
        spent = [0.0, 0.0, 0.0]
        builder = BatchBuilder()
        models = 0
        for line in lines:
            t0 = clock()
            raw = orjson.loads(line)
            t1 = clock()
            row = info.to_row(raw) if info.to_row is not None else None
            if row is None:
                builder.add(info.fn(raw))
                models += 1
            else:
                builder.add_row(row)
            spent[0] += t1 - t0
            spent[1] += clock() - t1
        t = clock()
        builder.finish()
        spent[2] = clock() - t
        per = 1e6 / len(lines)
        timings = {name: round(v * per) for name, v in zip(("parse_us", "convert_us", "arrow_us"), spent)}
        timings["through_models"] = models
    return timings


def beam_pipeline(
    path: Path, out: Path, source: str, chunk_size: int, workers: int
) -> tuple[Counter[str], float, int]:
    """(counts, wall seconds, worker processes used) of `run_convert`."""
    from pipelines.convert import run_convert

    summary = run_convert(source, [str(path)], str(out), chunk_size=chunk_size, workers=workers, overwrite=True)
    return summary.counts, summary.seconds, summary.workers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000, help="input size (200000 for the full run)")
    parser.add_argument("--chunk-size", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=0,
                        help="pipeline worker processes (0: what `trajforge convert` picks; -1: skip the pipeline)")
    parser.add_argument("--source", default="adp")
    parser.add_argument("--input-dir", default=None,
                        help="where the input is built (default: /dev/shm when it has room, else the temp dir)")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="trajforge-bench-convert-"))
    input_dir = Path(tempfile.mkdtemp(prefix="trajforge-bench-convert-", dir=args.input_dir or _memory_dir(args.records)))
    try:
        path = input_dir / "input.jsonl"
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
              f"ratio {ratio:.2f} (target >= {TARGET_ONE_PROCESS}); in CPU seconds {cpu_ratio:.2f}")
        shutil.rmtree(tmp / "out-path")

        beam: dict[str, Any] = {}
        rows = [
            row("parse-only (reference)", parse_rate, "records/s"),
            row("conversion path, 1 process (per core)", path_rate, "records/s", parse_rate, REFERENCE,
                f">= {TARGET_ONE_PROCESS}", ratio >= TARGET_ONE_PROCESS),
        ]
        if args.workers >= 0:
            counts_b, t_beam, used = beam_pipeline(path, tmp / "out-beam", args.source, args.chunk_size, args.workers)
            assert counts_b["in"] == n and counts_b["out"] == counts["out"], counts_b
            beam_rate = n / t_beam
            beam_ratio = beam_rate / parse_rate
            beam = {"records_per_s": round(beam_rate), "seconds": round(t_beam, 2), "workers": used,
                    "ratio_vs_parse_only": round(beam_ratio, 3)}
            print(f"(c) Beam pipeline (FnApiRunner, {used} worker process(es)): {beam_rate:,.0f} "
                  f"records/s ({t_beam:.1f}s); ratio {beam_ratio:.2f} (target >= {TARGET})")
            rows.append(row(f"convert pipeline, FnApiRunner x{used}", beam["records_per_s"], "records/s",
                            parse_rate, REFERENCE, f">= {TARGET}", beam_ratio >= TARGET))
        print_rows("convert throughput", rows)
        path_out = write_results(
            "convert", rows, records=n, input_mib=round(size / 2**20, 1), input_dir=str(input_dir.parent),
            source=args.source,
            chunk_size=args.chunk_size, reference={"name": REFERENCE, "records_per_s": round(parse_rate)},
            per_core_ratio=round(ratio, 3), per_core_cpu_ratio=round(cpu_ratio, 3), target=TARGET,
            conversion_path={"seconds": round(t_path, 2), "cpu_seconds": round(cpu_path, 2), "phases_s": phases,
                             "per_record_us": steps},
            beam_pipeline=beam, peak_rss_mib={"driver": round(peak_rss_mb(), 1)},
        )
        print(f"results: {path_out}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(input_dir, ignore_errors=True)


def _memory_dir(records: int) -> str | None:
    """/dev/shm when the input fits twice over, else None (the temp dir).

    Every phase reads the same input; from memory, none of them waits on the disk. This machine
    drops file pages from its page cache within a minute even with most memory free, so a disk
    file read warm by the reference would be read partly cold by the phases after it.
    """
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2 * records * 26_000:
        return str(shm)
    return None


if __name__ == "__main__":
    main()
