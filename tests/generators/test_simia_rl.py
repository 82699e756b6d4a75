"""Simia-RL as shipped (configs/simia_rl.yaml, a `trajforge improve` config): its training data are rollouts in the
world an LLM simulates from the real tau2 retail server's tools and policy, kept by the simulated judge's reward;
its evals run on the real server. The generate stage runs here through `trajforge generate` against the fake
server (the improve loop around it, eval and training, is tested in tests/flows)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from backends.fake_server import FakeServer, Rule
from flows.cli import app
from flows.improve_checks import check_tasks
from flows.improve_config import load_improve_config
from schemas.store import Dataset
from tests.conftest import REPO
from tests.generators._browser_agent import first_user

CONFIG = REPO / "configs" / "simia_rl.yaml"
LOOKUP = {"observation": json.dumps({"user_id": "yusuf_rossi_9620"}), "done": False}


def _llm(base_url: str, model: str) -> dict[str, Any]:
    return {"backend": "openai", "base_url": base_url, "model": model, "api_key_env": None, "max_retries": 0,
            "request_timeout_s": 30}


def world(body: dict[str, Any]) -> Any:
    """The simulator (tool results, the customer), its judge, the fidelity judge, and the agent (ReAct text)."""
    first = first_user(body)
    system = str(body["messages"][0]["content"])
    if first.startswith("SIMULATE TOOL STEP"):
        if "the user's reply" in first:
            return {"observation": "That is all, thanks. ###STOP###", "done": True}
        return LOOKUP
    if first.startswith("JUDGE EPISODE"):
        served = "find_user_id_by_name_zip" in first.split("Transcript:", 1)[1]
        return {"reasoning": "the user was found" if served else "nothing done", "reward": 1.0 if served else 0.0}
    if "<tool_call>" in system:  # the agent: draw 0 looks the user up, draw 1 only talks
        if any(m["role"] == "tool" or "yusuf_rossi_9620" in str(m.get("content")) for m in body["messages"][1:]):
            return "I found your account, Yusuf. Is there anything else?"
        # The second sample is another draw: its own seed, the same prompt.
        if body.get("seed") != 1:
            call = {"name": "find_user_id_by_name_zip",
                    "arguments": {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}}
            return f"Let me find your account.\n<tool_call>{json.dumps(call)}</tool_call>"
        return "I cannot help with that."
    return None  # the user-fidelity judge and the like: the fake server's default


def test_simia_rl_trains_on_rewarded_episodes_of_the_simulated_world_and_evals_on_the_real_server(
        tmp_path: Path) -> None:
    cfg = load_improve_config(CONFIG)
    assert cfg.env == "mcp" and cfg.eval_config().env == "mcp"  # measured on the real server
    entry = cfg.generate_entry()
    assert entry["method"] == "rollout" and entry["env"] == "simulated" and not entry["keep_failed"]
    real = {k: v for k, v in cfg.env_config.items()}
    assert entry["env_config"]["from_mcp"] == real  # the simulation copies the real server's tools and policy
    assert entry["user"] == {"kind": "auto"}  # the simulator plays the customer
    # improve's own check before it runs: training tasks (train split) and test tasks share none.
    plan = check_tasks(cfg)
    assert (plan.train, plan.test) == (8, 8)

    with FakeServer(rules=[Rule(fn=world)]) as server:
        entry = {k: v for k, v in entry.items() if k != "name"}
        entry["llm"] = _llm(server.base_url, "fake-agent")
        entry["env_config"] = {**entry["env_config"], "llm": _llm(server.base_url, "fake-simulator"),
                               "judge": {"llm": _llm(server.base_url, "fake-judge")}}
        entry["env_config"]["from_mcp"] = {**entry["env_config"]["from_mcp"], "sessions": 1}
        entry.update(tasks={**entry["tasks"], "ids": ["tau2-retail-0"], "n": None}, samples_per_task=2,
                     user={"kind": "auto", "fidelity": {"check": False}})
        (tmp_path / "gen.yaml").write_text(yaml.safe_dump(entry))
        result = CliRunner().invoke(app, ["generate", "--method", "rollout", "--config", str(tmp_path / "gen.yaml"),
                                          "--output", str(tmp_path / "out")], terminal_width=200)
        bodies = [e["body"] for e in server.log if "body" in e]
    assert result.exit_code == 0, result.output
    ds = Dataset.open(tmp_path / "out")
    [kept] = list(ds.iter_records())
    [dropped] = [f.record for f in ds.iter_records("filtered")]
    # The kept episode: the simulator wrote its tool result and the customer's goodbye; its judge rewarded it.
    assert kept.details["env"]["name"] == "simulated" and kept.success and kept.reward == 1.0
    result_step = next(s for s in kept.steps if s.kind == "text" and s.name == "find_user_id_by_name_zip")
    assert result_step.content == LOOKUP["observation"]
    assert any(s.kind == "text" and s.source == "user" and "###STOP###" in s.content for s in kept.steps)
    assert not dropped.success and dropped.reward == 0.0
    assert {b["model"] for b in bodies} >= {"fake-agent", "fake-simulator", "fake-judge"}
    # The agent saw the real server's tools, listed from it.
    assert "find_user_id_by_name_zip" in {t.name for t in kept.tools} and "reset_state" not in {t.name for t in kept.tools}
