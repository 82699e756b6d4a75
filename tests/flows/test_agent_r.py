"""`trajforge agent-r`: two rounds, each with its own model server; a tiny hook script "trains" on round 1's data and
reports round 2's endpoint; a re-run resumes without asking anything again."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
import yaml

from backends.fake_server import FakeServer, Rule
from envs.retail.env import RetailEnv
from envs.retail.tasks import generate_tasks
from flows.agent_r_config import AgentRConfig, next_model
from schemas.store import Dataset
from tests.conftest import REPO
from tests.generators._generic_model import GenericModel

HOOK = '''
import json, os, sys
from pathlib import Path
Path(sys.argv[1]).open("a").write(json.dumps({k: v for k, v in os.environ.items() if k.startswith("TRAJFORGE_")}) + "\\n")
print("training on", os.environ["TRAJFORGE_DATA"])
Path(os.environ["TRAJFORGE_NEXT_MODEL_FILE"]).write_text(json.dumps({"base_url": sys.argv[2], "model": "agent-r-2"}))
'''
PIPELINE = {"generate": [{"name": "agent-r", "method": "mcts_splice", "env": "retail", "tasks": {"n": 1},
                          "search": {"iterations": 1, "generations": 2, "max_depth": 6}, "verifier": "divergence",
                          "concurrency": 1}],
            "export": ["trl-sft"]}


def _model() -> GenericModel:
    async def references():
        task = generate_tasks(1)[0]
        async with RetailEnv(0) as env:
            return {task.instruction: await env.reference_solution(task) or []}

    return GenericModel(asyncio.run(references()))


def _llm(server: FakeServer, model: str) -> dict:
    return {"backend": "openai", "base_url": server.base_url, "model": model, "api_key_env": None,
            "max_retries": 0, "request_timeout_s": 10}


def test_rounds_use_their_own_model_and_the_hook_gets_the_rounds_data(prefect_harness, tmp_path):
    model = _model()
    with FakeServer(rules=[Rule(fn=model)]) as first, FakeServer(rules=[Rule(fn=model)]) as second:
        hook = tmp_path / "hook.py"
        hook.write_text(HOOK)
        calls = tmp_path / "hook-calls.jsonl"
        config = tmp_path / "agent-r.yaml"
        config.write_text(yaml.safe_dump({
            "output": str(tmp_path / "out"), "rounds": 2, "model": _llm(first, "agent-r-1"),
            "hook": {"command": f"{sys.executable} {hook} {calls} {second.base_url}"}, "pipeline": PIPELINE}))
        env = {**os.environ, "PREFECT_API_URL": prefect_harness,
               "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        run = subprocess.run([sys.executable, "-m", "flows.cli", "agent-r", str(config)], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        first_models = {e["body"]["model"] for e in first.log if "body" in e}
        second_models = {e["body"]["model"] for e in second.log if "body" in e}
        asked = len(first.log) + len(second.log)
        again = subprocess.run([sys.executable, "-m", "flows.cli", "agent-r", str(config)], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert len(first.log) + len(second.log) == asked  # the re-run resumed: nothing asked again
    out = tmp_path / "out"
    # Round 1 ran on the first server only, round 2 on the second (the endpoint the hook reported).
    assert first_models == {"agent-r-1"} and second_models == {"agent-r-2"}
    for k, name in ((1, "agent-r-1"), (2, "agent-r-2")):
        ds = Dataset.open(out / f"round-{k}" / "generate" / "agent-r")
        records = list(ds.iter_records())
        assert ds.complete and records and {r.provenance.model for r in records} == {f"openai:{name}"}
        assert any(r.details.get("role") == "spliced" for r in records)
        assert (out / f"round-{k}" / "export" / "agent-r-trl-sft" / "README.md").is_file()
    # The hook ran once, after round 1, on round 1's data and export.
    [seen] = [json.loads(line) for line in calls.read_text().splitlines()]
    assert seen["TRAJFORGE_ROUND"] == "1" and seen["TRAJFORGE_DATA"] == str(out / "round-1" / "generate" / "agent-r")
    assert seen["TRAJFORGE_EXPORTS"] == str(out / "round-1" / "export" / "agent-r-trl-sft")
    assert json.loads(seen["TRAJFORGE_MODEL"])["model"] == "agent-r-1"
    assert "training on" in (out / "round-1" / "hook.log").read_text()
    summary = json.loads((out / "agent_r.json").read_text())
    assert [r["model"]["model"] for r in summary["rounds"]] == ["agent-r-1", "agent-r-2"]
    assert "hook: skipped: round 1 already reported" in again.stdout


def test_config_errors_and_reported_models(tmp_path):
    base = {"output": str(tmp_path), "rounds": 2, "pipeline": PIPELINE}
    llm = {"backend": "openai", "base_url": "http://a/v1", "model": "m1"}
    with pytest.raises(ValueError, match="a hook must train and serve the next model"):
        AgentRConfig.model_validate({**base, "model": llm})
    with pytest.raises(ValueError, match="lists 1 model"):
        AgentRConfig.model_validate({**base, "models": [llm]})
    with pytest.raises(ValueError, match="needs a generate entry with method: mcts_splice"):
        AgentRConfig.model_validate({**base, "models": [llm, llm], "pipeline": {"generate": [{"name": "r", "method":
                                                                                                 "rollout"}]}})
    cfg = AgentRConfig.model_validate({**base, "models": [llm, {**llm, "model": "m2"}]})
    assert cfg.round_pipeline(2, cfg.models[1]).llm["model"] == "m2"
    current = cfg.models[0]
    assert next_model(current, "http://b:8000/v1\n").base_url == "http://b:8000/v1"
    assert next_model(current, '{"model": "m9"}').model_dump(include={"base_url", "model"}) == {
        "base_url": "http://a/v1", "model": "m9"}
    with pytest.raises(ValueError, match="neither a JSON object nor a URL"):
        next_model(current, "epoch 3 done")
