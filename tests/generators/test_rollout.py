"""rollout end to end against the fake OpenAI-compatible server (real HTTP) with scripted agent answers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from backends.fake_server import Fault, FakeServer, Rule, ToolCallAnswer
from envs.registry import make_env
from generators.runner import generate, load_config
from schemas.store import Dataset
from tests.conftest import REPO

DONE_MESSAGE = "All done successfully. Is there anything else?"
BROKEN = '<tool_call>{"name": "get_order_details", "arguments": {broken</tool_call>'


def _retail_tasks(n: int) -> list:
    return make_env("retail", seed=0).generate_tasks(n, seed=0)


def _first_user(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def _turn(body: dict) -> int:
    """How many answers the agent gave before this request (failed ones included)."""
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


class RetailScript:
    """The agent's answers per task (by its index in the generated tasks)."""

    def __init__(self, tasks: list) -> None:
        self.index = {t.instruction: i for i, t in enumerate(tasks)}
        self.tasks = tasks

    def plan(self, i: int) -> list:
        actions = [ToolCallAnswer(a["function"], a["arguments"]) for a in self.tasks[i].goal["actions"]]
        if i == 0:  # exactly the reference actions -> goal state -> reward 1
            return [*actions, DONE_MESSAGE]
        if i == 1:  # looks the order up but changes nothing -> reward 0
            return [actions[0], DONE_MESSAGE]
        if i == 2:  # one unreadable answer, then the right actions -> 1 parse failure, reward 1
            return [BROKEN, *actions, DONE_MESSAGE]
        return [BROKEN] * 10  # never readable -> ends at max_parse_failures

    def __call__(self, body: dict):
        if not body.get("tools"):
            return None
        plan = self.plan(self.index[_first_user(body)])
        turn = _turn(body)
        return plan[turn] if turn < len(plan) else DONE_MESSAGE


def _llm(base_url: str) -> dict:
    return {"backend": "openai", "base_url": base_url, "model": "fake-model", "api_key_env": "TRAJFORGE_TEST_KEY",
            "max_retries": 0, "backoff_base_s": 0.01, "request_timeout_s": 5}


def _config(base_url: str, **extra) -> dict:
    return {"method": "rollout", "env": "retail", "env_config": {"seed": 0}, "tasks": {"n": 5}, "max_steps": 6,
            "max_parse_failures": 2, "concurrency": 3, "unit_tasks": 2, "llm": _llm(base_url), **extra}


def test_rollout_retail_rewards_parse_failures_and_llm_quarantine(tmp_path):
    tasks = _retail_tasks(5)
    script = RetailScript(tasks)
    # Task 4: the server fails (HTTP 500, no retries) -> the task is quarantined at stage "llm".
    rules = [Rule(match=tasks[4].instruction, answer=Fault("500")), Rule(fn=script)]
    out = tmp_path / "out"
    with FakeServer(rules=rules) as server:
        cfg = load_config(_config(server.base_url, samples_per_task=2, keep_failed=False))
        summary = asyncio.run(generate(cfg, out))
        requests = [e["body"] for e in server.log if "body" in e]
        # A re-run resumes: every task is done, no request is sent again.
        again = asyncio.run(generate(cfg, out))
        assert again.skipped == 10 and again.processed == 0
        assert len([e for e in server.log if "body" in e]) == len(requests)
    assert summary.tasks == 10 and summary.processed == 10
    ds = Dataset.open(out)
    kept = {t.id: t for t in ds.iter_records()}
    assert sorted(kept) == [f"rollout/{tasks[i].id}#{k}" for i in (0, 2) for k in (0, 1)]
    for t in kept.values():
        assert t.reward == 1.0 and t.success is True and t.source == "rollout"
        assert {x.name for x in t.tools} >= {"cancel_pending_order", "get_order_details"}
        # The system prompt the model received opens the record, the same for every sample (no attempt mark), then the task.
        system = t.steps[0]
        assert system.kind == "text" and system.name == "system" and system.train is False
        assert any(b["messages"][0] == {"role": "system", "content": system.content} for b in requests)
        assert "Attempt" not in system.content
        assert t.steps[1].kind == "text" and t.steps[1].source == "user"
        assert t.steps[-1].kind == "text" and t.steps[-1].source == "user" and "###STOP###" in t.steps[-1].content
        p = t.provenance
        assert p.method == "rollout" and p.model == "openai:fake-model" and p.task_id == t.details["task"]["id"]
        assert p.seed == 0 and p.prompt_template_hash and p.trajforge_version
        assert t.details["env"]["name"] == "retail" and t.details["env"]["config"] == {"seed": 0}
        assert t.details["stop_reason"] == "done"
    solved = kept[f"rollout/{tasks[0].id}#0"]
    calls = [(s.function, s.arguments) for s in solved.steps if s.kind == "api"]
    assert calls == [(a["function"], a["arguments"]) for a in tasks[0].goal["actions"]]
    # The failed step is recorded, untrained, and the environment never saw it.
    retried = kept[f"rollout/{tasks[2].id}#0"]
    assert retried.details["parse_failures"] == 1
    bad, feedback = retried.steps[2], retried.steps[3]
    assert bad.source == "agent" and bad.train is False and bad.label == "bad" and "parse_error" in bad.extra
    assert feedback.name == "parse_error" and feedback.content.startswith("Error:")
    assert retried.details["actions"] == len(tasks[2].goal["actions"]) + 1

    filtered = sorted((f.record.id, f.decision.filter, f.decision.reason.split(":")[0]) for f in ds.iter_records("filtered"))
    assert filtered == sorted([(f"rollout/{tasks[1].id}#{k}", "outcome", "unsuccessful") for k in (0, 1)]
                              + [(f"rollout/{tasks[3].id}#{k}", "outcome", "max_parse_failures") for k in (0, 1)])
    wrong = next(f.record for f in ds.iter_records("filtered") if f.record.id == f"rollout/{tasks[1].id}#0")
    assert wrong.reward == 0.0 and wrong.success is False
    quarantined = list(ds.iter_records("quarantine"))
    assert sorted(q.location for q in quarantined) == [f"task {tasks[4].id}#0", f"task {tasks[4].id}#1"]
    assert all(q.stage == "llm" for q in quarantined)
    assert summary.reasons == {"outcome: unsuccessful": 2, "outcome: max_parse_failures": 2, "llm: server": 2}
    assert summary.counts["parse_failures"] == 2 * 1 + 2 * 2 and summary.counts["successes"] == 4
    # Every rollout is accounted for.
    assert len(kept) + len(filtered) + len(quarantined) == 10
    # Sample 1 made its own calls (its own cache entries): as many agent requests as sample 0.
    agent = [b for b in requests if b.get("tools")]
    second = [b for b in agent if b.get("seed") == 1]
    assert second and len(second) * 2 == len(agent)


def test_rollout_in_simulated_env_from_a_tasks_file(tmp_path):
    """The simulated env from a tool list: the agent calls a tool, answers the user, the judge rewards."""
    weather = {"name": "get_weather", "description": "Weather for a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                              "additionalProperties": False}}
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text(json.dumps({"id": "w1", "instruction": "What's the weather in Paris?"}) + "\n")

    def answer(body: dict):
        first = _first_user(body)
        if first.startswith("SIMULATE TOOL STEP"):
            if "AGENT CALLS get_weather" in first.rsplit("The agent now", 1)[1]:
                return {"observation": '{"temp_c": 21, "sky": "sunny"}', "done": False}
            return {"observation": "Thanks! ###STOP###", "done": False}
        if first.startswith("JUDGE EPISODE"):
            return {"reasoning": "The agent reported the weather.", "reward": 1}
        if body.get("tools"):
            return ToolCallAnswer("get_weather", {"city": "Paris"}) if _turn(body) == 0 else "It is sunny and 21 C."
        return None

    config = _config("", env="simulated", env_config={"tools": [weather], "policy": "Be accurate."},
                     tasks={"source": "jsonl", "path": str(tasks_file)})
    with FakeServer(rules=[Rule(fn=answer)]) as server:
        config["llm"] = _llm(server.base_url)
        summary = asyncio.run(generate(load_config(config), tmp_path / "out"))
    [t] = list(Dataset.open(tmp_path / "out").iter_records())
    assert summary.processed == 1 and t.reward == 1.0 and t.success
    assert [s.kind for s in t.steps] == ["text", "text", "api", "text", "message", "text"]
    assert t.steps[0].name == "system" and t.steps[0].content.endswith("# Policy\nBe accurate.")  # what the agent read
    assert t.steps[3].content == '{"temp_c": 21, "sky": "sunny"}' and t.steps[3].tool_call_id == t.steps[2].tool_call_id
    assert t.steps[5].source == "user" and t.details["evaluation"]["reason"] == "The agent reported the weather."
    assert t.details["env"]["name"] == "simulated" and "tools_sha256" in t.details["env"]["config"]


def test_cli_generate_rollout_and_example_config(tmp_path):
    example = yaml.safe_load((REPO / "configs" / "rollout_retail.yaml").read_text())
    assert load_config(example).tasks.n == 2 and example["llm"]["backend"] == "llamacpp"
    tasks = _retail_tasks(2)
    with FakeServer(rules=[Rule(fn=RetailScript(tasks))]) as server:
        cfg = {**example, "llm": _llm(server.base_url)}
        path = tmp_path / "rollout.yaml"
        path.write_text(yaml.safe_dump(cfg))
        out = tmp_path / "out"
        cmd = [sys.executable, "-m", "flows.cli", "generate", "--method", "rollout", "--config", str(path),
               "--output", str(out)]
        done = subprocess.run(cmd, cwd=REPO, env={**os.environ}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    records = {t.id: t for t in Dataset.open(out).iter_records()}
    assert records[f"rollout/{tasks[0].id}#0"].reward == 1.0
    assert records[f"rollout/{tasks[1].id}#0"].success is False
    assert Dataset.open(Path(out)).complete


def test_rollout_on_the_tau2_mcp_server_rewards_the_reference_and_names_a_wrong_write(tmp_path):
    """rollout through `generate` on a real MCP server: an agent that follows task 0's reference actions
    reaches reward 1; one whose exchange takes one item of two gets 0, the failed criterion in details."""
    from envs.mcp import MCPEnv
    from tests.envs.mcp_support import TASKS, tau2_config, tau2_task

    task = tau2_task("0")

    async def reference() -> list:
        async with MCPEnv(**tau2_config()) as env:
            return [a for a in await env.reference_solution(task) if a.kind == "api"]

    calls = asyncio.run(reference())
    wrong = calls[:-1] + [calls[-1].model_copy(update={"arguments": {
        **calls[-1].arguments, "item_ids": calls[-1].arguments["item_ids"][:1],
        "new_item_ids": calls[-1].arguments["new_item_ids"][:1]}})]

    def agent(body: dict):
        if not body.get("tools"):
            return None
        plan = wrong if body.get("seed") == 1 else calls
        turn = _turn(body)
        if turn < len(plan):
            return ToolCallAnswer(plan[turn].function, plan[turn].arguments)
        return "Your exchange is done."

    config = {"method": "rollout", "env": "mcp", "env_config": tau2_config(), "user": {"kind": "none"},
              "tasks": {"source": "tau2", "path": TASKS, "ids": [task.id]}, "samples_per_task": 2, "max_steps": 8,
              "concurrency": 1}
    with FakeServer(rules=[Rule(fn=agent)]) as server:
        summary = asyncio.run(generate(load_config({**config, "llm": _llm(server.base_url)}), tmp_path / "out"))
    records = {t.id: t for t in Dataset.open(tmp_path / "out").iter_records()}
    good, bad = records[f"rollout/{task.id}#0"], records[f"rollout/{task.id}#1"]
    assert summary.counts["successes"] == 1
    assert good.reward == 1.0 and good.details["evaluation"]["success"] and good.provenance.task_split == "train"
    # With no user, nobody confirmed the exchange: tau2's DB check passes, the retail policy is broken, and the
    # record is a failure that says why (every method's successes are held to the policy).
    assert not good.success and good.details["policy"]["broken"].startswith("policy: writes without a confirmation")
    assert summary.counts["policy_broken"] == 1
    assert [s.function for s in good.steps if s.kind == "api"] == [c.function for c in calls]
    assert bad.reward == 0.0 and not bad.success
    assert bad.details["evaluation"]["details"]["failed"] == ["DB"]
    assert bad.details["evaluation"]["reason"].startswith("failed DB")
