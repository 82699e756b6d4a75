"""tutorial_replay end to end against the fake OpenAI-compatible server with scripted answers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from backends.fake_server import FakeServer, Rule, ToolCallAnswer
from envs.registry import make_env
from generators.runner import generate, load_config
from generators.tutorial_replay import TaskSpecification, TutorialReplay, load_tutorials
from schemas.store import Dataset
from tests.conftest import REPO

SAMPLES = REPO / "samples" / "tutorials"

SPECS = {
    "How to cancel a pending order": {
        "platform": "retail", "goal": "Cancel the customer's pending order with an accepted reason.",
        "prerequisites": ["the order is pending"],
        "steps": ["Find the user id by email or name and zip.", "Get the order details.",
                  "Cancel the pending order with the reason."],
        "expected_outcome": "The order is cancelled and refunded.",
    },
    "How to return a delivered item": {
        "platform": "retail", "goal": "Return items of a delivered order to the original payment method.",
        "prerequisites": ["the order is delivered"],
        "steps": ["Find the user id.", "Get the order details.", "Return the delivered order items."],
        "expected_outcome": "The order is return requested and a refund is recorded.",
    },
}
CLASSES = {
    "How to cancel a pending order": {"is_tutorial": True, "platform": "retail", "reason": "order support how-to"},
    "How to return a delivered item": {"is_tutorial": True, "platform": "retail", "reason": "order support how-to"},
    "Simple sourdough bread": {"is_tutorial": True, "platform": "other", "reason": "a bread recipe"},
    "How to buy a mug in the web shop": {"is_tutorial": True, "platform": "web", "reason": "web shop how-to"},
}


def _first_user(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def _title(prompt: str) -> str:
    return prompt.split("Title: ", 1)[1].split("\n", 1)[0]


class Script:
    """Answers every request the pipeline makes: classifier, spec, agent turns, judge."""

    def __init__(self) -> None:
        self.tasks = {t.instruction: t for t in make_env("retail", seed=0).generate_tasks(28, seed=0)}

    def __call__(self, body: dict):
        first = _first_user(body)
        if first.startswith("CLASSIFY THIS TEXT"):
            return CLASSES[_title(first)]
        if first.startswith("WRITE THE TASK SPEC"):
            return SPECS[_title(first)]
        if first.startswith("JUDGE THIS REPLAY"):
            if "return" in first.split("Goal: ", 1)[1].split("\n", 1)[0].lower():
                return "I think it went fine, probably."  # never valid JSON: structured() gives up
            return {"thoughts": "The order was cancelled with a reason.", "success": True}
        if body.get("tools"):
            # The agent: replay the task's reference actions, one per turn, then close.
            actions = self.tasks[first].goal["actions"]
            done = sum(1 for m in body["messages"] if m["role"] == "tool")
            if done < len(actions):
                return ToolCallAnswer(actions[done]["function"], actions[done]["arguments"])
            return "All done: your request has been processed successfully."
        return None


def _config(tutorials: str, base_url: str, **extra) -> dict:
    return {
        "method": "tutorial_replay",
        "tutorials": [tutorials],
        "platforms": ["retail"],
        "concurrency": 2,
        "unit_tasks": 2,
        "max_steps": 8,
        "llm": {"backend": "openai", "base_url": base_url, "model": "fake-model", "api_key_env": "TRAJFORGE_TEST_KEY",
                "max_retries": 1, "backoff_base_s": 0.01, "request_timeout_s": 5},
        **extra,
    }


def _tutorial_file(tmp_path: Path) -> str:
    by_id = {t["id"]: t for t in load_tutorials([str(SAMPLES)])}
    rows = [by_id[i] for i in ("cancel-pending-order", "return-delivered-item", "sourdough-bread", "tomato-gardening",
                               "buy-a-mug-web-shop")]
    path = tmp_path / "tutorials.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_samples_load_and_prefilter():
    tutorials = load_tutorials([str(SAMPLES)])
    ids = [t["id"] for t in tutorials]
    assert "README" not in ids and len(ids) == 8 and ids == sorted(ids)
    assert {t["id"]: t["title"] for t in tutorials}["cancel-pending-order"] == "How to cancel a pending order"
    method = TutorialReplay(load_config({"method": "tutorial_replay"}), llm=None)
    dropped = [t["id"] for t in tutorials if not method.prefilter(t["title"] + "\n" + t["text"])]
    assert dropped == ["tomato-gardening"]  # the bread recipe says "return the dough": the classifier drops it


def test_specs_map_to_matching_retail_task_kinds():
    method = TutorialReplay(load_config({"method": "tutorial_replay"}), llm=None)
    cases = {
        "cancel": "Cancel a pending order with a reason.",
        "return": "Return delivered items to the original payment method.",
        "exchange": "Exchange a delivered item for another variant.",
        "modify_address": "Change the shipping address of a pending order.",
        "order_total": "Tell the customer the status and total of an order.",
    }
    for kind, goal in cases.items():
        spec = TaskSpecification(platform="retail", goal=goal, steps=["Find the user id."], expected_outcome="done")
        task, how = method.map_task("retail", spec, "some-tutorial")
        assert task is not None and task.metadata["kind"] == kind, (kind, how)
        assert task.goal["state_hash"]  # the env can verify it
    again, _ = method.map_task("retail", TaskSpecification(platform="retail", goal=cases["cancel"], steps=[],
                                                           expected_outcome=""), "some-tutorial")
    assert again.metadata["kind"] == "cancel"  # deterministic per tutorial id
    web, _ = method.map_task("web", TaskSpecification(platform="web", goal="Buy a mug in the web shop and check out.",
                                                      steps=["Click Add to cart."], expected_outcome="an order"), "mug")
    assert web.metadata["kind"] == "purchase" and web.env == "web" and web.goal
    nothing, how = method.map_task("retail", TaskSpecification(platform="retail", goal="Bake bread", steps=[],
                                                               expected_outcome="bread"), "x")
    assert nothing is None and "no task kind keyword" in how


def test_tutorial_replay_end_to_end(tmp_path):
    tutorials = _tutorial_file(tmp_path)
    script = Script()
    with FakeServer(rules=[Rule(fn=script)]) as server:
        cfg = load_config(_config(tutorials, server.base_url))
        out = tmp_path / "out"
        summary = asyncio.run(generate(cfg, out))
        agent_requests = [e["body"] for e in server.log if e.get("body", {}).get("tools")]
    ds = Dataset.open(out)
    kept = list(ds.iter_records())
    filtered = {f.record.details["tutorial"]["id"]: f for f in ds.iter_records("filtered")}
    assert summary.tasks == 5 and summary.processed == 5
    assert len(kept) + len(filtered) == 5 and not list(ds.iter_records("quarantine"))

    # The relevant tutorial was replayed with the right steps and verified by the environment.
    (traj,) = kept
    assert traj.id == "tutorial_replay/cancel-pending-order#0" and traj.source == "tutorial_replay"
    env_task = script.tasks[traj.details["env_task"]["instruction"]]
    assert traj.details["env_task"]["kind"] == "cancel" and env_task.metadata["kind"] == "cancel"
    assert traj.details["calls"] == env_task.goal["actions"]
    assert [s.kind for s in traj.steps][:3] == ["text", "api", "text"] and traj.steps[-1].source == "user"
    assert traj.reward == 1.0 and traj.success is True and traj.details["success_source"] == "env"
    assert traj.details["judge"]["success"] is True and traj.details["judge"]["agrees_with_env"] is True
    assert traj.details["spec"]["steps"] == SPECS["How to cancel a pending order"]["steps"]
    assert {t.name for t in traj.tools} >= {"cancel_pending_order", "get_order_details"}
    p = traj.provenance
    assert p.method == "tutorial_replay" and p.task_id == "cancel-pending-order" and p.source_id == "cancel-pending-order"
    assert p.prompt_template_hash and p.model == "openai:fake-model" and p.trajforge_version
    # The agent saw the tutorial's spec in its system prompt.
    cancel_prompts = [b for b in agent_requests if "Cancel the pending order with the reason." in b["messages"][0]["content"]]
    assert cancel_prompts and "Follow it step by step" in cancel_prompts[0]["messages"][0]["content"]

    # Each irrelevant tutorial is dropped at the right stage, with its reason.
    reasons = {tid: (f.decision.filter, f.decision.reason) for tid, f in filtered.items()}
    assert reasons["tomato-gardening"][0] == "prefilter" and reasons["tomato-gardening"][1].startswith("no keyword")
    assert reasons["sourdough-bread"] == ("classifier", "platform other not enabled: a bread recipe")
    assert reasons["buy-a-mug-web-shop"] == ("classifier", "platform web not enabled: web shop how-to")
    # The judge never gave a valid answer: the replay is rejected with the reason, reward kept.
    judge, why = reasons["return-delivered-item"]
    assert judge == "judge" and why.startswith("no verdict") and "3 attempts" in why
    rejected = filtered["return-delivered-item"].record
    assert rejected.reward == 1.0 and rejected.details["judge"] is None and rejected.details["env_task"]["kind"] == "return"
    assert summary.reasons["prefilter: no keyword"] == 1 and summary.reasons["judge: no verdict"] == 1
    assert summary.counts["replay_success"] == 1
