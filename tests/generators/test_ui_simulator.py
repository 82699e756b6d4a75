"""ui_simulator end to end against the fake OpenAI-compatible server: propose -> rollout -> judge -> rewrite -> grow."""

from __future__ import annotations

import asyncio
import json
import re

from backends.fake_server import FakeServer, Rule, ToolCallAnswer
from generators.runner import generate, load_config
from schemas.store import Dataset

HOME = {"url": "http://mugs.test/", "title": "Mug shop", "elements": [
    {"bid": "1", "role": "link", "name": "Mugs", "clickable": True},
    {"bid": "2", "role": "button", "name": "Cart", "clickable": True},
    {"bid": "3", "role": "heading", "name": "Welcome", "clickable": False}]}
MUGS = {"url": "http://mugs.test/mugs", "title": "Mugs", "elements": [
    {"bid": "4", "role": "text", "name": "Blue mug $5", "clickable": False},
    {"bid": "5", "role": "button", "name": "Buy blue mug", "clickable": True}]}
PROPOSED = [
    {"instruction": "Buy the blue mug.", "expected_outcome": "an order for the blue mug"},
    {"instruction": "Find the price of the blue mug.", "expected_outcome": "the answer says $5"},
    {"instruction": "Fly to the moon.", "expected_outcome": "impossible"},
]
VARIANTS = [
    {"instruction": "Find the price of the blue mug in cents.", "expected_outcome": "500 cents", "direction": "harder"},
    {"instruction": "Find the cheapest mug.", "expected_outcome": "the blue mug", "direction": "easier"},
]


def _first_user(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def _attempt(body: dict) -> int:
    found = re.search(r"\(Attempt (\d+)\.\)", body["messages"][0]["content"])
    return int(found.group(1)) if found else 1


def _agent(body: dict):
    """The agent: buys by clicking; answers prices ($9 on attempt 2: wrong); never gets the moon or the cheapest."""
    task = _first_user(body)
    turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if task == "Buy the blue mug.":
        return ToolCallAnswer("click", {"bid": "5"}) if turn == 0 else "I bought the blue mug."
    if task == "Find the price of the blue mug.":
        return "It costs $9." if _attempt(body) == 2 else "It costs $5."
    if task.startswith("Find the price of the blue mug in cents"):
        return "It costs 500 cents."
    return "I could not do that."


def script(body: dict):
    prompt = _first_user(body)
    if body.get("tools"):
        return _agent(body)
    if prompt.startswith("SIMULATE START PAGE"):
        return {"url": HOME["url"], "axtree": json.dumps(HOME), "done": False}
    if prompt.startswith("SIMULATE PAGE"):
        return {"url": MUGS["url"], "axtree": json.dumps(MUGS), "done": False}
    if prompt.startswith("PROPOSE TASKS (round 1)"):
        return "Sorry, no ideas."  # never valid: the round is quarantined
    if prompt.startswith("PROPOSE TASKS"):
        return {"tasks": PROPOSED}
    if prompt.startswith("JUDGE TASK COMPLETION"):
        task = prompt.split("Task: ", 1)[1].split("\n", 1)[0]
        transcript = prompt.split("Transcript:", 1)[1]
        ok = (task == "Buy the blue mug." and "click" in transcript) or "$5" in transcript or "500 cents" in transcript
        return {"reasoning": "done as asked" if ok else "outcome not reached", "success": ok}
    if prompt.startswith("REWRITE INSTRUCTION"):
        original = prompt.split("Original task: ", 1)[1].split("\n", 1)[0]
        return {"instruction": f"Rewritten: {original}"}
    if prompt.startswith("GROW TASK VARIANTS"):
        return {"variants": VARIANTS}
    return None


def _config(base_url: str, **extra) -> dict:
    return {
        "method": "ui_simulator", "env": "simulated",
        "env_config": {"mode": "web", "policy": "A small web shop that sells mugs."},
        "rounds": 2, "tasks_per_round": 3, "walk_steps": 1, "attempts": 3, "max_failures": 2, "max_steps": 4,
        "grow": True, "band_low": 0.25, "band_high": 0.75, "variants_per_task": 2, "grow_rounds": 1,
        "concurrency": 2, "unit_tasks": 1,
        "llm": {"backend": "openai", "base_url": base_url, "model": "fake-model", "api_key_env": "TRAJFORGE_TEST_KEY",
                "max_retries": 0, "request_timeout_s": 5},
        **extra,
    }


def test_ui_simulator_propose_rollout_judge_rewrite_grow(tmp_path):
    out = tmp_path / "out"
    with FakeServer(rules=[Rule(fn=script)]) as server:
        summary = asyncio.run(generate(load_config(_config(server.base_url)), out))
        proposer = [b for b in (e["body"] for e in server.log if "body" in e)
                    if _first_user(b).startswith("PROPOSE TASKS (round 0)")]
    assert summary.tasks == 2 and summary.processed == 2
    # The proposer saw the start page and the page the random walk reached.
    assert len(proposer) == 1 and "Page 1: http://mugs.test/" in _first_user(proposer[0])
    assert "Page 2: http://mugs.test/mugs" in _first_user(proposer[0])

    ds = Dataset.open(out)
    kept = {t.id: t for t in ds.iter_records()}
    buy, price, cents = "round-0000/t0", "round-0000/t1", "round-0000/t1/v0"
    assert sorted(kept) == sorted([f"ui_simulator/{buy}#{a}" for a in range(3)]
                                  + [f"ui_simulator/{price}#{a}" for a in (0, 2)]
                                  + [f"ui_simulator/{cents}#{a}" for a in range(3)])
    for t in kept.values():
        assert t.success is True and t.reward == 1.0 and t.source == "ui_simulator"
        assert t.steps[0].source == "user" and t.steps[0].content == f"Rewritten: {t.details['original_instruction']}"
        assert t.details["rewritten_instruction"] == t.steps[0].content
        assert t.steps[1].kind == "web" and t.steps[1].url == "http://mugs.test/"  # the explored start page
        assert t.details["judge"]["success"] is True and t.details["walk"] == [HOME["url"], MUGS["url"]]
        assert [x.name for x in t.tools] == ["click", "type", "scroll", "go_back", "goto"]
        assert t.provenance.method == "ui_simulator" and t.provenance.task_id == t.details["task"]["id"]
    bought = kept[f"ui_simulator/{buy}#0"]
    assert [s.kind for s in bought.steps] == ["text", "web", "api", "web", "message", "text"]
    assert bought.details["original_instruction"] == "Buy the blue mug." and bought.provenance.parent_ids == []
    variant = kept[f"ui_simulator/{cents}#0"]
    assert variant.provenance.parent_ids == [price]
    assert variant.details["task"] | {} == {"id": cents, "expected_outcome": "500 cents", "depth": 1, "parent": price,
                                            "direction": "harder"}

    filtered = sorted((f.record.id, f.decision.filter, f.decision.reason) for f in ds.iter_records("filtered"))
    assert filtered == sorted(
        [(f"ui_simulator/{price}#1", "completion", "unsuccessful: outcome not reached")]
        + [(f"ui_simulator/round-0000/t2#{a}", "completion", "unsuccessful: outcome not reached") for a in (0, 1)]
        + [(f"ui_simulator/round-0000/t1/v1#{a}", "completion", "unsuccessful: outcome not reached") for a in (0, 1)])
    # The moon and the cheapest-mug variant were dropped after 2 failures (no third attempt).
    c = summary.counts
    assert c["dropped_tasks"] == 2 and c["failed:unsuccessful"] == 5 and c["attempts"] == 13
    assert c["successes"] == 8 and c["rewritten"] == 8 and c["variants"] == 2 and c["proposed_tasks"] == 3
    assert c["outside_band"] == 1  # the always-solved purchase is too easy to grow
    [q] = list(ds.iter_records("quarantine"))
    assert q.stage == "propose" and q.location == "task round-0001"
    assert summary.reasons == {"completion: unsuccessful": 5, "propose: no valid task proposals": 1}


def test_ui_simulator_in_the_web_shop(tmp_path):
    """The built-in web shop: real pages for the walk and the proposer, the judge decides."""
    def rules(body: dict):
        prompt = _first_user(body)
        if body.get("tools"):
            return "The shop sells kitchen items."
        if prompt.startswith("PROPOSE TASKS"):
            return {"tasks": [{"instruction": "Tell me a category of the shop.", "expected_outcome": "a category"}]}
        if prompt.startswith("JUDGE TASK COMPLETION"):
            return {"reasoning": "named one", "success": True}
        return None

    config = _config("", env="web", env_config={"seed": 0}, rounds=1, tasks_per_round=1, walk_steps=2, attempts=1,
                     grow=False, rewrite=False)
    with FakeServer(rules=[Rule(fn=rules)]) as server:
        config["llm"]["base_url"] = server.base_url
        summary = asyncio.run(generate(load_config(config), tmp_path / "out"))
        proposer = next(b for b in (e["body"] for e in server.log if "body" in e)
                        if _first_user(b).startswith("PROPOSE TASKS"))
    [t] = list(Dataset.open(tmp_path / "out").iter_records())
    assert summary.counts["successes"] == 1 and t.success
    assert "Welcome to the shop" in _first_user(proposer) and len(t.details["walk"]) == 3
    assert t.steps[0].content == "Tell me a category of the shop." and t.steps[1].kind == "web"
    assert "rewritten_instruction" not in t.details
