"""GRPO benchmark: does online RL on the pages' own reward improve the agent after SFT?

SmolLM2-135M-Instruct after the improve loop's SFT (`trajforge improve configs/improve_miniwob.yaml`,
as `benchmarks.improve` runs it; or `--sft DIR`, a checkpoint already trained), then `trajforge
train --objective grpo --config ENV_CONFIG` on the train seeds of MiniWoB++ pages the SFT model
solves sometimes (after SFT, improve's report has click-button 12.5%, click-link 50%, click-widget
25%: a group of completions then gets different rewards, which is what GRPO learns from; a page at
0% or 100% gives every completion the same reward and no advantage). The agent settings are the
improve config's (tools mode, one `click`, the accessibility tree, one action, at most 40 tokens),
sampled at a temperature for the groups. pass@1 before and after is `trajforge eval` of the SFT
checkpoint and of the GRPO checkpoint on the same held-out test seeds (greedy, as improve's
evals), and the gain's paired 95% bootstrap interval is `trajforge eval compare`'s
(`evals.compare`). The reward curve is TRL's logged mean reward per step (the GRPO card's
`rewards`, with each step's reward spread and share of groups whose completions all got the same
reward).

Target: a gain whose 95% interval lies above 0, with the GRPO part (the two evals and the
training; not the SFT before it) within 30 minutes on 2 cores. The load average is sampled.

    python -m benchmarks.grpo                          # the improve loop for the SFT model, then GRPO
    python -m benchmarks.grpo --sft W/out/model        # from a trained checkpoint (benchmarks.improve --work W)
    python -m benchmarks.grpo --smoke                  # the smallest sizes: checks the benchmark, not the model
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

from benchmarks import improve
from benchmarks._common import RESULTS_DIR, print_rows, row, write_results
from benchmarks.improve import BENCH_ENV, LoadSampler, _children_cpu, run_improve

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["click-button", "click-link", "click-widget"]
TARGET_SECONDS = 30 * 60
AGENT_KEYS = ("env", "env_config", "max_steps", "max_parse_failures", "agent_mode")


def sft_model(args: argparse.Namespace, work: Path, name: str) -> tuple[str, float | None]:
    """The SFT checkpoint GRPO starts from, and the seconds the improve loop took (None with --sft)."""
    if args.sft:
        return resolve_sft(args.sft), None
    out = work / "sft"
    sizes = argparse.Namespace(tasks=None, gpu=False, train_seeds=args.sft_train_seeds, test_seeds=args.sft_test_seeds,
                               epochs=args.sft_epochs, lr=1e-4, batch_size=4, max_steps=1, max_tokens=args.max_tokens)
    cfg = improve.config(out, sizes)
    if args.smoke:  # one page, one demonstration, one step: the loop runs, the model learns nothing to speak of
        for split in (cfg["tasks"], cfg["generate"]["tasks"]):
            split["options"]["tasks"] = args.pages.split(",")[:1]
        cfg["train"]["max_steps"] = 1
    path = work / "improve.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    seconds, _ = run_improve(path, f"{name}_sft")
    report = json.loads((out / "report.json").read_text())
    return report["lineage"]["model"]["output"], seconds


def resolve_sft(given: str) -> str:
    """--sft: a checkpoint directory, an improve output (its `model/`), a GGUF file, or 'smollm2' (the raw base)."""
    if given == "smollm2":
        from backends.transformers_backend import default_model_path

        return default_model_path()
    path = Path(given)
    if (path / "report.json").is_file() and (path / "model" / "config.json").is_file():
        return str(path / "model")
    if (path / "config.json").is_file() or path.suffix == ".gguf":
        return str(path)
    raise SystemExit(f"--sft {given}: not a checkpoint (no config.json), an improve output or a GGUF file")


def agent(model: str, pages: list[str], seeds: int, args: argparse.Namespace) -> dict[str, Any]:
    """The improve config's agent on `pages` x `seeds` (the train split; an eval reads the test split)."""
    cfg = yaml.safe_load(improve.CONFIG.read_text())
    llm = {**cfg["llm"], "model_path": model, "max_tokens": args.max_tokens}
    return {**{k: cfg[k] for k in AGENT_KEYS}, "llm": llm,
            "tasks": {"source": "miniwob", "options": {"tasks": pages, "seeds": seeds}}}


def trajforge(argv: list[str], log: Path) -> None:
    """`trajforge ARGV` in its own process, its output appended to `log`; exits with the log's last line on failure."""
    with log.open("a") as fh:
        fh.write(f"$ trajforge {' '.join(argv)}\n")
        fh.flush()
        proc = subprocess.run([sys.executable, "-m", "flows.cli", *argv], cwd=ROOT, env={**os.environ, **BENCH_ENV},
                              stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"trajforge {argv[0]} failed (exit {proc.returncode}): {tail[0]} (log: {log})")


def evaluate(model: str, args: argparse.Namespace, out: Path, log: Path) -> dict[str, Any]:
    """`trajforge eval` of `model` on the pages' test seeds, greedy as the improve loop's evals; its report."""
    cfg = {**agent(model, args.pages.split(","), args.test_seeds, args), "samples": 1, "concurrency": 4}
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    trajforge(["eval", "--config", str(path), "--output", str(out)], log)
    from evals.report import load_report

    return load_report(out)


def grpo(model: str, args: argparse.Namespace, out: Path, log: Path) -> dict[str, Any]:
    """`trajforge train --objective grpo` from `model` on the pages' train seeds; the GRPO card."""
    cfg = agent(model, args.pages.split(","), args.train_seeds, args)
    cfg["llm"]["temperature"] = args.temperature
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    trajforge(["train", "--objective", "grpo", "--config", str(path), "--base", model, "--output", str(out),
               "--max-steps", str(args.steps), "--batch-size", str(args.batch_size),
               "--generations", str(args.generations), "--lr", str(args.lr), "--no-gradient-checkpointing",
               "--device", "cpu"], log)
    return json.loads((out / "train.json").read_text())


def curve_summary(card: dict[str, Any]) -> dict[str, Any]:
    """What the reward did over the steps: the first and last quarter's mean, and the groups that taught nothing."""
    rewards = [r for r in card["rewards"] if r is not None]
    quarter = max(1, len(rewards) // 4)
    zero = [e["frac_reward_zero_std"] for e in card["step_log"] if e.get("frac_reward_zero_std") is not None]
    return {"steps": len(rewards), "first": _mean(rewards[:quarter]), "last": _mean(rewards[-quarter:]),
            "min": min(rewards, default=None), "max": max(rewards, default=None), "zero_spread": _mean(zero)}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def describe(curve: dict[str, Any]) -> str:
    if not curve["steps"]:
        return "no reward was logged"
    text = (f"mean reward per step {curve['first']:.3f} over the first quarter of {curve['steps']} steps -> "
            f"{curve['last']:.3f} over the last (range {curve['min']:.3f}-{curve['max']:.3f})")
    if curve["zero_spread"] is not None:
        text += f"; {100 * curve['zero_spread']:.0f}% of groups had one reward for all (no advantage)"
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft", help="start from this checkpoint (a directory, an improve output, a GGUF, or 'smollm2' "
                                  "for the raw base) instead of running the improve loop")
    ap.add_argument("--pages", default=",".join(PAGES), help="MiniWoB pages GRPO trains and is measured on")
    ap.add_argument("--train-seeds", type=int, default=16, help="GRPO's tasks: train seeds per page")
    ap.add_argument("--test-seeds", type=int, default=16, help="held-out test seeds per page (both evals)")
    ap.add_argument("--steps", type=int, default=24, help="GRPO optimizer steps")
    ap.add_argument("--generations", type=int, default=4, help="completions per task (a group)")
    ap.add_argument("--batch-size", type=int, default=8, help="completions per step (a multiple of --generations)")
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the groups")
    ap.add_argument("--max-tokens", type=int, default=40, help="tokens per answer")
    ap.add_argument("--sft-train-seeds", type=int, default=16, help="without --sft: the improve loop's demonstrations")
    ap.add_argument("--sft-test-seeds", type=int, default=8, help="without --sft: the improve loop's test seeds")
    ap.add_argument("--sft-epochs", type=float, default=2.0, help="without --sft: the improve loop's epochs")
    ap.add_argument("--smoke", action="store_true", help="the smallest run: checks the benchmark, not the model")
    ap.add_argument("--work", help="work directory (default: a temporary one, removed afterwards)")
    args = ap.parse_args()
    if args.smoke:
        args.pages = args.pages.split(",")[0]
        args.train_seeds, args.test_seeds, args.steps, args.generations, args.batch_size = 1, 1, 1, 2, 2
        args.sft_train_seeds, args.sft_test_seeds = 1, 1
    name = "grpo" + ("_smoke" if args.smoke else "")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="trajforge-grpo-"))
    work.mkdir(parents=True, exist_ok=True)
    RESULTS_DIR.mkdir(exist_ok=True)
    log = RESULTS_DIR / f"{name}.run.log"
    log.write_text("")
    model, sft_seconds = sft_model(args, work, name)
    started, cpu_before = time.perf_counter(), _children_cpu()
    with LoadSampler() as load:
        with_timing: dict[str, float] = {}
        t = time.perf_counter()
        before = evaluate(model, args, work / "eval-sft", log)
        with_timing["eval_sft"] = time.perf_counter() - t
        t = time.perf_counter()
        card = grpo(model, args, work / "grpo", log)
        with_timing["grpo"] = time.perf_counter() - t
        t = time.perf_counter()
        after = evaluate(str(work / "grpo"), args, work / "eval-grpo", log)
        with_timing["eval_grpo"] = time.perf_counter() - t
    seconds, cpu = time.perf_counter() - started, _children_cpu() - cpu_before
    from evals.compare import compare

    cmp = compare(before, after, seed=0)
    delta = cmp["delta"]
    curve = curve_summary(card)
    points = 100 * delta["mean"] if delta else None
    met = delta is not None and delta["low"] > 0
    interval = "n/a" if delta is None else f"[{100 * delta['low']:+.1f}, {100 * delta['high']:+.1f}] points"
    loads = load.samples
    rows = [
        row("pass@1 after SFT (test seeds)", 100 * (before["pass@1"] or 0), "%", note=f"{before['scored']} episodes"),
        row("pass@1 after GRPO", 100 * (after["pass@1"] or 0), "%", 100 * (before["pass@1"] or 0), "after SFT",
            note=f"{after['scored']} episodes"),
        row("pass@1 gain", points, "points", target="95% interval above 0", passed=met,
            note=f"95% paired bootstrap interval {interval}" + ("" if met else f"; reward curve: {describe(curve)}")),
        row("mean reward per step, last quarter of the steps", curve["last"], "reward", curve["first"],
            "first quarter", note=describe(curve)),
        row("GRPO steps", card["steps"], "steps", note=f"{card['export']['records']} rollouts, "
            f"{args.generations} per task, {args.batch_size} per step"),
        row("GRPO training time", card["seconds"], "s"),
        row("wall time of the GRPO part (two evals + training)", seconds, "s", TARGET_SECONDS, "30 minutes", "<= 1",
            seconds <= TARGET_SECONDS, note=f"load average {min(loads):.1f}-{max(loads):.1f} (mean "
                                            f"{sum(loads) / len(loads):.1f}) on {os.cpu_count()} cores"),
        row("CPU time of the GRPO part (user + sys, all its processes)", cpu, "s"),
    ]
    if sft_seconds is not None:
        rows.append(row("wall time of the improve loop (the SFT model)", sft_seconds, "s"))
    per_page = [{"page": g["group"], "sft": g["a"], "grpo": g["b"], "delta": g["delta"]} for g in cmp["groups"]]
    print_rows("grpo: SmolLM2-135M on MiniWoB++, after SFT / after GRPO", rows)
    for g in per_page:
        print(f"  {g['page']:<28} {100 * (g['sft'] or 0):5.1f}% -> {100 * (g['grpo'] or 0):5.1f}%")
    print(f"  rewards per step: {[round(r, 3) if r is not None else None for r in card['rewards']]}")
    write_results(name, rows, per_page=per_page, reward_curve=card["rewards"], step_log=card["step_log"],
                  curve=curve, interval=delta, stage_seconds=with_timing, cpu_seconds=cpu, sft=model,
                  sft_seconds=sft_seconds, grpo=card.get("grpo"), smoke=args.smoke,
                  load_average={"min": min(loads), "max": max(loads), "mean": sum(loads) / len(loads)},
                  settings={k: v for k, v in vars(args).items() if k != "work"})
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
