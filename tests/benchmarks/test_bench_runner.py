"""The benchmark suite runner: one child process per benchmark, rows for every outcome, the summary table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import mcts
from benchmarks.__main__ import (
    SUITE,
    Benchmark,
    Figure,
    export_rows,
    figures_of,
    llm_rows,
    markdown_table,
    run_suite,
    write_summary,
)

# Stand-ins for benchmark modules: each takes the path of its results file as its only argument.
STUBS = {
    "ok": """
import json, sys
rows = [
    {"figure": "widgets/s", "value": 120.0, "unit": "w/s", "reference": 100.0, "reference_name": "limit",
     "ratio": 1.2, "target": ">= 1", "passed": True},
    {"figure": "peak RSS", "value": 300.0, "unit": "MiB", "reference": 200.0, "reference_name": "limit",
     "ratio": 1.5, "target": "< 200", "passed": False},
    {"figure": "vs peer", "value": 5.0, "unit": "w/s", "reference": None, "reference_name": "", "ratio": None,
     "target": ">= 1", "passed": None, "note": "peer not installable"},
]
open(sys.argv[1], "w").write(json.dumps({"benchmark": "ok", "rows": rows}))
""",
    "shape": """
import json, sys
open(sys.argv[1], "w").write(json.dumps({"speed": 42.0, "ideal": 50.0}))
""",
    "boom": """
import sys
print("working ...")
raise SystemExit("boom: the input was missing")
""",
    "nogpu": """
print("cannot run: vllm not installed")
raise SystemExit(2)
""",
    "slow": """
import time
time.sleep(30)
""",
}


@pytest.fixture()
def stubs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = tmp_path / "stubbench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, code in STUBS.items():
        (pkg / f"{name}.py").write_text(code)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path / "results"


def bench(name: str, results: Path, **kw) -> Benchmark:
    return Benchmark(name, f"stubbench.{name}", (str(results / f"{name}.json"),), **kw)


def test_every_outcome_gets_a_row(stubs: Path) -> None:
    stubs.mkdir()
    (stubs / "boom.json").write_text(json.dumps({"rows": [{"figure": "stale", "value": 1}]}))  # a previous run's

    def shape(name: str, payload: dict) -> list[Figure]:
        return [Figure(name, "speed", payload["speed"], "x/s", payload["ideal"], "ideal", ">= 0.95",
                       payload["speed"] / payload["ideal"] >= 0.95)]

    suite = [bench("ok", stubs), bench("shape", stubs, extract=shape), bench("boom", stubs),
             bench("nogpu", stubs), bench("slow", stubs, timeout_s=1)]
    figures = run_suite(suite, results_dir=stubs, echo=False)
    by = {(f.benchmark, f.metric): f for f in figures}

    assert by["ok", "widgets/s"].result == "pass" and by["ok", "widgets/s"].ratio == pytest.approx(1.2)
    assert by["ok", "peak RSS"].result == "miss"
    assert by["ok", "vs peer"].result == "peer not installable"
    assert by["shape", "speed"].result == "miss" and by["shape", "speed"].ratio == pytest.approx(0.84)
    assert by["boom", "(all)"].result == "failed: exit 1: boom: the input was missing"
    assert ("boom", "stale") not in by
    assert by["nogpu", "(all)"].result == "cannot run: vllm not installed"
    assert by["slow", "(all)"].result == "failed: no result within 1 s"
    assert by["ok", "wall time of the benchmark"].value > 0
    assert "working ..." in (stubs / "boom.log").read_text()

    table = write_summary(figures, full=False, results_dir=stubs).read_text()
    assert "| ok | widgets/s | 120 w/s | 100 w/s (limit) | 1.2 | >= 1 | pass |" in table
    assert "| nogpu | (all) | - | - | - | - | cannot run: vllm not installed |" in table
    assert table.count("\n| ") == len(figures) + 1  # header + one line per figure


def test_results_that_cannot_be_read_say_so(stubs: Path) -> None:
    [figure] = run_suite([bench("shape", stubs)], results_dir=stubs, echo=False)
    assert figure.result.startswith("failed: results not understood")


def test_cannot_run_written_into_the_results_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "stubgpu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "gpu.py").write_text("import json, sys\nopen(sys.argv[1], 'w').write(json.dumps("
                                "{'cannot_run': 'no CUDA device'}))\nprint('cannot run: no CUDA device')\n"
                                "raise SystemExit(2)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    out = tmp_path / "results"
    [figure] = run_suite([Benchmark("gpu", "stubgpu.gpu", (str(out / "gpu.json"),))], results_dir=out, echo=False)
    assert figure.result == "cannot run: no CUDA device"


def test_extractors_of_the_suite() -> None:
    export = export_rows("export", {"rows": [
        {"records": 1000, "export_records_per_s": 900.0, "pyarrow_records_per_s": 3000.0,
         "export_peak_rss_mb": 200.0, "pyarrow_peak_rss_mb": 100.0},
        {"records": 9000, "export_records_per_s": 950.0, "pyarrow_records_per_s": 3100.0,
         "export_peak_rss_mb": 260.0, "pyarrow_peak_rss_mb": 101.0},
    ]})
    growth = export[-1]
    assert growth.metric == "peak RSS growth 1,000 -> 9,000 records" and growth.result == "miss"
    assert growth.ratio == pytest.approx(1.3)

    llm = llm_rows("llm", {"ideal_rps": 100.0, "trajforge": {"rps": 97.0},
                           "distilabel": {"error": "could not install distilabel"}, "curator": {"rps": 50.0}})
    assert [f.result for f in llm] == ["pass", "cannot run: distilabel: could not install distilabel", "pass"]

    # benchmarks.mcts writes plain rows: the runner reads them with no extractor; only the judged latency has a target.
    res = {"zero_latency": {"env_steps_per_s": 10.0, "nodes_per_s": 5.0}, "with_latency": [
        {"latency_s": 0.05, "wall_s": 3.0, "critical_path_s": 2.0, "wall_over_critical_path": 1.5},
        {"latency_s": mcts.TARGET_LATENCY, "wall_s": 2.4, "critical_path_s": 2.0, "wall_over_critical_path": 1.2}]}
    bench = next(b for b in SUITE if b.name == "mcts")
    figures = figures_of(bench, {"rows": mcts.rows(res)})
    assert [f.result for f in figures] == ["", "", "", "miss"] and figures[-1].target == "< 1.1"
    assert "| mcts | env steps/s, zero-latency model | 10.0 steps/s | - | - | - | - |" in markdown_table(figures)
