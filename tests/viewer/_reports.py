"""Eval and improve outputs for the viewer tests, made cheaply but as the commands make them.

The two evals are real `trajforge eval` runs against the fake server (the scripted agent of
tests/evals/test_eval_cli.py: 4 retail tasks x 3 samples, one episode quarantined by a server
error). The improve reports are written the way `flows/improve.py` writes its report.json (its
`_headline`, `evals.compare.compare`, the before / after plot) around those two evals: one as a
single round writes it, one with the `rounds` a multi-round run adds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from backends.fake_server import FakeServer, Rule
from evals.compare import compare
from evals.plots import before_after
from flows.cli import app
from flows.improve import _headline
from tests.evals.test_eval_cli import FIRST, Script, _config

# Baseline: task 0 always solved, task 1 by sample 0 only, task 2 never, task 3 always (its sample 1
# hits a server error); trained: every task but task 2 in every sample.
BASELINE = (lambda i, k: FIRST[i](k), (3, 1))
TRAINED = (lambda i, k: i != 2, None)


def run_eval(out: Path, solved: Any, fail_at: tuple[int, int] | None) -> dict[str, Any]:
    with FakeServer(rules=[Rule(fn=Script(solved, fail_at))]) as server:
        cfg = _config(out.parent / f"{out.name}.yaml", server.base_url)
        result = CliRunner().invoke(app, ["eval", "--config", str(cfg), "--output", str(out), "--samples", "3"])
    assert result.exit_code == 0, result.output
    return json.loads((out / "eval.json").read_text())


def improve_report(root: Path, before: dict[str, Any], after: dict[str, Any],
                   rounds: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """report.json (and plots/before_after.png) of an improve run in `root`, keys as flows/improve.py writes them."""
    result = compare(before, after, seed=0)
    before_after(result["groups"], root / "plots" / "before_after.png", "pass@1 before and after training",
                 ("before", "after"))
    report: dict[str, Any] = {
        "output": str(root), "seconds": 12.5, "stage_seconds": {"baseline": 3.0, "data": 4.0, "train": 5.0, "trained": 0.5},
        "before": _headline(before), "after": _headline(after), "comparison": result,
        "lineage": {"baseline_eval": {"output": before["output"]}, "trained_eval": {"output": after["output"]},
                    "model": {"output": str(root / "model")}},
    }
    if rounds is not None:
        report.update(rounds=rounds, baseline_eval=before["output"], warm_start={"from": "last"})
        before_after(result["groups"], root / "plots" / "rounds.png", "pass@1 per round", ("round 1", "round 2"))
    root.mkdir(parents=True, exist_ok=True)
    (root / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def build(root: Path) -> dict[str, Any]:
    """root/improve (one round, as written today) and root/improve-rounds (two rounds), sharing the evals."""
    one = root / "improve"
    one.mkdir(parents=True)
    before = run_eval(one / "eval-baseline", *BASELINE)
    after = run_eval(one / "eval-trained", *TRAINED)
    single = improve_report(one, before, after)
    delta = single["comparison"]["delta"]
    rounds = [
        {"round": 1, "pass@1": before["pass@1"], "vs_baseline": {"mean": 0.0, "low": 0.0, "high": 0.0},
         "vs_previous": None, "train_pass_at_k": {"k": 4, "value": 0.5}, "rows": {"demonstrations": 8},
         "stage_seconds": {"data": 1.0, "train": 2.0, "eval": 0.5}, "eval": before["output"], "model": str(root / "m1"),
         "trains_from": "base"},
        {"round": 2, "pass@1": after["pass@1"], "vs_baseline": {k: delta[k] for k in ("mean", "low", "high")},
         "vs_previous": {k: delta[k] for k in ("mean", "low", "high")}, "train_pass_at_k": {"k": 4, "value": None},
         "rows": {"demonstrations": 8, "rollout": 5}, "stage_seconds": {"data": 1.5, "train": 2.5, "eval": 0.5},
         "eval": after["output"], "model": str(root / "m2"), "trains_from": "last"},
    ]
    multi = improve_report(root / "improve-rounds", before, after, rounds)
    return {"before": before, "after": after, "single": single, "multi": multi}
