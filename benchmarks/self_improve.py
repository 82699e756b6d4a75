"""Self-improvement benchmark: does the model get better on pages it was never shown a solution of?

`trajforge improve` with rounds, the embedded SmolLM2-135M-Instruct (GGUF, loaded and trained by
transformers) on MiniWoB++: round 0 is a warm start on demonstrations of one set of pages (the
"warm" pages); rounds 1 and 2 train on the model's own rollouts (rejection sampling: K samples per
task at a temperature) on four or more other pages, kept only where the page's reward said success.
No solver and no demonstration of those pages is used: the flow refuses one before it runs.

Figures: pass@1 on the self pages' test seeds before round 1 (after the warm start) and after the
last round, the gain with its paired 95% interval (target >= +15 points, interval above 0), the
whole run's wall time (target <= 45 min on 2 cores), the generation's pass@K per round, and the
warm pages' pass@1 after round 0 and after the last round (retention: `trajforge eval` of both
models on the warm pages' test seeds).

    python -m benchmarks.self_improve                      # the run the targets are for
    python -m benchmarks.self_improve --smoke              # a few minutes: one seed, one step (no figures to trust)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks._common import RESULTS_DIR, print_rows, row, write_results
from benchmarks.improve import BENCH_ENV, CONFIG, LoadSampler, _children_cpu, run_improve

ROOT = Path(__file__).resolve().parent.parent
WARM = ["click-dialog", "click-tab"]
SELF = ["click-button", "click-link", "focus-text", "click-widget"]
TARGET_POINTS = 15.0
TARGET_SECONDS = 45 * 60


def _pages(names: list[str], seeds: int) -> dict[str, Any]:
    return {"source": "miniwob", "options": {"tasks": names, "seeds": seeds}}


def config(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """configs/improve_miniwob.yaml's agent and training settings, with rounds and this run's sizes."""
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["output"] = str(out)
    cfg["tasks"] = _pages(args.pages.split(","), args.test_seeds)
    cfg["llm"]["max_tokens"] = args.max_tokens
    cfg["warm_start"] = {"method": "demonstrations", "concurrency": 4,
                         "tasks": _pages(args.warm_pages.split(","), args.warm_seeds)}
    cfg["rounds"] = args.rounds
    cfg["generate"] = [{"method": "rollout", "samples_per_task": args.samples, "agent_temperature": args.temperature,
                        "concurrency": 4, "tasks": _pages(args.pages.split(","), args.train_seeds)}]
    cfg["train_from"] = args.train_from
    cfg["train"].update(epochs=args.epochs, learning_rate=args.lr, batch_size=args.batch_size)
    if args.max_train_steps:
        cfg["train"]["max_steps"] = args.max_train_steps
    return cfg


def retention(cfg: dict[str, Any], args: argparse.Namespace, model: str, out: Path, env: dict[str, str]) -> dict:
    """`trajforge eval` of `model` on the warm pages' test seeds."""
    agent = {k: cfg[k] for k in ("env", "env_config", "max_steps", "max_parse_failures", "agent_mode")}
    agent.update(llm={**cfg["llm"], "model_path": model}, tasks=_pages(args.warm_pages.split(","), args.test_seeds),
                 samples=1, concurrency=4)
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(agent, sort_keys=False))
    subprocess.run([sys.executable, "-m", "flows.cli", "eval", "--config", str(path), "--output", str(out)],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "eval.json").read_text())


def _pts(d: dict[str, float] | None) -> str:
    return "n/a" if d is None else f"[{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] points"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm-pages", default=",".join(WARM), help="round 0's pages (demonstrations)")
    ap.add_argument("--pages", default=",".join(SELF), help="the measured pages (the model's own data only)")
    ap.add_argument("--warm-seeds", type=int, default=16, help="demonstrations per warm page")
    ap.add_argument("--train-seeds", type=int, default=8, help="train seeds per measured page")
    ap.add_argument("--test-seeds", type=int, default=8, help="held-out test seeds per page")
    ap.add_argument("--samples", type=int, default=6, help="K: rollouts per train task per round")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--train-from", choices=["last", "base"], default="base",
                    help="base: the base on every round's data (the warm start included); last forgot the warm pages")
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-train-steps", type=int, default=0, help="cap each round's training steps (0: epochs)")
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--smoke", action="store_true", help="the smallest run: checks the benchmark, not the model")
    ap.add_argument("--work", help="work directory (default: a temporary one, removed afterwards)")
    args = ap.parse_args()
    if args.smoke:
        args.warm_seeds, args.train_seeds, args.test_seeds, args.samples, args.max_train_steps = 2, 1, 1, 2, 1
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="trajforge-self-improve-"))
    out = work / "out"
    work.mkdir(parents=True, exist_ok=True)
    cfg = config(out, args)
    path = work / "improve.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {**os.environ, **BENCH_ENV}
    name = "self_improve" + ("_smoke" if args.smoke else "")
    started = time.perf_counter()
    cpu_before = _children_cpu()
    with LoadSampler() as load:
        loop = run_improve(path, name)
        report = json.loads((out / "report.json").read_text())
        rounds = {r["round"]: r for r in report["rounds"]}
        first, last = rounds[0], rounds[max(rounds)]
        kept = [retention(cfg, args, r["model"], work / f"retention-{r['round']}", env) for r in (first, last)]
    seconds = time.perf_counter() - started  # the loop and the retention evals
    cpu = _children_cpu() - cpu_before
    from evals.compare import compare
    from evals.report import load_report

    gain = compare(load_report(first["eval"]), load_report(last["eval"]), seed=0)["delta"]
    points = 100 * gain["mean"] if gain else None
    loads = load.samples
    rows = [
        row("pass@1 on the measured pages before round 1 (after the warm start)", 100 * (first["pass@1"] or 0), "%"),
        row(f"pass@1 after round {last['round']} (the model's own data only)", 100 * (last["pass@1"] or 0), "%",
            100 * (first["pass@1"] or 0), "before round 1"),
        row("pass@1 gain", points, "points", target=f">= +{TARGET_POINTS:g}, interval above 0",
            passed=points is not None and points >= TARGET_POINTS and gain["low"] > 0,
            note="95% paired bootstrap interval " + _pts(gain)),
        row("pass@1 on the warm pages after round 0 (retention: before)", 100 * (kept[0]["pass@1"] or 0), "%"),
        row(f"pass@1 on the warm pages after round {last['round']} (retention: after)", 100 * (kept[1]["pass@1"] or 0),
            "%", 100 * (kept[0]["pass@1"] or 0), "after round 0"),
        row("wall time of the run", seconds, "s", TARGET_SECONDS, "45 minutes", "<= 1", seconds <= TARGET_SECONDS,
            note=f"load average {min(loads):.1f}-{max(loads):.1f} (mean {sum(loads) / len(loads):.1f}) on "
                 f"{os.cpu_count()} cores"),
        row("CPU time of the run (user + sys, all its processes)", cpu, "s"),
        row("peak memory of the loop (largest process)", loop.peak_rss_gb, "GB"),
    ]
    per_round = [{k: r[k] for k in ("round", "pass@1", "vs_baseline", "vs_previous", "train_pass_at_k", "rows",
                                    "stage_seconds", "trains_from")} for r in report["rounds"]]
    print_rows("self-improvement: SmolLM2-135M on MiniWoB++, rounds of its own data", rows)
    for r in per_round:
        gen = r["train_pass_at_k"]
        found = "n/a" if gen["value"] is None else f"{100 * gen['value']:.1f}%"
        print(f"  round {r['round']}: pass@1 {100 * (r['pass@1'] or 0):5.1f}%, rows {r['rows']}, generation "
              f"pass@{gen['k']} {found}")
    write_results(name, rows, per_round=per_round, stage_seconds=report["stage_seconds"], cpu_seconds=cpu,
                  load_average={"min": min(loads), "max": max(loads), "mean": sum(loads) / len(loads)},
                  settings=cfg, warm_start=report["warm_start"], smoke=args.smoke)
    shutil.copyfile(out / "report.md", RESULTS_DIR / f"{name}.report.md")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
