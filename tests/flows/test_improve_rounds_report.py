"""`trajforge improve` before anything runs, and the arithmetic of its rounds report.

The command refuses, in one line and before a Prefect server starts, a base that does not exist, generation
tasks that include a test task, reference solutions on a measured page, and an output directory it did not
create; the per-round figures (pass@1, paired intervals against the baseline and the previous round, the
generation's pass@K) are checked on scripted outcomes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml
from typer.testing import CliRunner

from flows import cmd_improve
from flows.cli import app
from flows.improve_config import ImproveConfig
from flows.improve_rounds import Round, pass_at_k_of, round_figures, write_rounds
from tests.conftest import REPO

PAGES = {"source": "miniwob", "options": {"tasks": ["click-button"], "seeds": 1}}


def _config(tmp_path, **over) -> dict:
    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    return {"output": str(tmp_path / "out"), "llm": {"backend": "transformers", "model_path": str(base)},
            "env": "browser", "env_config": {"observe": ["axtree"], "actions": ["click"]}, "tasks": PAGES,
            "max_steps": 1, "rounds": 2, **over}


REFUSALS = [
    ("no-base", "base {tmp}/missing: no such file or directory"),
    ("overlap", "the generation tasks include 1 of the 1 test tasks"),
    ("oracle", "reference solutions (demonstrations) on 2 task(s) of the measured groups (miniwob/click-button/0"),
    ("foreign-output", "{tmp}/mine: not empty (notes.txt) and not an improve output (no _state/)"),
]


def _refused_args(tmp_path, case: str) -> list[str]:
    """The `improve` arguments of a refusal case: its config written, `--output` for the foreign output."""
    data = _config(tmp_path)
    extra: list[str] = []
    if case == "no-base":
        data["base"] = str(tmp_path / "missing")
    elif case == "overlap":
        data["generate"] = {"method": "rollout", "tasks": {**PAGES, "split": "test", "allow_test_split": True}}
    elif case == "oracle":  # a warm start on the page the evals measure
        data["warm_start"] = {"method": "demonstrations",
                              "tasks": {"source": "miniwob", "options": {"tasks": ["click-button"], "seeds": 2}}}
    else:
        mine = tmp_path / "mine"
        mine.mkdir()
        (mine / "notes.txt").write_text("mine")
        extra = ["--output", str(mine)]
    config = tmp_path / "improve.yaml"
    config.write_text(yaml.safe_dump(data))
    return ["improve", str(config), *extra]


def _assert_refused(tmp_path, case: str, expected: str, exit_code: int, output: str) -> None:
    assert exit_code == 1, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and expected.format(tmp=tmp_path) in lines[0], lines
    out = tmp_path / ("mine" if case == "foreign-output" else "out")
    assert not (out / "_prefect").exists() and not (out / "_pipeline.lock").exists() and not (out / "_state").exists()
    if case == "foreign-output":
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


# In-process through the CLI's own entry (a process each would spend its seconds on imports); the process the
# user starts is the next test's.
@pytest.mark.parametrize("case, expected", REFUSALS)
def test_improve_refuses_a_bad_config_in_one_line_before_prefect_starts(tmp_path, monkeypatch, case, expected):
    def prefect_set_up(home):
        raise AssertionError(f"Prefect set up ({home}) before the checks refused")

    monkeypatch.setattr(cmd_improve, "prefect_defaults", prefect_set_up)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # nothing may reach Prefect: the checks come first
    run = CliRunner().invoke(app, _refused_args(tmp_path, case))
    assert run.exception is None or isinstance(run.exception, SystemExit), repr(run.exception)
    _assert_refused(tmp_path, case, expected, run.exit_code, run.output)


def test_the_improve_process_refuses_in_one_line_on_stdout_and_stderr(tmp_path):
    """What only a process of its own shows: nothing else on stdout or stderr (an import's warning, a log
    line), exit status 1, and no Prefect server started (15 s and more)."""
    case, expected = REFUSALS[1]  # past the cheap checks: the generation methods and task sources imported
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PREFECT_API_URL", None)
    started = time.time()
    run = subprocess.run([sys.executable, "-m", "flows.cli", *_refused_args(tmp_path, case)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    _assert_refused(tmp_path, case, expected, run.returncode, run.stdout + run.stderr)
    assert time.time() - started < 60


def _eval(tmp_path, name: str, passed: list[float]) -> dict:
    rows = [{"task": f"miniwob/click-button/{100000 + i}", "group": "miniwob/click-button", "pass@1": p}
            for i, p in enumerate(passed)]
    return {"output": str(tmp_path / name), "model": name, "pass@1": sum(passed) / len(passed), "split": "test",
            "per_task": rows, "failures": {"by_criterion": {}}}


def test_round_figures_on_scripted_outcomes(tmp_path):
    cfg = ImproveConfig.model_validate(_config(tmp_path, train_from="base"))
    baseline = _eval(tmp_path, "eval-baseline", [0, 0, 0, 0])
    scripted = [[1, 1, 0, 0], [1, 1, 1, 1]]
    rounds = [{"round": Round.of(cfg, k), "after": {"report": _eval(tmp_path, f"round-{k}/eval", p)},
               "data": {"entries": [], "stages": []}, "trained": {"output": str(tmp_path / f"round-{k}" / "model")},
               "stage_seconds": {"data": 1.0, "train": 2.0, "eval": 3.0}, "trains_from": "base"}
              for k, p in enumerate(scripted, start=1)]
    figures = round_figures(cfg, baseline, rounds)
    one, two = figures
    assert (one["round"], one["pass@1"], two["pass@1"]) == (1, 0.5, 1.0)
    assert one["vs_previous"] is None and one["vs_baseline"]["mean"] == 0.5
    assert 0 <= one["vs_baseline"]["low"] < 0.5 < one["vs_baseline"]["high"] <= 1
    assert two["vs_baseline"] == {"mean": 1.0, "low": 1.0, "high": 1.0}  # every task +1: no spread
    assert two["vs_previous"]["mean"] == 0.5 and two["eval"] == str(tmp_path / "round-2/eval")
    assert two["trains_from"] == "base" and two["train_pass_at_k"] == {"k": None, "value": None}
    # pass@K of the generation: task a found once in 4 draws, task b never.
    assert pass_at_k_of({"a": [True, False, False, False], "b": [False] * 4}) == {"k": 4, "value": 0.5}
    assert pass_at_k_of({"a": [True, False, False, False], "b": [False] * 2}) == {"k": 2, "value": 0.25}
    report = {"before": {"pass@1": 0.0}, "rounds": figures, "warm_start": {"tasks": [], "measured_overlap": 0}}
    md = write_rounds(cfg, report)
    assert "| 2 |  | 0 | n/a | 100.0% | +100.0 [+100.0, +100.0] | +50.0 [" in md and "Trains from: **base**" in md
    assert (tmp_path / "out" / "plots" / "rounds.png").stat().st_size > 1000
    json.dumps(figures)  # report.json takes them as they are


def test_rounds_default_to_rejection_sampling_at_temperature_one(tmp_path):
    """With rounds and no generate, each round samples 6 draws per task at temperature 1 (at 0.7 a warm-started
    model made the same call on every draw of many tasks: docs/benchmarks.md, self_improve)."""
    cfg = ImproveConfig.model_validate(_config(tmp_path))
    assert cfg.generate == {"method": "rollout", "samples_per_task": 6, "agent_temperature": 1.0}
    entries = cfg.generate_entries(1, cfg.llm)
    assert [(e["method"], e["samples_per_task"], e["agent_temperature"]) for e in entries] == [("rollout", 6, 1.0)]
