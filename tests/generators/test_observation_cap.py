"""An observation longer than the limit is cut where it leaves the world: the agent, the stored step
and the export see the same cut text, the step records the cut, the record keeps the whole text once."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from backends.fake_server import FakeServer, Rule, ToolCallAnswer
from flows.cli import app
from schemas.cut import cut_observation, marker
from schemas.models import TextObservation, WebObservation
from schemas.store import Dataset

SERVER = Path(__file__).resolve().parents[1] / "envs" / "big_result_server.py"
SIZE, LIMIT = 60_000, 5_000
WHOLE = ("0123456789abcdef" * (SIZE // 16 + 1))[:SIZE]


def _agent(body: dict):
    """Asks for the report twice (the same text: kept once), then answers."""
    if not body.get("tools"):
        return None
    calls = sum(1 for m in body["messages"] if m["role"] == "assistant")
    return ToolCallAnswer("report", {"size": SIZE}) if calls < 2 else "Here is your report."


def test_a_long_tool_result_is_cut_for_the_agent_the_record_and_the_export(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t1", "env": "mcp", "instruction": "Give me the report."}) + "\n")
    with FakeServer(rules=[Rule(fn=_agent)]) as server:
        config = {"env": "mcp", "env_config": {"server": {"command": [sys.executable, str(SERVER)]}},
                  "user": {"kind": "none"}, "tasks": {"source": "jsonl", "path": str(tasks)}, "max_steps": 4,
                  "max_observation_chars": LIMIT,
                  "llm": {"backend": "openai", "base_url": server.base_url, "model": "fake-model", "api_key_env": None,
                          "max_retries": 0, "request_timeout_s": 30}}
        (tmp_path / "rollout.yaml").write_text(yaml.safe_dump(config))
        result = CliRunner().invoke(app, ["generate", "--method", "rollout", "--config", str(tmp_path / "rollout.yaml"),
                                          "--output", str(tmp_path / "out")])
        assert result.exit_code == 0, result.output
        seen = [m["content"] for entry in server.log for m in entry["body"]["messages"] if m["role"] == "tool"]
    cut = WHOLE[:LIMIT] + marker(SIZE, LIMIT)
    assert seen and set(seen) == {cut}  # the agent saw the cut, never the whole text

    (trajectory,) = Dataset.open(tmp_path / "out").iter_records()
    results = [s for s in trajectory.steps if s.kind == "text" and s.name == "report"]
    digest = hashlib.sha256(WHOLE.encode()).hexdigest()
    assert len(results) == 2 and all(s.content == cut for s in results)
    assert all(s.extra["cut"] == {"content": {"chars": SIZE, "kept": LIMIT, "sha256": digest}} for s in results)
    assert trajectory.details["full_observations"] == {digest: WHOLE}  # once, for both steps
    assert trajectory.model_dump_json().count(WHOLE) == 1

    result = CliRunner().invoke(app, ["export", str(tmp_path / "out"), "-f", "openai", "-o", str(tmp_path / "x"),
                                      "--include-failed"])
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in (tmp_path / "x" / "data" / "train-00000-of-00001.jsonl").open()]
    assert [m["content"] for m in row["messages"] if m["role"] == "tool"] == [cut, cut]


def test_cut_observations_keep_short_fields_and_pages_cut_per_field():
    short = TextObservation(content="ok", source="environment")
    assert cut_observation(short, 10) is short and cut_observation(short, None) is short
    page = WebObservation(url="http://x", html="<p>" * 100, axtree="tree")
    cut = cut_observation(page, 30)
    assert cut.html == "<p>" * 10 + marker(300, 30) and cut.axtree == "tree" and page.html == "<p>" * 100
    assert set(cut.extra["cut"]) == {"html"} and "cut" not in page.extra
    assert "_full_texts" not in cut.model_dump_json()
