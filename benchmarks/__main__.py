"""Run the benchmark suite and write `benchmarks/results/summary.md`.

`python -m benchmarks [--full] [--only NAME ...]`

Each benchmark runs as `python -m benchmarks.NAME ARGS` in its own process (a failure or a missing
dependency stays local, and peak RSS is that benchmark's own), writes `results/NAME.json`, and its
output goes to `results/NAME.log`. The summary has one row per figure: what was measured, the
reference measured in the same run, their ratio, the target and whether it was met. A benchmark
that cannot run, fails or times out still gets a row that says why.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmarks._common import FLAT_RSS, RESULTS_DIR

ROOT = Path(__file__).resolve().parent.parent
CANNOT_RUN = "cannot run:"


@dataclass(frozen=True)
class Figure:
    """One row of the summary."""

    benchmark: str
    metric: str
    value: float | None = None
    unit: str = ""
    reference: float | None = None
    reference_name: str = ""
    target: str = ""
    passed: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.reference:
            return None
        return self.value / self.reference

    @property
    def result(self) -> str:
        if self.passed is not None:
            return "pass" if self.passed else "miss"
        if self.note:
            return self.note
        return "not measured" if self.target else ""


Extractor = Callable[[str, dict[str, Any]], list[Figure]]


@dataclass(frozen=True)
class Benchmark:
    name: str
    module: str
    args: tuple[str, ...] = ()
    full_args: tuple[str, ...] = ()
    extract: Extractor | None = None  # for results that are not a list of `_common.row` rows
    timeout_s: float = 1800
    full_timeout_s: float = 4 * 3600


# --- reading each benchmark's JSON ------------------------------------------------------------


def common_rows(name: str, payload: dict[str, Any]) -> list[Figure]:
    """Rows written with `benchmarks._common.row`."""
    return [
        Figure(name, r["figure"], r.get("value"), r.get("unit", ""), r.get("reference"), r.get("reference_name", ""),
               r.get("target", ""), r.get("passed"), r.get("note", ""))
        for r in payload["rows"]
    ]


def export_rows(name: str, payload: dict[str, Any]) -> list[Figure]:
    """The export scaling curve: records/s and peak RSS per size, and the growth of peak RSS."""
    out: list[Figure] = []
    rows = payload["rows"]
    for r in rows:
        n = f"{r['records']:,}"
        out.append(Figure(name, f"trl-sft export, {n} records", r["export_records_per_s"], "records/s",
                          r["pyarrow_records_per_s"], "bare pyarrow read", r.get("target", ""), r.get("passed")))
        out.append(Figure(name, f"peak RSS, {n} records", r["export_peak_rss_mb"], "MiB",
                          r["pyarrow_peak_rss_mb"], "bare pyarrow read"))
    if len(rows) > 1:
        out.append(rss_growth(name, [(r["records"], r["export_peak_rss_mb"]) for r in rows]))
    return out


def rss_growth(name: str, points: Sequence[tuple[int, float]]) -> Figure:
    """Peak RSS at the largest size against the smallest: the streaming check of a scaling curve."""
    (n0, rss0), (n1, rss1) = min(points), max(points)
    return Figure(name, f"peak RSS growth {n0:,} -> {n1:,} records", rss1, "MiB", rss0, f"peak RSS at {n0:,}",
                  f"<= {FLAT_RSS}x", rss1 <= FLAT_RSS * rss0)


def llm_rows(name: str, payload: dict[str, Any]) -> list[Figure]:
    """trajforge's request rate against the ideal capacity / latency, and against each peer."""
    ideal = payload["ideal_rps"]
    ours = payload["trajforge"]
    bound = payload.get("job_bound_rps")
    reference = "ideal capacity/latency" + (f" (this job's best possible: {bound / ideal:.3f})" if bound else "")
    out = [Figure(name, "trajforge requests/s vs ideal", ours["rps"], "req/s", ideal, reference,
                  ">= 0.95", ours["rps"] / ideal >= 0.95)]
    multi = payload.get("multi_endpoint")
    if multi is not None:
        caps = "+".join(str(c) for c in multi["capacities"])
        out.append(Figure(name, f"trajforge requests/s over {len(multi['capacities'])} endpoints ({caps} slots)",
                          multi["rps"], "req/s", multi["ideal_rps"], "sum of the endpoints' capacity/latency",
                          ">= 0.9", multi["rps"] / multi["ideal_rps"] >= 0.9))
    for peer in ("distilabel", "curator"):
        got = payload.get(peer)
        metric = f"trajforge vs {peer}"
        if got is None:
            out.append(Figure(name, metric, target=">= 1", note="not measured (--no-peers)"))
        elif "error" in got:
            out.append(Figure(name, metric, target=">= 1", note=f"{CANNOT_RUN} {peer}: {_short(got['error'])}"))
        else:
            out.append(Figure(name, metric, ours["rps"], "req/s", got["rps"], f"{peer} req/s", ">= 1",
                              ours["rps"] >= got["rps"]))
    return out


SUITE: tuple[Benchmark, ...] = (
    Benchmark("store", "benchmarks.store", ("--records", "100000"), ("--records", "1000000")),
    Benchmark("convert", "benchmarks.convert", ("--records", "20000"), ("--records", "200000")),
    Benchmark("llm_throughput", "benchmarks.llm_throughput", ("--requests", "1024"), ("--requests", "5120"),
              extract=llm_rows),
    Benchmark("mcts", "benchmarks.mcts", (), ("--tasks", "16")),
    # datatrove runs at a few hundred records/s (spacy tokenizer): only on the smallest size. Sizes start
    # at one full shard (50k rows), below which per-shard memory still grows with the input.
    Benchmark("dedup", "benchmarks.dedup", ("--sizes", "50000,150000", "--datatrove-max", "50000"),
              ("--sizes", "250000,500000,1000000", "--datatrove-max", "250000")),
    Benchmark("export", "benchmarks.export", ("--sizes", "10000,30000,100000"), ("--sizes", "100000,300000,1000000"),
              extract=export_rows),
    # The target is about 1M trajectories, so both sizes are 1M (about 2 minutes on 2 cores).
    Benchmark("viewer", "benchmarks.viewer", ("--records", "1000000"), ("--records", "1000000")),
    Benchmark("portable", "benchmarks.portable", ("--records", "20000"), ("--records", "100000")),
    Benchmark("vllm_backend", "benchmarks.vllm_backend", (), ("--prompts", "2000")),
    Benchmark("envs", "benchmarks.envs", (), ("--calls", "2000", "--episodes", "192", "--steps", "600",
                                              "--browser-episodes", "64")),
    Benchmark("token_size", "benchmarks.token_size", ("--records", "300"), ("--records", "3000")),
    Benchmark("decontam", "benchmarks.decontam", ("--records", "50000"), ("--records", "500000")),
    # Rules alone on the quick run; --full adds the embedded SmolLM2 as the judge (about 11 minutes on 2 cores).
    Benchmark("user_fidelity", "benchmarks.user_fidelity", (), ("--embedded",)),
    # The whole eval -> demonstrations -> SFT -> eval loop on SmolLM2-135M: about a quarter of an hour on 2 cores.
    Benchmark("improve", "benchmarks.improve", (), ("--gpu",), timeout_s=3600, full_timeout_s=6 * 3600),
    # One SFT step of that loop three ways (TRL's, shared prefix, shared prefix + LoRA): about 15 minutes.
    Benchmark("train_step", "benchmarks.train_step", (), (), timeout_s=3600, full_timeout_s=3600),
    # Rounds of the model's own data (a warm start on other pages, then rejection sampling): about 45 minutes.
    Benchmark("self_improve", "benchmarks.self_improve", (), (), timeout_s=5400, full_timeout_s=5400),
    # The improve loop's SFT model (about 22 minutes), then GRPO on three pages with its two evals (target 30 minutes).
    Benchmark("grpo", "benchmarks.grpo", (), (), timeout_s=5400, full_timeout_s=5400),
)


# --- running ------------------------------------------------------------------------------------


def figures_of(bench: Benchmark, payload: dict[str, Any]) -> list[Figure]:
    """Rows from a results file; benchmarks that write `_common.row` rows need no extractor."""
    if payload.get("cannot_run"):
        return [Figure(bench.name, "(all)", note=f"{CANNOT_RUN} {payload['cannot_run']}")]
    rows = payload.get("rows")
    if isinstance(rows, list) and rows and all(isinstance(r, dict) and "figure" in r for r in rows):
        return common_rows(bench.name, payload)
    if bench.extract is None:
        raise ValueError("no rows in the results file")
    return bench.extract(bench.name, payload)


def run_one(bench: Benchmark, *, full: bool, results_dir: Path, echo: bool = True) -> list[Figure]:
    """Run one benchmark in a child process and read its figures; never raises for the benchmark's faults."""
    results_dir.mkdir(parents=True, exist_ok=True)
    result_file = results_dir / f"{bench.name}.json"
    result_file.unlink(missing_ok=True)  # a failed run must not report the previous run's numbers
    args = bench.full_args if full else bench.args
    timeout = bench.full_timeout_s if full else bench.timeout_s
    cmd = [sys.executable, "-m", bench.module, *args]
    started = time.perf_counter()
    rc, output, timed_out = _run(cmd, results_dir / f"{bench.name}.log", timeout, bench.name if echo else None)
    seconds = time.perf_counter() - started
    reason = next((line.strip()[len(CANNOT_RUN):].strip() for line in output
                   if line.strip().lower().startswith(CANNOT_RUN)), None)
    if timed_out:
        return [Figure(bench.name, "(all)", note=f"failed: no result within {timeout:.0f} s")]
    if reason:
        return [Figure(bench.name, "(all)", note=f"{CANNOT_RUN} {reason}")]
    if rc != 0 or not result_file.exists():
        last = next((line.strip() for line in reversed(output) if line.strip()), "no output")
        what = f"exit {rc}" if rc != 0 else "no results file"
        return [Figure(bench.name, "(all)", note=f"failed: {what}: {_short(last)}")]
    try:
        figures = figures_of(bench, json.loads(result_file.read_text()))
    except (ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
        return [Figure(bench.name, "(all)", note=f"failed: results not understood ({type(exc).__name__}: {exc})")]
    if not any(f.value is not None for f in figures):
        return figures
    return figures + [Figure(bench.name, "wall time of the benchmark", seconds, "s")]


def _run(cmd: list[str], log: Path, timeout: float, prefix: str | None) -> tuple[int, list[str], bool]:
    """Run `cmd` in its own process group, its output to `log` (and the console); kill the group on timeout."""
    lines: list[str] = []
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, start_new_session=True)
        assert proc.stdout is not None

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                lines.append(line.rstrip("\n"))
                if prefix:
                    print(f"[{prefix}] {line}", end="", flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # the benchmark and whatever it started (servers, peers)
            proc.wait()
        reader.join(timeout=10)
    return proc.returncode, lines, timed_out


def run_suite(benchmarks: Sequence[Benchmark], *, full: bool = False, results_dir: Path = RESULTS_DIR,
              echo: bool = True) -> list[Figure]:
    figures: list[Figure] = []
    for bench in benchmarks:
        if echo:
            print(f"== {bench.name}: python -m {bench.module} {' '.join(bench.full_args if full else bench.args)}",
                  flush=True)
        figures.extend(run_one(bench, full=full, results_dir=results_dir, echo=echo))
    return figures


# --- the summary --------------------------------------------------------------------------------


def _num(value: float) -> str:
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.3g}" if abs(value) < 10 else f"{value:,.1f}"


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def markdown_table(figures: Sequence[Figure]) -> str:
    header = "| benchmark | metric | figure | reference | ratio | target | result |\n|---|---|---|---|---|---|---|\n"
    lines = []
    for f in figures:
        figure = f"{_num(f.value)} {f.unit}".strip() if f.value is not None else "-"
        reference = "-"
        if f.reference is not None:
            reference = f"{_num(f.reference)} {f.unit}".strip() + (f" ({f.reference_name})" if f.reference_name else "")
        ratio = f"{f.ratio:.3g}" if f.ratio is not None else "-"
        cells = (f.benchmark, f.metric, figure, reference, ratio, f.target or "-", f.result or "-")
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return header + "\n".join(lines) + "\n"


def write_summary(figures: Sequence[Figure], *, full: bool, results_dir: Path = RESULTS_DIR) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / "summary.md"
    cpus = len(os.sched_getaffinity(0))
    path.write_text(f"# Benchmark summary\n\n{'full' if full else 'default'} sizes, {cpus} CPUs, "
                    f"{time.strftime('%Y-%m-%d %H:%M')}\n\n" + markdown_table(figures))
    return path


def main(argv: list[str] | None = None) -> int:
    names = [b.name for b in SUITE]
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="the large sizes (hours on a small machine)")
    ap.add_argument("--only", nargs="+", choices=names, metavar="NAME", help=f"some of: {', '.join(names)}")
    args = ap.parse_args(argv)
    chosen = [b for b in SUITE if not args.only or b.name in args.only]
    figures = run_suite(chosen, full=args.full)
    path = write_summary(figures, full=args.full)
    print("\n" + markdown_table(figures))
    print(f"summary: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
