"""The demonstrations method: reference solutions recorded as episodes, starting with the agent's system prompt,
so that the rows an export makes of them are the requests the agent sends at eval."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from converters.export import preview
from flows.cli import app
from generators.agent import SYSTEM, AgentPolicy
from schemas.store import Dataset


def _wire(messages: list[dict]) -> list[dict]:
    """Exported messages with tool-call arguments as the JSON strings a request sends (TRL rows keep mappings)."""
    return [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                                 for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]


def test_demonstrations_replay_references_and_export_the_agents_own_requests(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "no-reference", "instruction": "Just chat with me."}) + "\n")
    runner = CliRunner()
    out = tmp_path / "demos"
    config = tmp_path / "demos.yaml"
    config.write_text(yaml.safe_dump({"env": "retail", "tasks": {"n": 3}, "concurrency": 2}))
    result = runner.invoke(app, ["generate", "-m", "demonstrations", "-c", str(config), "-o", str(out)])
    assert result.exit_code == 0, result.output
    trajectories = list(Dataset.open(out).iter_records())
    assert len(trajectories) == 3 and all(t.success for t in trajectories)
    for t in trajectories:
        system, task, *rest = t.steps
        assert (system.kind, system.name, system.source, system.content, system.train) == (
            "text", "system", "environment", SYSTEM, False)
        assert task.source == "user" and t.provenance.model == "reference-solution"
        calls = [s for s in rest if s.kind == "api"]
        assert calls and [s.function for s in calls] == [a["function"] for a in t.details["task"]["goal"]["actions"]]
        answers = {s.tool_call_id for s in rest if s.kind == "text" and s.tool_call_id}
        assert {c.tool_call_id for c in calls} == answers  # every call answered under its own id
        # No model answered: every action is declared written by the reference.
        acted = [i for i, s in enumerate(t.steps) if s.kind in ("api", "message")]
        assert t.details["rewrites"] == [{"steps": acted, "kind": "written",
                                          "reason": "the environment's reference solution"}]
        # Each trained assistant turn's prompt is exactly what the agent would send at that point of the episode.
        policy = AgentPolicy(None, t.tools, mode="tools", system=SYSTEM)  # type: ignore[arg-type]
        rows = preview(t, "trl-sft").rows
        assert [_wire(row["prompt"]) for row in rows] == [policy.prompt(t.steps[:i]) for i in acted]
    # A task without a reference solution is filtered with the reason, not lost.
    config.write_text(yaml.safe_dump({"env": "retail", "tasks": {"source": "jsonl", "path": str(tasks)}}))
    none = runner.invoke(app, ["generate", "-m", "demonstrations", "-c", str(config), "-o", str(tmp_path / "none")])
    assert "rejected: demonstrations: no reference solution" in none.output
    (filtered,) = Dataset.open(tmp_path / "none").iter_records("filtered")
    assert filtered.decision.reason == "no reference solution"
