"""tau2's whole task schema, from tau2-bench's own unedited task files (tests/envs/tau2_mock/PROVENANCE.md):
initial_state (initialization_data, initialization_actions on either side, message_history), tickets, string and
structured scenarios, env_assertions, dual control's user tools; a task that cannot run is quarantined alone."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from envs.tasks import TaskSourceConfig, load_tasks
from flows.cli import app
from schemas.store import Dataset

HERE = Path(__file__).parent
MOCK = HERE / "tau2_mock" / "tasks.json"
TELECOM = HERE / "tau2_mock" / "telecom_tasks_small_first.json"
SERVER = HERE / "tau2_mock_server.py"


def mock_env_config() -> dict[str, Any]:
    """The mock domain's server: agent tools, `user_`-prefixed user tools, an initialization tool, a digest."""
    return {"server": {"command": [sys.executable, str(SERVER)]},
            "hidden_arguments": {"state_key": "trajforge/{episode}"},
            "exclude": ["assert_number_of_tasks", "assert_task_status"],
            "user_tool_prefix": "user_", "initialization_tool": "initialize", "state_digest": {"name": "digest"},
            "read_only_tools": ["get_users", "transfer_to_human_agents"], "terminal_tools": ["transfer_to_human_agents"]}


def write_config(tmp_path: Path, tasks: Path, **extra: Any) -> Path:
    path = tmp_path / "mock.yaml"
    path.write_text(yaml.safe_dump({"env": "mcp", "env_config": mock_env_config(), "user": {"kind": "none"},
                                    "tasks": {"source": "tau2", "path": str(tasks)}, **extra}))
    return path


def by_id(tasks: list[Any]) -> dict[str, Any]:
    return {t.metadata["upstream_id"]: t for t in tasks}


def test_every_task_of_the_unedited_mock_domain_loads_with_its_initial_state() -> None:
    tasks = by_id(load_tasks(TaskSourceConfig(source="tau2", path=str(MOCK)), "mcp"))
    assert len(tasks) == 10 and not any(t.metadata.get("unrunnable") for t in tasks.values())
    history = tasks["update_task_with_message_history"]
    conversation = history.params["message_history"]
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool", "assistant"]
    assert conversation[1]["tool_calls"][0]["name"] == "create_task"
    # The world replays the history's tool calls before the episode starts.
    assert history.params["initial_actions"] == [{"name": "create_task", "arguments": {
        "user_id": "user_1", "title": "Project Review", "description": "Review Q4 project status"}}]
    data = tasks["update_task_with_initialization_data"].params["initialization_data"]
    assert data["agent_data"]["tasks"]["task_2"]["title"] == "Project Review"
    user_side = tasks["update_task_with_user_tools"]
    assert user_side.params["initial_actions"][0]["side"] == "user"
    assert user_side.goal["env_assertions"][0] == {"name": "assert_notification_status", "side": "user",
                                                   "arguments": {"notification_id": "notif_1", "expected_status": "read"},
                                                   "assert_value": True, "message": None}
    first = tasks["create_task_1"]  # a string scenario, and the ticket kept
    assert first.metadata["user_scenario"]["instructions"].startswith("You are a team member")
    assert first.metadata["ticket"].startswith("User needs to create a task")


def test_telecom_dual_control_task_loads_with_user_side_calls() -> None:
    (task,) = load_tasks(TaskSourceConfig(source="tau2", path=str(TELECOM)), "mcp")
    assert task.id.startswith("tau2-telecom-[mobile_data_issue]")
    sides = [(a["name"], a.get("side", "assistant")) for a in task.params["initial_actions"]]
    assert sides == [("set_user_info", "user"), ("set_user_location", "user"), ("turn_roaming_off", "user"),
                     ("enable_roaming", "assistant")]
    assert task.goal["actions"] == [{"name": "toggle_roaming", "arguments": {}, "requestor": "user"}]
    assert {a["side"] for a in task.goal["env_assertions"]} == {"user"} and task.goal["reward_basis"] == ["ENV_ASSERTION"]


def test_envs_check_runs_the_unedited_mock_domain_with_its_initial_states(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["envs", "check", "--config", str(write_config(tmp_path, MOCK)), "--json"])
    report = json.loads(result.stdout[result.stdout.index("{"):])
    assert report["env_errors"] == {}, result.output
    failed = report["reference"]["failed"]
    # Passing references: the history's create_task replayed (task_2 exists to complete), initialization_data
    # applied, agent-side initialization actions, env assertions checked on the server.
    assert {"tau2-update_task_with_message_history", "tau2-update_task_with_initialization_data",
            "tau2-update_task_with_initialization_actions", "tau2-create_task_1_with_env_assertions"}.isdisjoint(failed)
    # The two the gold calls cannot solve fail on the assertions that were really run: tau2 lists no agent action
    # for one, and the other needs the user to dismiss the notification (user_assert_notification_status saw it unread).
    assert failed == {
        "tau2-update_task_with_history_and_env_assertions": "failed ENV_ASSERTION: assert_task_status gave False, not True",
        "tau2-update_task_with_user_tools": "failed ENV_ASSERTION: user_assert_notification_status gave False, not True"}
    assert result.exit_code == 1 and report["reference"]["passed"] == 8


def test_a_task_that_cannot_run_is_quarantined_with_its_reason_and_the_others_run(tmp_path: Path) -> None:
    raw = json.loads(MOCK.read_text())
    raw[0]["initial_state"] = {"initialization_actions": [{"env_type": "robot", "func_name": "x", "arguments": {}}]}
    raw[3]["evaluation_criteria"]["reward_basis"] = ["DB", "NL_ASSERTION"]  # graded by nobody: no judge
    raw.append(raw[3])  # a duplicate id
    raw.append("not a task")
    tasks_file = tmp_path / "tasks.json"
    tasks_file.write_text(json.dumps(raw))
    config = write_config(tmp_path, tasks_file, method="demonstrations")
    # A server without user tools cannot run the user-side set-up: that task alone is quarantined.
    data = yaml.safe_load(config.read_text())
    del data["env_config"]["user_tool_prefix"]
    config.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["generate", "--method", "demonstrations", "--config", str(config),
                                      "--output", str(tmp_path / "out")], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert re.search(r"scored without NL_ASSERTION \(no judge\)\s*│\s*1 episodes", result.output)
    ds = Dataset.open(tmp_path / "out")
    quarantined = {json.loads(q.raw)["task"]: q.error for q in ds.iter_records("quarantine")}
    assert set(quarantined) == {"tau2-create_task_1", "tau2-update_task_1#10", "tau2-#11",
                                "tau2-update_task_with_user_tools"}
    assert "initialization action 'x' runs on the 'robot' side" in quarantined["tau2-create_task_1"]
    assert "duplicate task id 'tau2-update_task_1'" in quarantined["tau2-update_task_1#10"]
    assert "a tau2 task is an object" in quarantined["tau2-#11"]
    assert "calls the user's tool 'add_notification'" in quarantined["tau2-update_task_with_user_tools"]
    recorded = {t.provenance.source_id: t for t in ds.iter_records("trajectories")}
    assert len(recorded) == 8  # 12 tasks, 4 quarantined
    history = recorded["tau2-update_task_with_message_history"]
    given = [s for s in history.steps if s.extra.get("given")]
    assert len(given) == 4 and not any(s.train for s in given) and history.success


def _eval_config(tmp_path: Path, base_url: str, user: dict[str, Any]) -> Path:
    raw = json.loads(MOCK.read_text())
    raw[3]["evaluation_criteria"]["reward_basis"] = ["DB", "NL_ASSERTION"]  # update_task_1: an NL assertion, no judge
    tasks_file = tmp_path / "tasks.json"
    tasks_file.write_text(json.dumps([raw[3], raw[0]]))
    path = write_config(tmp_path, tasks_file, method="rollout", user=user, max_steps=4,
                        llm={"backend": "openai", "base_url": base_url, "model": "fake-agent", "api_key_env": None,
                             "max_retries": 0, "request_timeout_s": 10})
    return path


def _agent_or_user(body: dict[str, Any]) -> Any:
    """The agent (it has tools) says it is done; the persona (no tools) answers as the agent would: a role flip."""
    if body.get("tools"):
        return "Your task is handled. Is there anything else?"
    return "Hello! How can I help you today?"


def test_eval_with_a_user_that_breaks_exits_0_and_counts_the_unscorable_episodes_by_reason(tmp_path: Path) -> None:
    from backends.fake_server import FakeServer, Rule

    with FakeServer(rules=[Rule(fn=_agent_or_user)]) as server:
        config = _eval_config(tmp_path, server.base_url, {"kind": "llm", "max_turns": 2, "fidelity": {"on_broken": "mark"}})
        result = CliRunner().invoke(app, ["eval", "--config", str(config), "--output", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert report["scored"] == 0 and report["episodes"] == 2 and report["pass@1"] is None
    assert report["unscorable_by_user"] == {"episodes": 2, "by_reason": {"role_flip": 2}, "kept_marked": 2,
                                            "quarantined": 0}
    assert "2 of 2 episode(s) unscorable: the simulated user broke them (role_flip: 2)" in result.output
    assert f"trajforge view {tmp_path / 'out'}" in result.output.replace("\n", "")
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "| unscorable: the simulated user broke them (left out) | 2 (role_flip: 2; 2 kept, marked" in readme


def test_eval_with_the_scenario_user_scores_every_episode_and_counts_nl_assertions_without_a_judge(tmp_path: Path) -> None:
    from backends.fake_server import FakeServer, Rule

    with FakeServer(rules=[Rule(fn=_agent_or_user)]) as server:
        config = _eval_config(tmp_path, server.base_url, {"kind": "scenario"})
        result = CliRunner().invoke(app, ["eval", "--config", str(config), "--output", str(tmp_path / "out")])
        persona_calls = [e for e in server.log if not e["body"].get("tools")]
    assert result.exit_code == 0, result.output
    assert not persona_calls  # no model plays the scenario user
    report = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert report["scored"] == 2 and report["unscorable_by_user"]["episodes"] == 0
    assert report["scored_without"] == {"NL_ASSERTION": 1}
    assert "1 task(s) scored without NL_ASSERTION (no judge" in result.output
    (episode,) = [t for t in Dataset.open(tmp_path / "out").iter_records("trajectories")
                  if t.provenance.source_id == "tau2-update_task_1"]
    user_turns = [s.content for s in episode.steps if s.kind == "text" and s.source == "user"]
    assert user_turns[0].startswith("I have completed the task") and user_turns[-1].endswith("###STOP###")


# ---- dual control: the user's own tools, called by the simulated user, change the world ----

def _dual_control(tmp_path: Path, base_url: str, user: dict[str, Any]) -> Path:
    """update_task_with_user_tools (tau2's mock domain) with the user's part of the gold added: the user dismisses
    the notification on its side (tau2's file lists no user-side action for it; its env assertion wants it read)."""
    (task,) = [t for t in json.loads(MOCK.read_text()) if t["id"] == "update_task_with_user_tools"]
    task["evaluation_criteria"]["actions"].append({"action_id": "dismiss", "requestor": "user", "name":
                                                   "dismiss_notification", "arguments": {"notification_id": "notif_1"}})
    tasks_file = tmp_path / "tasks.json"
    tasks_file.write_text(json.dumps([task]))
    config = write_config(tmp_path, tasks_file, method="rollout", user=user, max_steps=6,
                          llm={"backend": "openai", "base_url": base_url, "model": "fake-agent", "api_key_env": None,
                               "max_retries": 0, "request_timeout_s": 10})
    data = yaml.safe_load(config.read_text())
    data["env_config"]["exclude"] += ["user_add_notification", "user_assert_notification_status"]
    config.write_text(yaml.safe_dump(data))
    return config


def _dual_agent_and_persona(body: dict[str, Any]) -> Any:
    from backends.fake_server import ToolCallAnswer

    names = {t["function"]["name"] for t in body.get("tools") or []}
    said = [m for m in body["messages"] if m["role"] == "assistant"]
    if "dismiss_notification" in names:  # the persona, with the user's tools
        assert "update_task_status" not in names and "user_dismiss_notification" not in names
        if not any(m.get("tool_calls") for m in said):
            return ToolCallAnswer("dismiss_notification", {"notification_id": "notif_1"})
        return "Done, I dismissed it on my phone."
    if names:  # the agent
        assert "dismiss_notification" not in names and not any(n.startswith("user_") for n in names)
        plan = [ToolCallAnswer("update_task_status", {"task_id": "task_1", "status": "completed"}),
                "Please dismiss_notification notif_1 on your side, then tell me.", "All done. Anything else?"]
        return plan[min(len(said), 2)]
    return None


def test_dual_control_user_tools_are_called_by_the_user_recorded_on_its_steps_and_change_the_world(tmp_path: Path) -> None:
    from backends.fake_server import FakeServer, Rule

    for kind, user in (("persona", {"kind": "llm", "max_turns": 3, "fidelity": {"check": False}}),
                       ("scenario", {"kind": "scenario"})):
        root = tmp_path / kind
        root.mkdir()
        with FakeServer(rules=[Rule(fn=_dual_agent_and_persona)]) as server:
            config = _dual_control(root, server.base_url, user)
            result = CliRunner().invoke(app, ["generate", "--method", "rollout", "--config", str(config),
                                              "--output", str(root / "out")])
        assert result.exit_code == 0, result.output
        (t,) = Dataset.open(root / "out").iter_records("trajectories")
        calls = [c for s in t.steps if s.kind == "text" and s.source == "user" for c in s.extra.get("user_tool_calls") or []]
        assert [(c["name"], c["arguments"]) for c in calls] == [("dismiss_notification", {"notification_id": "notif_1"})]
        assert calls[0]["result"] == "Notification notif_1 dismissed", kind
        assert [s.function for s in t.steps if s.kind == "api"] == ["update_task_status"]  # the agent's only
        verdict = t.details["evaluation"]["details"]
        # The user's call changed the world: the env assertion on the user's side holds, the DB digest matches.
        assert verdict["ENV_ASSERTION"]["passed"] and verdict["DB"]["passed"] and verdict["ACTION"]["passed"], kind
        assert t.success, kind


def test_the_unedited_mock_domain_runs_demonstration_dialogues_and_an_eval(tmp_path: Path) -> None:
    from backends.fake_server import FakeServer, Rule

    config = write_config(tmp_path, MOCK, method="demonstrations", dialogue=True, user={"kind": "scenario"},
                          policy_check={"auth_tools": [], "public_tools": []})
    result = runner_invoke(["generate", "--method", "demonstrations", "--config", str(config),
                            "--output", str(tmp_path / "demos")])
    ds = Dataset.open(tmp_path / "demos")
    assert not list(ds.iter_records("quarantine")) and not list(ds.iter_records("filtered")), result.output
    failed = {t.provenance.source_id for t in ds.iter_records("trajectories") if not t.success}
    # The two whose gold cannot solve them (see the envs check test); the eight others pass, initial states included.
    assert failed == {"tau2-update_task_with_history_and_env_assertions", "tau2-update_task_with_user_tools"}

    with FakeServer(rules=[Rule(fn=_agent_or_user)]) as server:
        config = write_config(tmp_path, MOCK, method="rollout", user={"kind": "scenario"}, max_steps=3,
                              llm={"backend": "openai", "base_url": server.base_url, "model": "fake-agent",
                                   "api_key_env": None, "max_retries": 0, "request_timeout_s": 10})
        result = runner_invoke(["eval", "--config", str(config), "--output", str(tmp_path / "eval")])
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["scored"] == report["episodes"] == 10 and report["errors"] == {}, result.output


def runner_invoke(args: list[str]) -> Any:
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    return result


def test_dual_control_references_play_the_users_part_on_the_users_tools(tmp_path: Path) -> None:
    config = _dual_control(tmp_path, "http://127.0.0.1:9", {"kind": "scenario"})
    check = runner_invoke(["envs", "check", "--config", str(config), "--json"])
    report = json.loads(check.stdout[check.stdout.index("{"):])
    assert report["reference"]["passed"] == 1 and report["healthy"], check.output
    data = yaml.safe_load(config.read_text())
    data.update(method="demonstrations", dialogue=True, policy_check={"auth_tools": [], "public_tools": []})
    del data["llm"]
    config.write_text(yaml.safe_dump(data))
    runner_invoke(["generate", "--method", "demonstrations", "--config", str(config), "--output", str(tmp_path / "d")])
    (t,) = Dataset.open(tmp_path / "d").iter_records("trajectories")
    asked = next(s for s in t.steps if s.kind == "message" and "dismiss notification" in s.content)
    done = t.steps[t.steps.index(asked) + 1]
    assert done.source == "user" and done.extra["user_tool_calls"][0]["name"] == "dismiss_notification"
    assert t.success and [s.function for s in t.steps if s.kind == "api"] == ["update_task_status"]
