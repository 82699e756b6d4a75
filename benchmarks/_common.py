"""Shared benchmark plumbing: peak memory, timing, and the JSON results file."""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

RESULTS_DIR = Path(__file__).with_name("results")
VENVS_DIR = Path(__file__).with_name(".venvs")
FLAT_RSS = 1.2  # "flat" memory: peak RSS at the largest size at most this many times the smallest's


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Timer:
    def __enter__(self) -> "Timer":
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self.start


def write_results(name: str, rows: list[dict[str, Any]], **extra: Any) -> Path:
    """Write `benchmarks/results/<name>.json`: one row per figure with its reference, ratio and target."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {
        "benchmark": name,
        "machine": {"python": platform.python_version(), "cpus": _cpus(), "platform": platform.platform()},
        "rows": rows,
        **extra,
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def row(figure: str, value: float | None, unit: str, reference: float | None = None, reference_name: str = "",
        target: str = "", passed: bool | None = None, note: str = "") -> dict[str, Any]:
    """One figure; `note` says why a figure with a target has no verdict (e.g. the peer could not run)."""
    ratio = value / reference if reference and value is not None else None
    return {
        "figure": figure,
        "value": round(value, 3) if value is not None else None,
        "unit": unit,
        "reference": round(reference, 3) if reference is not None else None,
        "reference_name": reference_name,
        "ratio": round(ratio, 3) if ratio is not None else None,
        "target": target,
        "passed": passed,
        "note": note,
    }


def rss_growth_row(points: list[tuple[int, float]]) -> dict[str, Any]:
    """Peak RSS at the largest size against the smallest: the check that memory stays flat as input grows."""
    (n0, rss0), (n1, rss1) = min(points), max(points)
    return row(f"peak RSS growth {n0:,} -> {n1:,} records", rss1, "MiB", rss0, f"peak RSS at {n0:,}",
               f"<= {FLAT_RSS}x", rss1 <= FLAT_RSS * rss0)


def ensure_venv(name: str, requirements: list[str]) -> Path:
    """The python of a private venv under benchmarks/.venvs (git-ignored) for a peer; created once.

    Raises RuntimeError with pip's last words when the peer cannot be installed (e.g. offline).
    """
    py = VENVS_DIR / name / "bin" / "python"
    stamp = VENVS_DIR / name / ".installed"
    if stamp.exists() and stamp.read_text() == " ".join(requirements):
        return py
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENVS_DIR / name)], check=True)
    print(f"installing {' '.join(requirements)} into {VENVS_DIR / name} ...", flush=True)
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", *requirements], capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise RuntimeError(f"could not install {' '.join(requirements)}: {last}")
    stamp.write_text(" ".join(requirements))
    return py


def print_rows(title: str, rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("figure", "value", "unit", "reference", "ratio", "target", "passed", "note"):
        table.add_column(column)
    for r in rows:
        table.add_row(*(str(r.get(c, "")) if r.get(c) is not None else "-" for c in
                        ("figure", "value", "unit", "reference", "ratio", "target", "passed", "note")))
    Console().print(table)


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def main_over_records(name: str, title: str, run: Callable[[int, Path], list[dict[str, Any]]],
                      argv: list[str] | None, description: str, default_records: int = 1_000_000
                      ) -> list[dict[str, Any]]:
    """A benchmark whose only option is `--records`: `run(records, workdir)` in a temp dir removed
    afterwards, then the table and `results/NAME.json`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--records", type=int, default=default_records)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix=f"trajforge-bench-{name}-"))
    try:
        rows = run(args.records, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_rows(f"{title} ({args.records:,} trajectories)", rows)
    path = write_results(name, rows, records=args.records)
    print(f"results: {path}")
    return rows
