"""The verifiers adapter (integrations/verifiers) through verifiers' own entry point, `vf-eval`, run from
verifiers' own venv (PyPI, the version the adapter pins; tests/server_venvs.py) against the fake server with
scripted answers. The reward verifiers reports must be the trajforge environment's evaluation."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from backends.fake_server import Fault, FakeServer, Rule, ToolCallAnswer
from schemas.store import Dataset
from tests.conftest import REPO
from tests.generators.test_rollout import RetailScript, _first_user, _retail_tasks
from tests.server_venvs import SERVERS, server_venv

PLUGIN = REPO / "integrations" / "verifiers"
CONFIG = REPO / "configs" / "rollout_retail.yaml"
# trajforge from this checkout, whatever is installed: the adapter runs this command line.
TRAJFORGE = f"env PYTHONPATH={shlex.quote(str(REPO))} {shlex.quote(sys.executable)} -m flows.cli"


def _verifiers_bin() -> Path:
    """verifiers' venv (made once, cached); a build that fails fails the test with one line."""
    try:
        return server_venv("verifiers") / "bin"
    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
        pytest.fail(f"could not build the verifiers venv ({' '.join(SERVERS['verifiers'])}): {exc}")


def _run(argv: list[str], timeout: int = 180) -> subprocess.CompletedProcess[str]:
    # The adapter is put on the path, not installed: the cached venv serves every checkout.
    env = {**os.environ, "PYTHONPATH": str(PLUGIN), "FAKE_SERVER_KEY": "sk-test", "COLUMNS": "1000"}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_vf_eval_rewards_each_rollout_with_the_environments_evaluation(tmp_path):
    bin_dir = _verifiers_bin()
    config = tmp_path / "rollout.yaml"  # the shipped example with a third task
    config.write_text(yaml.safe_dump({**yaml.safe_load(CONFIG.read_text()), "tasks": {"source": "env", "n": 3, "seed": 0}}))
    tasks = _retail_tasks(3)
    script = RetailScript(tasks)  # task 0: the reference actions (goal state); task 1: looks up, changes nothing
    asked: dict[tuple[str, int], int] = {}  # requests per (task instruction, sampling seed)

    def agent(body: dict):
        key = (_first_user(body), body.get("seed"))
        asked[key] = asked.get(key, 0) + 1
        return script(body)

    # Task 2's model fails: its episode makes no trajectory.
    with FakeServer(rules=[Rule(match=tasks[2].instruction, answer=Fault("500")), Rule(fn=agent)]) as server:
        done = _run([str(bin_dir / "vf-eval"), "trajforge-verifiers", "--env.taskset.config", str(config),
                     "--env.taskset.trajforge", TRAJFORGE, "--env.taskset.rollouts", str(tmp_path / "rollouts"),
                     "-m", "fake-model", "--client.base-url", server.base_url, "--client.api-key-var", "FAKE_SERVER_KEY",
                     "--no-push", "--no-rich", "-n", "3", "-r", "2", "-o", str(tmp_path / "runs")])
    assert done.returncode == 0, done.stderr[-3000:]
    [traces_file] = (tmp_path / "runs").glob("*/traces.jsonl")
    episodes = [json.loads(line) for line in traces_file.read_text().splitlines()]
    assert sorted(e["task"]["data"]["id"] for e in episodes) == sorted([t.id for t in tasks] * 2)
    for i, expected in ((0, 1.0), (1, 0.0)):
        task = tasks[i]
        draws = set()
        for episode in (e for e in episodes if e["task"]["data"]["id"] == task.id):
            [trace] = episode["traces"]
            assert episode["ok"] and not trace["errors"], trace["errors"]
            # verifiers' reward is the environment's: goal state reached or not.
            assert trace["rewards"] == {"env_reward": {"score": expected, "weight": 1.0}}
            assert trace["metrics"]["env_success"] == expected
            # ... and the same episode is a trajforge trajectory, with the world's own verdict.
            played = trace["info"]["trajforge"]
            [record] = list(Dataset.open(played["dataset"]).iter_records())
            assert record.id == f"rollout/{task.id}#{played['sample']}" and record.reward == expected
            assert record.details["evaluation"]["reason"] == ("goal state reached" if expected else
                                                              "the database differs from the goal state")
            # Every model call went through verifiers' interception (what a verifiers trainer trains on); the
            # group's rollouts are distinct draws (sampling seed = the config's 0 + the draw).
            assert len(trace["calls"]) == asked[(task.instruction, played["sample"])] == len(script.plan(i))
            draws.add(played["sample"])
        assert draws == {0, 1}
    # An episode without a trajectory is an errored rollout, not a reward of 0.
    for episode in (e for e in episodes if e["task"]["data"]["id"] == tasks[2].id):
        [trace] = episode["traces"]
        assert not episode["ok"] and trace["rewards"] == {} and "500" in trace["errors"][0]["message"]


# load_environment from Python, then vf-eval's own entry point on a config that is not there.
SCRIPT = """
import sys
from trajforge_verifiers import load_environment
from verifiers.v1.cli.eval.main import main
env = load_environment(config=sys.argv[1], trajforge=sys.argv[2])
print(type(env).__name__, *(task.data.id for task in env.taskset))
try:
    main(["trajforge-verifiers", "--env.taskset.config", sys.argv[3], "-m", "m", "--no-push", "--no-rich"])
except SystemExit as exc:
    print("exit", exc.code)
"""


def test_load_environment_builds_the_env_and_a_missing_config_is_one_line(tmp_path):
    missing = tmp_path / "nope.yaml"
    done = _run([str(_verifiers_bin() / "python"), "-c", SCRIPT, str(CONFIG), TRAJFORGE, str(missing)])
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["TrajforgeEnv", *(t.id for t in _retail_tasks(2))]
    assert f"{missing}: no such file (a trajforge rollout config)" in done.stdout + done.stderr
    assert lines[-1] == "exit 1" and "Traceback" not in done.stdout + done.stderr


# ---- beyond retail: a PyPI MCP server, a MiniWoB page ------------------------------------------------------------


def _agent(first_call):
    """An agent that makes `first_call(body)` (a ToolCallAnswer) once, then tells the user it is done."""

    def answer(body: dict):
        if any(m.get("role") == "tool" for m in body["messages"]):
            return "Done."
        return first_call(body)

    return answer


def _vf_eval(tmp_path, config: dict, agent) -> list[dict]:
    path = tmp_path / "world.yaml"
    path.write_text(yaml.safe_dump(config))
    with FakeServer(rules=[Rule(fn=agent)]) as server:
        done = _run([str(_verifiers_bin() / "vf-eval"), "trajforge-verifiers", "--env.taskset.config", str(path),
                     "--env.taskset.trajforge", TRAJFORGE, "--env.taskset.rollouts", str(tmp_path / "rollouts"),
                     "-m", "fake-model", "--client.base-url", server.base_url, "--client.api-key-var",
                     "FAKE_SERVER_KEY", "--no-push", "--no-rich", "-n", "1", "-r", "1", "-o", str(tmp_path / "runs")])
    assert done.returncode == 0, done.stderr[-3000:]
    [traces_file] = (tmp_path / "runs").glob("*/traces.jsonl")
    return [json.loads(line) for line in traces_file.read_text().splitlines()]


def test_vf_eval_on_a_pypi_mcp_server(tmp_path):
    """tau2-bench's mock domain from PyPI (`tau2-mock-mcp-eval`, its own venv), the server setting the task up."""
    venv = server_venv("tau2-mock")
    config = {"env": "mcp", "user": {"kind": "none"}, "max_steps": 3, "llm": {"temperature": 0.0},
              "tasks": {"source": "tau2", "path": "pkg://tau2_mock_mcp/data/tasks.json", "ids": ["tau2-create_task_1"]},
              "env_config": {"server": {"command": ["tau2-mock-mcp"], "venv": str(venv), "handshake": "legacy",
                                        "env": {"TAU2_MOCK_MCP_STATE_DIR": "{tmpdir}"}},
                             "hidden_arguments": {"state_key": "trajforge/{episode}"}, "exclude": ["get_call_log"],
                             "reset_tool": {"name": "reset_state", "initializes": True,
                                            "arguments": {"task_id": "{task_id}", "state_key": "trajforge/{episode}"}}}}
    agent = _agent(lambda body: ToolCallAnswer("create_task", {"user_id": "user_1", "title": "Important Meeting"}))
    [episode] = _vf_eval(tmp_path, config, agent)
    [trace] = episode["traces"]
    assert episode["ok"] and trace["rewards"] == {"env_reward": {"score": 1.0, "weight": 1.0}}, trace["errors"]
    [record] = list(Dataset.open(trace["info"]["trajforge"]["dataset"]).iter_records())
    assert [s.function for s in record.steps if s.kind == "api"] == ["create_task"] and record.reward == 1.0


def test_vf_eval_on_a_miniwob_page(tmp_path):
    """A MiniWoB page in Chromium: the agent clicks the button the page asks for; the page's own reward."""
    config = {"env": "browser", "env_config": {"observe": ["axtree"], "actions": ["click"]}, "max_steps": 2,
              "llm": {"temperature": 0.0}, "tasks": {"source": "miniwob",
                                                      "options": {"tasks": ["click-button"], "seeds": 1}}}

    def click(body):
        page = "\n".join(str(m.get("content")) for m in body["messages"])
        label = re.search(r'Click on the "([^"]+)" button', page).group(1)
        return ToolCallAnswer("click", {"bid": re.search(r"\[(\w+)\] button '" + re.escape(label) + "'", page).group(1)})

    [episode] = _vf_eval(tmp_path, config, _agent(click))
    [trace] = episode["traces"]
    assert episode["ok"] and trace["rewards"] == {"env_reward": {"score": 1.0, "weight": 1.0}}, trace["errors"]
    [record] = list(Dataset.open(trace["info"]["trajforge"]["dataset"]).iter_records())
    assert record.id == "rollout/miniwob/click-button/0#0" and record.reward == 1.0
