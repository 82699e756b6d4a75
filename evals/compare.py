"""`trajforge eval compare A B`: two evals of the same tasks, task by task, with a paired bootstrap interval.

The difference is B - A in pass@1 per task (a task's success rate over its samples), over the
tasks both evals scored; its mean and a 95% paired bootstrap interval (tasks resampled, seeded).
The same per task group (a MiniWoB page over its seeds), and the change of each failure
criterion. Evals of different splits, environments or task sources are compared all the same,
with a warning: the tasks in common are still paired by id.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from evals.metrics import mean, paired_bootstrap
from evals.report import load_report, num, pct
from schemas.outdir import check_output_dir

COMPARE = "compare.json"


def compare(a: dict[str, Any], b: dict[str, Any], *, seed: int = 0) -> dict[str, Any]:
    """The comparison of report `b` against report `a` (both as `evals.report.build_report` writes them)."""
    rows_a = {r["task"]: r for r in a["per_task"] if r["pass@1"] is not None}
    rows_b = {r["task"]: r for r in b["per_task"] if r["pass@1"] is not None}
    common = sorted(set(rows_a) & set(rows_b))
    per_task = [{"task": t, "group": rows_a[t]["group"], "a": rows_a[t]["pass@1"], "b": rows_b[t]["pass@1"],
                 "delta": rows_b[t]["pass@1"] - rows_a[t]["pass@1"]} for t in common]
    warnings = [f"{what} differs: {a[key]!r} vs {b[key]!r}" for key, what in
                (("split", "split"), ("env", "environment"), ("task_source", "task source"), ("samples", "samples"))
                if a.get(key) != b.get(key)]
    interval = paired_bootstrap([r["delta"] for r in per_task], seed=seed).as_dict() if per_task else None
    groups: dict[str, dict[str, list[float]]] = {}
    for r in per_task:
        g = groups.setdefault(r["group"], {"a": [], "b": []})
        g["a"].append(r["a"])
        g["b"].append(r["b"])
    criteria = sorted(set(a["failures"]["by_criterion"]) | set(b["failures"]["by_criterion"]))
    return {
        "a": {"output": a["output"], "model": a["model"], "pass@1": a["pass@1"], "split": a["split"]},
        "b": {"output": b["output"], "model": b["model"], "pass@1": b["pass@1"], "split": b["split"]},
        "tasks_in_common": len(common), "only_in_a": len(set(rows_a) - set(rows_b)),
        "only_in_b": len(set(rows_b) - set(rows_a)),
        "pass@1_common": {"a": mean([r["a"] for r in per_task]), "b": mean([r["b"] for r in per_task])},
        "delta": interval, "warnings": warnings,
        "groups": [{"group": g, "tasks": len(v["a"]), "a": mean(v["a"]), "b": mean(v["b"]),
                    "delta": (mean(v["b"]) or 0.0) - (mean(v["a"]) or 0.0)} for g, v in groups.items()],
        "failures": {c: {"a": a["failures"]["by_criterion"].get(c, 0), "b": b["failures"]["by_criterion"].get(c, 0)}
                     for c in criteria},
        "per_task": per_task,
    }


def compare_dirs(a: str | Path, b: str | Path, *, seed: int = 0) -> dict[str, Any]:
    return compare(load_report(a), load_report(b), seed=seed)


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    d = result["delta"]
    rows = [("A", f"{result['a']['model']} ({result['a']['output']})"),
            ("B", f"{result['b']['model']} ({result['b']['output']})"),
            ("tasks in common", str(result["tasks_in_common"])),
            ("pass@1 A -> B (tasks in common)",
             f"{pct(result['pass@1_common']['a'])} -> {pct(result['pass@1_common']['b'])}")]
    if d is not None:
        rows.append((f"difference B - A ({int(100 * d['level'])}% paired bootstrap interval)",
                     f"{100 * d['mean']:+.1f} points [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"))
    if result["only_in_a"] or result["only_in_b"]:
        rows.append(("tasks scored by one side only", f"A: {result['only_in_a']}, B: {result['only_in_b']}"))
    return rows


def markdown(result: dict[str, Any], plot: str | None = None, title: str = "Comparison") -> str:
    lines = [f"# {title}", "", "| what | value |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b in summary_rows(result)]
    lines += [f"\n**Warning**: {w}" for w in result["warnings"]]
    lines += ["", "| task | tasks | pass@1 A | pass@1 B | difference |", "|---|---|---|---|---|"]
    lines += [f"| {g['group']} | {g['tasks']} | {pct(g['a'])} | {pct(g['b'])} | {100 * g['delta']:+.1f} |"
              for g in result["groups"]]
    if result["failures"]:
        lines += ["", "| failed criterion | A | B |", "|---|---|---|"]
        lines += [f"| {c} | {v['a']} | {v['b']} |" for c, v in result["failures"].items()]
    if plot:
        lines += ["", f"![pass@1 per task]({plot})"]
    return "\n".join(lines) + "\n"


def check_compare_output(out: Path) -> None:
    """Refuse an output that is a file or a non-empty directory no compare wrote (ForeignDirError)."""
    check_output_dir(out, COMPARE, "a comparison trajforge wrote")


def write_compare(out: Path, result: dict[str, Any], labels: tuple[str, str] = ("A", "B")) -> None:
    """compare.json (first: the mark of a directory compare wrote), compare.csv, compare.md and the plot."""
    from evals.plots import before_after

    check_compare_output(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / COMPARE).write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    with (out / "compare.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["task", "group", "pass@1_a", "pass@1_b", "delta"])
        for r in result["per_task"]:
            writer.writerow([r["task"], r["group"], num(r["a"], 4), num(r["b"], 4), num(r["delta"], 4)])
    drawn = before_after(result["groups"], out / "plots" / "compare.png", "pass@1 per task", labels)
    (out / "compare.md").write_text(markdown(result, "plots/compare.png" if drawn else None), encoding="utf-8")
