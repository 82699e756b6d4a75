"""Shared benchmark plumbing: peak memory, timing, and the JSON results file."""

from __future__ import annotations

import json
import platform
import resource
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).with_name("results")


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


def row(figure: str, value: float, unit: str, reference: float | None = None, reference_name: str = "",
        target: str = "", passed: bool | None = None) -> dict[str, Any]:
    ratio = value / reference if reference else None
    return {
        "figure": figure,
        "value": round(value, 3),
        "unit": unit,
        "reference": round(reference, 3) if reference is not None else None,
        "reference_name": reference_name,
        "ratio": round(ratio, 3) if ratio is not None else None,
        "target": target,
        "passed": passed,
    }


def print_rows(title: str, rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("figure", "value", "unit", "reference", "ratio", "target", "passed"):
        table.add_column(column)
    for r in rows:
        table.add_row(*(str(r.get(c, "")) if r.get(c) is not None else "-" for c in
                        ("figure", "value", "unit", "reference", "ratio", "target", "passed")))
    Console().print(table)


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))
