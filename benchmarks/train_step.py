"""Training step benchmark: what one SFT step of the improve loop costs, TRL's step against trajforge's.

The rows are the improve loop's own (`configs/improve_miniwob.yaml`: demonstrations of six MiniWoB++
pages in tools mode, about 450 tokens each, the first ~250 the system prompt and tool list every row
repeats), the model is the embedded SmolLM2-135M-Instruct unpacked by transformers, the settings
are the loop's (batch 4, lr 1e-4, no gradient checkpointing). Each variant trains the same first
steps in a process of its own (peak memory is its own):

    trl            TRL's SFT step as it is (`--no-share-prefix`)
    shared         the shared-prefix step (training/shared_prefix.py): same loss and gradients
    shared+lora    the same with LoRA adapters (r 16), which trains fewer weights: not the same training

Figures per variant: CPU seconds per step (user + sys: what the machine's load cannot inflate), wall
seconds per step, peak RSS, the first steps' loss, tokens computed per step; ratios against TRL's step
in the same run. Steps after the first are timed (the first pays for allocation).

    python -m benchmarks.train_step [--steps 6] [--export DIR --base DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks._common import print_rows, row, write_results
from benchmarks.improve import BENCH_ENV, CONFIG, run_improve

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {"trl": {"share_prefix": False}, "shared": {"share_prefix": True},
            "shared+lora": {"share_prefix": True, "lora": True}}


def loop_rows(work: Path) -> tuple[Path, Path]:
    """(the trl-sft export, the unpacked base) of the improve loop at its data size: `trajforge improve` with one
    test seed per page and one training step, which makes the same demonstrations and export."""
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["output"] = str(work / "loop")
    cfg["tasks"]["options"]["seeds"] = 1
    cfg["train"]["max_steps"] = 1
    path = work / "loop.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    run_improve(path, "train_step_rows")
    exports = sorted((work / "loop" / "data" / "export").glob("*/card.json"))
    return exports[0].parent, work / "loop" / "base"


def worker(variant: str, export: Path, base: Path, steps: int, out: Path) -> dict[str, Any]:
    """Train `steps` steps of `variant` in this process; its figures."""
    from transformers import TrainerCallback

    from training.trainer import TrainConfig, build_trainer

    loop = yaml.safe_load(CONFIG.read_text())["train"]
    cfg = TrainConfig(**{**loop, "max_steps": steps, "save_steps": 10_000, "logging_steps": 1,
                         "chat_template": yaml.safe_load(CONFIG.read_text())["llm"]["chat_template"],
                         **VARIANTS[variant]})
    trainer = build_trainer(export, str(base), out, cfg).trainer
    marks: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            marks.append((time.perf_counter(), usage.ru_utime + usage.ru_stime))

    trainer.add_callback(Clock())
    trainer.train()
    walls = [b[0] - a[0] for a, b in zip(marks, marks[1:])]
    cpus = [b[1] - a[1] for a, b in zip(marks, marks[1:])]
    stats = getattr(trainer, "prefix_stats", None)
    tokens = stats.as_dict() if stats else None
    return {"variant": variant, "steps": len(marks), "wall_per_step": statistics.median(walls),
            "cpu_per_step": statistics.median(cpus),
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024,
            "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e], "prefix_sharing": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="steps per variant (the first is not timed)")
    ap.add_argument("--export", type=Path, help="a trl-sft export of the loop's rows (default: made here)")
    ap.add_argument("--base", type=Path, help="the unpacked base model directory (with --export)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.export, args.base, args.steps, args.out)))
        return
    work = Path(tempfile.mkdtemp(prefix="trajforge-train-step-"))
    export, base = (args.export, args.base) if args.export else loop_rows(work)
    results = {}
    for variant in args.variants.split(","):
        done = subprocess.run([sys.executable, "-m", "benchmarks.train_step", "--worker", variant, "--export",
                               str(export), "--base", str(base), "--steps", str(args.steps), "--out",
                               str(work / variant.replace("+", "-"))], cwd=ROOT, env={**os.environ, **BENCH_ENV},
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{variant}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    trl = results.get("trl")
    rows = []
    for name, r in results.items():
        ref = trl if trl and name != "trl" else None
        shared = r["prefix_sharing"]
        rows += [
            row(f"{name}: CPU seconds per step", r["cpu_per_step"], "s", ref and ref["cpu_per_step"], "TRL's step",
                note=f"median of {r['steps'] - 1} steps; wall {r['wall_per_step']:.1f} s per step, load average "
                     f"{os.getloadavg()[0]:.1f}"),
            row(f"{name}: peak RSS of the training process", r["peak_rss_gb"], "GB", ref and ref["peak_rss_gb"],
                "TRL's step", note=(f"{shared['tokens_computed']:,} of {shared['tokens']:,} tokens computed"
                                    if shared else "")),
        ]
    print_rows("train_step: one SFT step of the improve loop (SmolLM2-135M, batch 4)", rows)
    write_results("train_step", rows, variants=results, export=str(export), steps=args.steps)


if __name__ == "__main__":
    main()
