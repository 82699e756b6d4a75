"""What `trajforge generate` prints where no one watches a terminal (a log file, CI): progress lines as the
work goes, and, when a method keeps nothing, why."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from backends.fake_server import FakeServer, Rule
from flows.cli import app


def test_progress_lines_and_a_curriculum_that_evolves_nothing_says_why(tmp_path: Path) -> None:
    # An agent that never solves anything: every task's mean reward is 0, out of the band (0, 1).
    with FakeServer(rules=[Rule(answer="I cannot help with that.")]) as server:
        config = {"method": "curriculum", "env": "retail", "env_config": {"seed": 0}, "tasks": {"n": 3},
                  "rollouts": 2, "generations": 1, "max_steps": 2, "concurrency": 1, "unit_tasks": 1,
                  "llm": {"backend": "openai", "base_url": server.base_url, "model": "fake", "api_key_env": None,
                          "max_retries": 0}}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
        result = CliRunner().invoke(app, ["generate", "--method", "curriculum", "--config", str(tmp_path / "c.yaml"),
                                          "--output", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    # Not a terminal: plain lines, from 0 to the end, not a bar drawn once at exit.
    assert "curriculum tasks: 0/3 (0%), 0 s" in lines
    assert any(line.startswith("curriculum tasks: 3/3 (100%)") and line.endswith("done") for line in lines)
    text = " ".join(result.output.split())
    assert "nothing evolved: none of the 3 task(s) of the last round had a mean reward strictly inside the band" in text
    assert "note: curriculum generation 1: nothing evolved" in text
