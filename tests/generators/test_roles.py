"""A role beside acting (a judge, a teacher, ...) that the acting model plays itself is said so: in the run
summary `trajforge generate` prints, in every record it writes, and on the export's card; a role with a model
of its own is named as such."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml
from typer.testing import CliRunner

from backends.fake_server import FakeServer, Rule
from flows.cli import app
from generators.mcts_splice import MCTSSplice, MCTSSpliceConfig
from generators.scripted import ScriptedRetailLLM, cancel_tasks
from schemas.store import Dataset

runner = CliRunner()


def _llm(base_url: str, model: str) -> dict:
    return {"backend": "openai", "base_url": base_url, "model": model, "api_key_env": None, "max_retries": 0}


def _search(path: Path) -> Path:
    method = MCTSSplice(MCTSSpliceConfig(tasks={"n": 1}, verifier="divergence", search={"iterations": 2}),
                        ScriptedRetailLLM(cancel_tasks(1)))
    asyncio.run(method.run(method.tasks(), Dataset.create(path, stage="generate:mcts_splice")))
    return path


def _verify(tmp_path: Path, base_url: str, name: str, judge: dict | None) -> tuple[str, Path]:
    config = {"method": "step_verify", "input": str(tmp_path / "search"), "verifier": "llm",
              "llm": _llm(base_url, "fake-actor"), **({"judge": {"llm": judge}} if judge else {})}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / name
    result = runner.invoke(app, ["generate", "--method", "step_verify", "--config", str(path), "--output", str(out)])
    assert result.exit_code == 0, result.output
    return result.output, out


def test_a_judge_played_by_the_actor_is_said_so_in_the_summary_the_records_and_the_card(tmp_path: Path) -> None:
    _search(tmp_path / "search")
    with FakeServer(rules=[Rule(fn=lambda body: {"label": "good", "reason": "fine"})]) as server:
        said, alone = _verify(tmp_path, server.base_url, "alone", None)
        told, judged = _verify(tmp_path, server.base_url, "judged", _llm(server.base_url, "fake-judge"))

    # No judge.llm: the step judge is the acting model, in the summary and in a note.
    assert "role: step judge" in said and "the acting model itself (openai:fake-actor" in " ".join(said.split())
    assert "note: the step judge was the acting model itself" in " ".join(said.split())
    records = list(Dataset.open(alone).iter_records())
    assert records and all(r.details["actor_roles"] == ["step judge"] for r in records)
    assert all(r.details["roles"]["step judge"] == "openai:fake-actor" for r in records)
    assert Dataset.open(alone).manifest()["last_run"]["roles"]["step judge"]["played_by"] == "actor"
    exported = runner.invoke(app, ["export", str(alone), "--format", "trl-kto", "--output", str(tmp_path / "kto")])
    assert exported.exit_code == 0, exported.output
    card = (tmp_path / "kto" / "README.md").read_text()
    assert "## Roles played by the acting model" in card
    # Step-pair members are pair-only: KTO trains no row of theirs, so the card counts the others.
    trained = [r for r in records if not r.details.get("pair_only")]
    assert len(trained) < len(records) and f"| mcts_splice | step judge | {len(trained)} |" in card

    # A judge of its own: named, not flagged.
    assert "role: step judge" in told and "openai:fake-judge (judge.llm)" in " ".join(told.split())
    assert "was the acting model" not in told
    records = list(Dataset.open(judged).iter_records())
    assert all(r.details["actor_roles"] == [] and r.details["roles"]["step judge"] == "openai:fake-judge"
               for r in records)
    exported = runner.invoke(app, ["export", str(judged), "--format", "trl-kto", "--output", str(tmp_path / "kto2")])
    assert exported.exit_code == 0, exported.output
    assert "Roles played by the acting model" not in (tmp_path / "kto2" / "README.md").read_text()
