"""`trajforge eval` and `trajforge eval compare` against the fake server (real HTTP), with scripted outcomes.

The agent's answers depend on the task and on the request's seed (sample k sends seed k), so every
pass rate of the report can be computed by hand; a server error quarantines one episode, which
leaves the rates (it is not the agent's failure).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from backends.fake_server import Fault, FakeServer, Rule, ToolCallAnswer
from envs.registry import make_env
from evals.report import build_report
from evals.run import EvalConfig, eval_config, with_split
from flows.cli import app
from schemas.models import MessageAction, Provenance, TextObservation, Trajectory
from schemas.store import Dataset
from tests.cli_errors import one_error_line

DONE = "Done. Anything else?"


def _tasks(n: int) -> list:
    return make_env("retail", seed=0).generate_tasks(n, seed=0)


class Script:
    """`solved(task index, sample)` decides whether that episode does the reference actions."""

    def __init__(self, solved, fail_at: tuple[int, int] | None = None) -> None:
        self.tasks = _tasks(4)
        self.index = {t.instruction: i for i, t in enumerate(self.tasks)}
        self.solved, self.fail_at = solved, fail_at

    def __call__(self, body: dict):
        if not body.get("tools"):
            return None
        i = self.index[next(m["content"] for m in body["messages"] if m["role"] == "user")]
        k = body.get("seed", 0)
        if (i, k) == self.fail_at:
            return Fault("500")
        plan = [ToolCallAnswer(a["function"], a["arguments"]) for a in self.tasks[i].goal["actions"]] \
            if self.solved(i, k) else []
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return (plan + [DONE])[turn] if turn <= len(plan) else DONE


def _config(path: Path, base_url: str) -> Path:
    path.write_text(yaml.safe_dump({
        "method": "rollout", "env": "retail", "tasks": {"n": 4}, "max_steps": 8, "concurrency": 3, "unit_tasks": 2,
        "llm": {"backend": "openai", "base_url": base_url, "model": "fake-agent", "api_key_env": "TRAJFORGE_TEST_KEY",
                "max_retries": 0, "request_timeout_s": 10}}))
    return path


# Task 0 always solved, task 1 only by sample 0, task 2 never, task 3 always; sample 1 of task 3 hits a 500.
FIRST = {0: lambda k: True, 1: lambda k: k == 0, 2: lambda k: False, 3: lambda k: True}


@pytest.fixture(scope="module")
def evals(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("evals")
    runner = CliRunner()
    out: dict[str, Path] = {}
    for name, solved, fail_at in (("a", lambda i, k: FIRST[i](k), (3, 1)), ("b", lambda i, k: i != 2, None)):
        with FakeServer(rules=[Rule(fn=Script(solved, fail_at))]) as server:
            cfg = _config(root / f"{name}.yaml", server.base_url)
            out[name] = root / name
            result = runner.invoke(app, ["eval", "--config", str(cfg), "--output", str(out[name]), "--samples", "3"])
            assert result.exit_code == 0, result.output
            if name == "a":
                out["a_output"] = result.output  # type: ignore[assignment]
                again = runner.invoke(app, ["eval", "--config", str(cfg), "--output", str(out[name]), "-k", "3"])
                assert again.exit_code == 0, again.output
                out["a_again"] = again.output  # type: ignore[assignment]
    return out


def test_eval_reports_pass_at_k_and_pass_hat_k_of_the_scripted_outcomes(evals):
    report = json.loads((evals["a"] / "eval.json").read_text())
    assert (report["tasks"], report["samples"], report["episodes"], report["scored"]) == (4, 3, 12, 11)
    assert report["errors"] == {"llm": 1}  # the server's 500: quarantined, not a failure of the agent
    # Per task (n, c): (3, 3), (3, 1), (3, 0), (2, 2).
    assert report["pass@1"] == pytest.approx((1 + 1 / 3 + 0 + 1) / 4)
    assert report["pass"]["2"]["pass@k"] == pytest.approx((1 + 2 / 3 + 0 + 1) / 4)
    assert report["pass"]["2"]["pass^k"] == pytest.approx((1 + 0 + 0 + 1) / 4)
    assert report["pass"]["3"] == {"pass@k": pytest.approx(2 / 3), "pass^k": pytest.approx(1 / 3), "tasks": 3}
    assert report["failures"]["by_criterion"] == {"DB": 5}  # the unsolved episodes change nothing in the DB
    assert report["split"] == "none"  # the retail generator has no splits: every task ran
    assert report["usage"]["prompt_tokens"] > 0 and report["usage"]["cost_usd"] is None  # no price for a server
    assert "n/a (no price known)" in (evals["a"] / "README.md").read_text()
    rows = {r["task"]: r for r in csv.DictReader((evals["a"] / "tasks.csv").open())}
    assert [(r["samples"], r["successes"], r["errors"]) for r in rows.values()] == [
        ("3", "3", "0"), ("3", "1", "0"), ("3", "0", "0"), ("2", "2", "1")]
    assert (evals["a"] / "plots" / "pass_by_group.png").stat().st_size > 0
    assert "pass^3 | 33.3%" in (evals["a"] / "README.md").read_text()
    assert "pass@1" in evals["a_output"] and "58.3%" in evals["a_output"]


def test_eval_episodes_are_a_dataset_and_a_rerun_resumes_without_calls(evals):
    ds = Dataset.open(evals["a"])
    trajectories = list(ds.iter_records())
    assert len(trajectories) == 11 and all(t.details["wall_s"] >= 0 for t in trajectories)
    assert {t.details["sample"] for t in trajectories} == {0, 1, 2}
    runs = [json.loads(line) for line in (evals["a"] / "_eval_runs.jsonl").read_text().splitlines()]
    assert len(runs) == 2 and runs[0]["llm"]["calls"] == 30 and runs[1]["llm"]["calls"] == 0  # all finished before
    usage = json.loads((evals["a"] / "eval.json").read_text())["usage"]
    assert usage["server_calls"] == 30  # summed over both runs
    # The episodes' own calls: every scored episode's steps (the quarantined one's are not in a record).
    assert usage["calls"] == sum(1 for t in trajectories for s in t.steps if s.usage is not None) > 0
    result = CliRunner().invoke(app, ["validate", str(evals["a"])])
    assert result.exit_code == 0, result.output
    from starlette.testclient import TestClient

    from viewer.server import create_app
    from viewer.sources import discover

    with TestClient(create_app(discover([evals["a"]]))) as client:  # what `trajforge view DIR` serves
        [source] = client.get("/api/sources").json()
        assert source["counts"] == {"trajectories": 11, "pairs": 0, "quarantine": 1, "filtered": 0}


def test_compare_pairs_tasks_and_bounds_the_difference(evals, tmp_path):
    out = tmp_path / "cmp"
    result = CliRunner().invoke(app, ["eval", "compare", str(evals["a"]), str(evals["b"]), "--output", str(out)])
    assert result.exit_code == 0, result.output
    cmp = json.loads((out / "compare.json").read_text())
    # b solves task 1 in every sample (+2/3) and task 3 still; a's pass@1 per task: 1, 1/3, 0, 1.
    assert [round(r["delta"], 4) for r in cmp["per_task"]] == [0.0, round(2 / 3, 4), 0.0, 0.0]
    assert cmp["delta"]["mean"] == pytest.approx(1 / 6) and cmp["tasks_in_common"] == 4
    assert 0.0 <= cmp["delta"]["low"] <= cmp["delta"]["mean"] <= cmp["delta"]["high"] <= 2 / 3
    assert (out / "compare.csv").read_text().count("\n") == 5 and (out / "plots" / "compare.png").is_file()
    assert "+16.7 points" in result.output
    missing = CliRunner().invoke(app, ["eval", "compare", str(evals["a"]), str(tmp_path)])
    assert missing.exit_code == 1 and "not an eval output" in missing.output


def test_compare_refuses_an_output_it_did_not_write_and_rewrites_its_own(evals, tmp_path):
    args = ["eval", "compare", str(evals["a"]), str(evals["b"]), "--output"]
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    one_error_line(CliRunner().invoke(app, [*args, str(file)]), "notes.txt: exists and is not a directory")
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "compare.md").write_text("my notes")
    one_error_line(CliRunner().invoke(app, [*args, str(folder)]), "not empty (compare.md)", "no compare.json")
    assert file.read_text() == "mine" and (folder / "compare.md").read_text() == "my notes"
    assert [p.name for p in folder.iterdir()] == ["compare.md"]
    own = tmp_path / "cmp"
    for _ in range(2):  # a directory compare wrote is its own: written again
        result = CliRunner().invoke(app, [*args, str(own)])
        assert result.exit_code == 0, result.output
    assert (own / "compare.json").is_file()


def test_eval_refuses_a_split_the_tasks_do_not_have_naming_those_they_have(tmp_path):
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({"env": "retail", "tasks": {"n": 2}, "llm": {"backend": "fake"}}))
    result = CliRunner().invoke(app, ["eval", "-c", str(config), "-o", str(tmp_path / "out"), "--split", "nosuch"])
    one_error_line(result, "no split 'nosuch'", "it has no splits")
    assert not (tmp_path / "out").exists()
    tasks = [{"id": str(i), "user_scenario": {"instructions": {"domain": "retail", "reason_for_call": f"task {i}"}},
              "evaluation_criteria": {"actions": [], "reward_basis": ["DB"]}} for i in range(2)]
    (tmp_path / "tasks.json").write_text(json.dumps(tasks))
    (tmp_path / "split_tasks.json").write_text(json.dumps({"train": ["0"], "test": ["1"]}))
    config.write_text(yaml.safe_dump({"env": "retail", "llm": {"backend": "fake"},
                                      "tasks": {"source": "tau2", "path": str(tmp_path / "tasks.json")}}))
    result = CliRunner().invoke(app, ["eval", "-c", str(config), "-o", str(tmp_path / "out"), "--split", "nosuch"])
    one_error_line(result, "no split 'nosuch'", "test, train")


def test_episodes_spoiled_by_the_simulated_user_are_counted_apart(tmp_path):
    def traj(i: int, success: bool, spoiled: bool = False) -> Trajectory:
        details = {"actions": 1, "stop_reason": "done", "wall_s": 0.1,
                   "evaluation": {"reward": float(success), "success": success, "reason": "",
                                  "details": {"basis": ["DB"], "failed": [] if success else ["DB"]}}}
        if spoiled:
            details["user_fidelity"] = {"ok": False, "turns": [], "reason": "the user said the answer"}
        return Trajectory(id=f"eval/t{i}#0", source="eval", success=success, reward=float(success), details=details,
                          steps=[TextObservation(content="hi", source="user"), MessageAction(content="ok")],
                          provenance=Provenance(method="eval", source_id=f"t{i}"))
    ds = Dataset.create(tmp_path, stage="eval")
    with ds.unit("u") as unit:
        unit.write_many("trajectories", [traj(0, True), traj(1, False), traj(2, False, spoiled=True)])
    ds.mark_complete({})
    cfg = EvalConfig(env="retail", llm={"backend": "fake"})
    report = build_report(tmp_path, cfg, split="none", run={}, wall_s=1.0)
    assert report["user_spoiled"] == 1 and report["scored"] == 2 and report["pass@1"] == 0.5
    assert report["failures"]["by_criterion"] == {"DB": 1}  # the spoiled episode's failure is not the agent's


def test_eval_reads_the_test_split_and_says_when_there_is_none(tmp_path):
    tasks = [{"id": str(i), "user_scenario": {"instructions": {"domain": "retail", "reason_for_call": f"task {i}"}},
              "evaluation_criteria": {"actions": [], "reward_basis": ["DB"]}} for i in range(4)]
    (tmp_path / "tasks.json").write_text(json.dumps(tasks))
    base = {"env": "retail", "llm": {"backend": "fake"}, "tasks": {"source": "tau2", "path": str(tmp_path / "tasks.json")}}
    _, split, loaded = with_split(eval_config(base), None)
    assert split == "none" and len(loaded) == 4  # no split file: every task, and the report says so
    with pytest.raises(ValueError, match="no split_tasks.json"):
        with_split(eval_config(base), "test")  # a split asked for by name must exist
    (tmp_path / "split_tasks.json").write_text(json.dumps({"train": ["0", "1", "2"], "test": ["3"]}))
    cfg, split, loaded = with_split(eval_config(base), None)
    assert split == "test" and [t.id for t in loaded] == ["tau2-retail-3"] and cfg.tasks.allow_test_split
    _, split, loaded = with_split(eval_config(base), "train")
    assert split == "train" and len(loaded) == 3
    with pytest.raises(ValueError, match="eval runs an agent"):
        eval_config({**base, "method": "mcts_splice"})
