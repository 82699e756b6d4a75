"""`trajforge envs` lists the environments; `trajforge envs check` validates one on real tasks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from envs.tasks import TaskSourceConfig, load_tasks
from flows.cli import app
from tests.envs.mcp_support import CONFIG, TASKS

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("scratch")  # a failing check's folder goes to the test's tmp_path
# Two tasks that ask for nothing to change and nothing to be told (25, 57), one that asks only for
# information graded by NL assertions (24), references that probe a wrong email first (35) or make a
# write that fails in tau2's own replay of them (105), and plain ones.
SUBSET = ["tau2-retail-0", "tau2-retail-16", "tau2-retail-24", "tau2-retail-25", "tau2-retail-35", "tau2-retail-57",
          "tau2-retail-105"]


def check_config(tmp_path: Path, ids: list[str], **env_config: Any) -> Path:
    config = yaml.safe_load(CONFIG.read_text())
    config["env_config"].update(env_config)
    config["tasks"] = {**config["tasks"], "ids": ids}
    config["tasks"].pop("n", None)
    path = tmp_path / "check.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def asks_for_nothing(ids: list[str]) -> list[str]:
    """Tasks whose criteria ask for no change (no reference write) and no information, from the task data."""
    read_only = set(yaml.safe_load(CONFIG.read_text())["env_config"]["read_only_tools"])
    tasks = load_tasks(TaskSourceConfig(source="tau2", path=TASKS, ids=ids), "mcp")
    return [t.id for t in tasks if all(a["name"] in read_only for a in t.goal["actions"])
            and not t.goal["communicate_info"] and not t.goal["nl_assertions"]]


def test_envs_lists_environments_and_capabilities() -> None:
    result = runner.invoke(app, ["envs"])
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") >= 4}
    assert {"mcp", "retail", "simulated", "web"} <= set(rows)
    assert "replay" in rows["mcp"] and "snapshot" in rows["retail"]


def test_envs_check_passes_references_and_fails_do_nothing_on_tau2_retail(tmp_path: Path) -> None:
    result = runner.invoke(app, ["envs", "check", "--config", str(check_config(tmp_path, SUBSET)), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tasks"] == len(SUBSET) and report["healthy"]
    assert report["reference"]["passed"] == report["reference"]["total"] == len(SUBSET), report["reference"]["failed"]
    assert report["tool_errors"] == 0 and report["env_errors"] == {}
    # The references' own failing calls are listed, not blamed on the environment.
    failing = {(e["task"], e["tool"]) for e in report["reference_error_calls"]}
    assert {("tau2-retail-35", "find_user_id_by_email"), ("tau2-retail-105", "exchange_delivered_order_items")} <= failing
    # Do-nothing passes where the criteria ask for no change and no information (25, 57). 24 and 105 ask for
    # information through NL assertions only, which nothing checks without a judge: their passes are flagged
    # (105 asks for no change either: its only write fails in its own reference, as in tau2's gold replay).
    assert asks_for_nothing(SUBSET) == ["tau2-retail-25", "tau2-retail-57"]
    assert report["do_nothing"]["passed_tasks"] == ["tau2-retail-24", "tau2-retail-25", "tau2-retail-57",
                                                    "tau2-retail-105"]
    assert report["do_nothing"]["passed_unchecked"] == {"tau2-retail-24": ["NL_ASSERTION"],
                                                        "tau2-retail-105": ["NL_ASSERTION"]}
    assert 0 < report["seconds_per_step"] < 5


def test_envs_check_catches_episodes_sharing_state(tmp_path: Path) -> None:
    # A server wrongly declared stateless, without a per-episode state key: every episode writes the same
    # database, and the second replay of a reference meets the first one's changes.
    config = check_config(tmp_path, ["tau2-retail-0", "tau2-retail-25"], hidden_arguments={}, stateless=True)
    result = runner.invoke(app, ["envs", "check", "--config", str(config), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert not report["healthy"] and report["tool_errors"] >= 1
    assert report["tool_error_calls"][0]["tool"] == "exchange_delivered_order_items"


def test_envs_check_names_a_bad_config_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: mcp\nenv_config: {server: {}}\ntasks: {source: tau2, path: " + TASKS + "}\n")
    result = runner.invoke(app, ["envs", "check", "--config", str(bad)])
    assert result.exit_code == 1
    assert "give either command" in result.output and "Traceback" not in result.output


# ---- what a healthy environment must show (the example key-value server) ---------------------------

KV = {"env": "mcp", "env_config": {"server": {"command": ["python", "envs/mcp/kvstore_server.py"]},
                                   "hidden_arguments": {"state_key": "{episode}"}, "reset_tool": {"name": "reset"},
                                   "state_digest": {"name": "digest", "result_path": "sha256"}}}
PUT = {"id": "kv-colour", "instruction": "Remember that my favourite colour is blue.",
       "goal": {"actions": [{"name": "put", "arguments": {"key": "colour", "value": "blue"}}], "reward_basis": ["DB"]}}


def kv_check(tmp_path: Path, tasks: list[dict[str, Any]], **env_config: Any) -> Any:
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    config = {**KV, "env_config": {**KV["env_config"], **env_config},
              "tasks": {"source": "jsonl", "path": str(tmp_path / "tasks.jsonl")}}
    (tmp_path / "kv.yaml").write_text(yaml.safe_dump(config))
    result = runner.invoke(app, ["envs", "check", "--config", str(tmp_path / "kv.yaml"), "--json"])
    return result.exit_code, json.loads(result.stdout) if result.stdout.startswith("{") else result.output


def test_envs_check_is_unhealthy_without_references(tmp_path: Path) -> None:
    code, report = kv_check(tmp_path, [{"id": "a", "instruction": "Say hi."}, {"id": "b", "instruction": "Bye."}])
    assert code == 1 and not report["healthy"] and report["reference"]["total"] == 0
    assert report["problems"][0].startswith("no task has a reference solution")


def test_envs_check_counts_failing_reference_calls_beyond_declared_probes(tmp_path: Path) -> None:
    forget = {"id": "kv-forget", "instruction": "Forget my colour.",
              "goal": {"actions": [{"name": "delete", "arguments": {"key": "colour"}}], "reward_basis": ["DB"]}}
    code, report = kv_check(tmp_path, [PUT, forget])  # there is no colour to delete: the reference call fails
    assert code == 1 and report["unexpected_reference_errors"] == {"kv-forget": {"failed": 1, "probes": 0}}
    assert report["reference"]["passed"] == 2  # a failed write is not required: only the probe rule catches it
    code, report = kv_check(tmp_path, [PUT, {**forget, "goal": {**forget["goal"], "probes": 1}}])
    assert code == 0 and report["healthy"], report


def test_envs_check_is_unhealthy_when_doing_nothing_passes_a_task_that_writes(tmp_path: Path) -> None:
    # A "digest" that cannot see the change: the greeting, which the task leaves alone.
    code, report = kv_check(tmp_path, [PUT], state_digest={"name": "get", "arguments": {"key": "greeting"}})
    assert code == 1 and report["do_nothing"]["passed_tasks"] == ["kv-colour"]
    assert any(p.startswith("kv-colour: do-nothing passed though the reference changes state") for p in report["problems"])


def test_envs_check_of_an_mcp_config_without_tasks_says_so_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "kv.yaml").write_text(yaml.safe_dump(KV))
    result = runner.invoke(app, ["envs", "check", "--config", str(tmp_path / "kv.yaml")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "needs a tasks: block" in " ".join(result.output.split())


def test_envs_check_takes_a_generation_config_as_it_is(tmp_path: Path) -> None:
    """A browser method config records screenshots and sets max_steps: the check runs it as it stands."""
    config = yaml.safe_load((CONFIG.parents[0] / "browser_miniwob.yaml").read_text())
    config["env_config"]["observe"] = ["axtree", "html", "screenshot"]
    config.update(method="rollout", llm={"backend": "llamacpp", "max_tokens": 64}, max_steps=8, agent_mode="tools")
    config["tasks"]["options"]["tasks"] = ["click-button"]
    (tmp_path / "method.yaml").write_text(yaml.safe_dump(config))
    result = runner.invoke(app, ["envs", "check", "--config", str(tmp_path / "method.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["reference"]["passed"] == 1


def test_env_config_max_steps_is_refused_for_the_top_level_one(tmp_path: Path) -> None:
    (tmp_path / "kv.yaml").write_text(yaml.safe_dump({**KV, "env_config": {**KV["env_config"], "max_steps": 3}}))
    result = runner.invoke(app, ["envs", "check", "--config", str(tmp_path / "kv.yaml")])
    assert result.exit_code == 1 and "write max_steps at the top level" in " ".join(result.output.split())


# ---- what a failing check shows, and what it leaves behind -----------------------------------------


def kv_check_text(tmp_path: Path, tasks: list[dict[str, Any]], **env_config: Any) -> tuple[int, str]:
    """A check's human output (no --json), with its lines unwrapped."""
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    config = {**KV, "env_config": {**KV["env_config"], **env_config},
              "tasks": {"source": "jsonl", "path": str(tmp_path / "tasks.jsonl")}}
    (tmp_path / "kv.yaml").write_text(yaml.safe_dump(config))
    result = runner.invoke(app, ["envs", "check", "--config", str(tmp_path / "kv.yaml")])
    return result.exit_code, " ".join(result.output.split())


def test_envs_check_shows_why_a_reference_call_was_refused(tmp_path: Path) -> None:
    typo = {"id": "kv-typo", "instruction": "Remember 7.",  # refused before the server: the schema wants a string
            "goal": {"actions": [{"name": "put", "arguments": {"key": "n", "value": 7}}], "reward_basis": ["ACTION"]}}
    forget = {"id": "kv-forget", "instruction": "Forget my colour.",  # refused by the server: there is no colour
              "goal": {"actions": [{"name": "delete", "arguments": {"key": "colour"}}], "reward_basis": ["DB"]}}
    code, output = kv_check_text(tmp_path, [typo, forget])
    assert code == 1
    assert "kv-typo: failed ACTION" in output
    assert "step 0 put was refused: argument 'value' must be of type string, got integer" in output
    # The server's own reason.
    assert "kv-forget step 0 delete was refused: Error executing tool delete: no key 'colour'" in output


def check_folders(root: Path) -> list[Path]:
    return sorted(root.glob("trajforge-envs-check-*"))


def test_envs_check_removes_its_folder_when_healthy_and_keeps_the_logs_where_it_says_when_not(
        tmp_path: Path, scratch: Path) -> None:
    code, output = kv_check_text(tmp_path, [PUT])
    assert code == 0 and check_folders(scratch) == []
    assert "files of the check" not in output

    code, output = kv_check_text(tmp_path, [{"id": "a", "instruction": "Say hi."}])  # unhealthy: no reference
    (kept,) = check_folders(scratch)
    assert code == 1 and f"filesofthecheck(serverlogs,screenshots):{kept}" in output.replace(" ", "")  # paths wrap
    assert list((kept / "logs" / "mcp").glob("*.log"))

    # A server that dies at start: the one-line error says where its log is.
    code, output = kv_check_text(tmp_path, [PUT], server={"command": ["python", "-c", "import sys; "
                                                                     "print('no database', file=sys.stderr); sys.exit(3)"]})
    assert code == 1 and "Traceback" not in output
    (crashed,) = [p for p in check_folders(scratch) if p != kept]
    assert f"(serverlogs:{crashed})" in "".join(output.split())  # a long path wraps
    assert "no database" in "".join(p.read_text() for p in (crashed / "logs" / "mcp").glob("*.log"))


# ---- envs tasks / envs episode: what a trainer outside trajforge (the verifiers adapter) calls ------------

ROLLOUT = Path(__file__).resolve().parents[2] / "configs" / "rollout_retail.yaml"


def test_envs_tasks_and_one_episode_as_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from backends.fake_server import FakeServer, Rule
    from tests.generators.test_rollout import RetailScript, _retail_tasks

    result = runner.invoke(app, ["envs", "tasks", "--config", str(ROLLOUT)])
    assert result.exit_code == 0, result.output
    tasks = _retail_tasks(2)
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"id": t.id, "instruction": t.instruction} for t in tasks]
    monkeypatch.setenv("EPISODE_KEY", "sk-test")
    with FakeServer(rules=[Rule(fn=RetailScript(tasks))]) as server:
        result = runner.invoke(app, ["envs", "episode", "--config", str(ROLLOUT), "--task", tasks[0].id, "--sample", "1",
                                     "--output", str(tmp_path / "one"), "--base-url", server.base_url,
                                     "--model", "fake-model", "--api-key-env", "EPISODE_KEY"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == {"record": f"rollout/{tasks[0].id}#1", "task": tasks[0].id, "sample": 1,
                                             "reward": 1.0, "success": True, "reason": "goal state reached",
                                             "dataset": str(tmp_path / "one")}
        assert {e["body"].get("seed") for e in server.log if "body" in e} == {1}  # draw 1: the config's seed 0 + 1
    # Bad input: one line each, no traceback.
    for args, line in (
        (["--task", "nope", "--output", str(tmp_path / "two")], "task 'nope' is not one of the config's tasks"),
        (["--task", tasks[0].id, "--output", str(tmp_path / "one")], "not empty; an episode writes a new dataset"),
    ):
        result = runner.invoke(app, ["envs", "episode", "--config", str(ROLLOUT), *args])
        assert result.exit_code == 1 and line in result.output and "Traceback" not in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: retail\nmax_steps: 0\n")
    result = runner.invoke(app, ["envs", "tasks", "--config", str(bad)])
    assert result.exit_code == 1 and "max_steps" in result.output and "Traceback" not in result.output
