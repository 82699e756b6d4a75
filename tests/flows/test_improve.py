"""`trajforge improve` end to end with a tiny random model: on MiniWoB++ (Chromium, demonstrations, TRL), and on
the retail world with a training hook of the user's own; a re-run skips every stage; train and test tasks may
not overlap; rounds (a warm start on another page, then the model's own rollouts) resume after a kill between
rounds without redoing or duplicating anything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from flows.improve_checks import ImproveError, check_tasks
from flows.improve_config import ImproveConfig
from schemas.store import Dataset
from tests.conftest import REPO
from tests.export import _tiny

# A "trainer" of the user's own: it copies the base to the output, and says what it was given.
HOOK = '''
import json, os, shutil, sys
shutil.copytree(sys.argv[1], sys.argv[2], dirs_exist_ok=True)
print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("TRAJFORGE_")}))
'''


def _run(config, prefect_harness, *extra):
    env = {**os.environ, "PREFECT_API_URL": prefect_harness,
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "flows.cli", "improve", str(config), *extra], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def _run_here(config):
    """`trajforge improve` in this process, through the CLI's app, on the session's Prefect harness: a run whose
    process is not what the test is about (a process of its own would spend seconds on imports alone)."""
    return CliRunner().invoke(app, ["improve", str(config)])


def _llm(model) -> dict:
    return {"backend": "transformers", "model_path": str(model), "max_tokens": 4, "temperature": 0, "max_retries": 0}


def test_improve_on_miniwob_measures_trains_and_measures_again(prefect_harness, tmp_path_factory, tmp_path):
    model = _tiny.shared_model_dir(tmp_path_factory)
    config = tmp_path / "improve.yaml"
    config.write_text(yaml.safe_dump({
        "output": str(tmp_path / "out"), "llm": _llm(model), "env": "browser",
        "env_config": {"observe": ["axtree"], "actions": ["click"]},
        "tasks": {"source": "miniwob", "options": {"tasks": ["click-button", "click-dialog"], "seeds": 1}},
        "max_steps": 1, "max_parse_failures": 1, "eval": {"concurrency": 2},
        "generate": {"method": "demonstrations", "concurrency": 2,
                     "tasks": {"source": "miniwob", "options": {"tasks": ["click-button", "click-dialog"], "seeds": 2}}},
        "train": {"max_steps": 1, "batch_size": 2, "gradient_checkpointing": False}}))
    run = _run(config, prefect_harness)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = tmp_path / "out"
    report = json.loads((out / "report.json").read_text())
    before, after = (json.loads((out / name / "eval.json").read_text()) for name in ("eval-baseline", "eval-trained"))
    # Both evals ran the same held-out test seeds; the training data came from the train seeds only.
    assert before["split"] == after["split"] == "test"
    assert [r["task"] for r in before["per_task"]] == [r["task"] for r in after["per_task"]] == [
        "miniwob/click-button/100000", "miniwob/click-dialog/100000"]
    demos = list(Dataset.open(out / "data" / "generate" / "train-data").iter_records())
    assert len(demos) == 4 and {d.provenance.task_split for d in demos} == {"train"} and all(d.success for d in demos)
    lineage = report["lineage"]
    assert lineage["model"]["steps"] == 1 and lineage["model"]["export"]["records"] == 4
    assert lineage["model"]["base"]["path"] == str(model) and lineage["export"]["format"] == "trl-sft"
    assert after["llm"]["model_path"] == str(out / "model") and lineage["trained_eval"]["scored"] == 2
    # The trained model's eval counts its episodes' tokens, at no cost: a local model, and it says so.
    assert after["usage"]["prompt_tokens"] > 0 and after["usage"]["calls"] >= 1
    assert (after["usage"]["cost_usd"], after["usage"]["cost_basis"]) == (0.0, "local model")
    assert "$0.0000 (local model)" in (out / "eval-trained" / "README.md").read_text()
    assert report["comparison"]["tasks_in_common"] == 2 and report["comparison"]["delta"] is not None
    assert (out / "plots" / "before_after.png").is_file() and "## Lineage" in (out / "report.md").read_text()
    # One round keeps the single-round layout and names, and reports itself as round 1.
    assert set(report["stage_seconds"]) == {"base", "baseline", "data", "train", "trained"}
    assert [r["round"] for r in report["rounds"]] == [1] and report["rounds"][0]["model"] == str(out / "model")
    # Demonstrations on the measured pages' train seeds: allowed in one round, and the report says so.
    assert report["rounds"][0]["rows"] == {"demonstrations": 4} and report["warm_start"]["measured_overlap"] == 4


def test_improve_with_a_training_hook_resumes_and_refuses_overlapping_tasks(prefect_harness, tmp_path_factory,
                                                                            tmp_path):
    model = _tiny.shared_model_dir(tmp_path_factory)
    hook = tmp_path / "hook.py"
    hook.write_text(HOOK)
    base = {"output": str(tmp_path / "out"), "llm": _llm(model), "env": "retail", "tasks": {"n": 2, "seed": 0},
            "max_steps": 1, "max_parse_failures": 1, "eval": {"concurrency": 2},
            "generate": {"method": "demonstrations", "tasks": {"n": 2, "seed": 5}},
            "train": {"command": f"{sys.executable} {hook} {{base}} {{output}}"}}
    config = tmp_path / "improve.yaml"
    config.write_text(yaml.safe_dump(base))
    run = _run_here(config)
    assert run.exit_code == 0, run.output[-3000:] + repr(run.exception)
    out = tmp_path / "out"
    seen = json.loads((out / "train-hook.log").read_text().strip().splitlines()[-1])
    assert seen["TRAJFORGE_EXPORT"] == str(out / "data" / "export" / "train-data-trl-sft")
    assert seen["TRAJFORGE_BASE"] == str(model) and seen["TRAJFORGE_OUTPUT"] == str(out / "model")
    report = json.loads((out / "report.json").read_text())
    assert report["lineage"]["model"]["command"].endswith("{base} {output}")
    assert report["after"]["model"].endswith(f"({out / 'model'})") and report["before"]["split"] == "none"
    again = _run_here(config)
    assert again.exit_code == 0 and again.output.count("skipped") >= 4, again.output[-3000:] + repr(again.exception)
    assert "hook:" not in again.output  # the hook is not run again
    overlapping = ImproveConfig.model_validate({**base, "generate": {"method": "demonstrations",
                                                                     "tasks": {"n": 3, "seed": 0}}})
    with pytest.raises(ImproveError, match="the generation tasks include 2 of the 2 test tasks"):
        check_tasks(overlapping)


def test_improve_rounds_resume_after_a_kill_between_rounds(prefect_harness, tmp_path_factory, tmp_path):
    model = _tiny.shared_model_dir(tmp_path_factory)
    other = {"source": "miniwob", "options": {"tasks": ["click-dialog"], "seeds": 2}}  # not measured
    config = tmp_path / "improve.yaml"
    config.write_text(yaml.safe_dump({
        "output": str(tmp_path / "out"), "llm": _llm(model), "env": "browser",
        "env_config": {"observe": ["axtree"], "actions": ["click"]},
        "tasks": {"source": "miniwob", "options": {"tasks": ["click-button"], "seeds": 1}},
        "max_steps": 1, "max_parse_failures": 1, "eval": {"concurrency": 2},
        "warm_start": {"method": "demonstrations", "tasks": other},           # round 0
        "rounds": 1, "train_from": "base",                                     # round 1: the model's own draws
        "generate": [{"method": "rollout", "samples_per_task": 2, "agent_temperature": 0.7, "concurrency": 2},
                     {"method": "demonstrations", "tasks": other}],
        "train": {"max_steps": 1, "batch_size": 2, "gradient_checkpointing": False}}))
    out = tmp_path / "out"
    env = {**os.environ, "PREFECT_API_URL": prefect_harness,
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    argv = [sys.executable, "-m", "flows.cli", "improve", str(config)]
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline, finished = time.time() + 600, out / "_state" / "round-0" / "eval.json"
        while not finished.is_file() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)  # round 0 is done: killed between rounds (with its browsers)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "first.log").read_text()[-3000:]
    done = [out / "eval-baseline" / "eval.json", out / "round-0" / "model" / "train.json",
            out / "round-0" / "eval" / "eval.json"]
    stamps = [p.stat().st_mtime_ns for p in done]
    run = _run_here(config)  # the resume
    assert run.exit_code == 0, run.output[-3000:] + repr(run.exception)
    assert [p.stat().st_mtime_ns for p in done] == stamps  # no finished stage was done again
    draws = list(Dataset.open(out / "round-1" / "data" / "generate" / "rollout").iter_records())
    assert sorted(d.id for d in draws) == ["rollout/miniwob/click-button/0#0", "rollout/miniwob/click-button/0#1"]
    report = json.loads((out / "report.json").read_text())
    zero, one = report["rounds"]
    assert (zero["round"], one["round"]) == (0, 1) and zero["vs_previous"] is None
    assert set(one["vs_previous"]) == set(one["vs_baseline"]) == {"mean", "low", "high"}
    assert zero["train_pass_at_k"] == {"k": None, "value": None} and one["train_pass_at_k"]["k"] == 2
    assert zero["rows"] == {"demonstrations": 2} and one["rows"]["demonstrations"] == 2
    assert one["rows"]["rollout"] == sum(d.success is True for d in draws)  # only what the page verified
    assert one["trains_from"] == "base" and one["model"] == str(out / "round-1" / "model")
    assert one["eval"] == str(out / "round-1" / "eval") and report["baseline_eval"] == str(out / "eval-baseline")
    assert set(one["stage_seconds"]) == {"data", "train", "eval"} and report["after"]["pass@1"] == one["pass@1"]
    assert report["warm_start"] == {"tasks": ["miniwob/click-dialog/0", "miniwob/click-dialog/1"],
                                    "measured_overlap": 0}
    # Round 1 trained the base on every round's rows: round 0's and its own, merged.
    trained = json.loads((out / "round-1" / "model" / "train.json").read_text())
    assert trained["base"]["path"] == str(model) and trained["rows"] == 4 + one["rows"]["rollout"]
    assert (out / "plots" / "rounds.png").is_file() and "## Rounds" in (out / "report.md").read_text()
