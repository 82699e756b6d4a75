"""`trajforge improve` end to end with a tiny random model: on MiniWoB++ (Chromium, demonstrations, TRL), and on
the retail world with a training hook of the user's own; a re-run skips every stage; train and test tasks may
not overlap."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from flows.improve import ImproveError, check_disjoint
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
    run = _run(config, prefect_harness)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = tmp_path / "out"
    seen = json.loads((out / "train-hook.log").read_text().strip().splitlines()[-1])
    assert seen["TRAJFORGE_EXPORT"] == str(out / "data" / "export" / "train-data-trl-sft")
    assert seen["TRAJFORGE_BASE"] == str(model) and seen["TRAJFORGE_OUTPUT"] == str(out / "model")
    report = json.loads((out / "report.json").read_text())
    assert report["lineage"]["model"]["command"].endswith("{base} {output}")
    assert report["after"]["model"].endswith(f"({out / 'model'})") and report["before"]["split"] == "none"
    again = _run(config, prefect_harness)
    assert again.returncode == 0 and again.stdout.count("skipped") >= 4, again.stdout[-3000:]
    assert "hook:" not in again.stdout  # the hook is not run again
    overlapping = ImproveConfig.model_validate({**base, "generate": {"method": "demonstrations",
                                                                     "tasks": {"n": 3, "seed": 0}}})
    with pytest.raises(ImproveError, match="the generation tasks include 2 of the 2 test tasks"):
        check_disjoint(overlapping)
