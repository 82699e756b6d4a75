"""curriculum: reward tracking, the next tasks chosen by reward variance, and model-written variants kept only when
the environment can verify them (tau2-style criteria, or a verifier run in the sandbox)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from backends.fake_server import FakeServer, Rule, Samples
from envs.retail.env import RetailEnv
from generators.curriculum import RewardTracker
from generators.runner import generate, load_config
from schemas.models import ApiAction, MessageAction
from schemas.store import Dataset
from tests.generators._generic_model import GIVE_UP, GenericModel
from tests.generators.test_reflection import FIND, ORDER, REASON
from tests.generators.test_reflection import TASK as SEED
from tests.generators.test_reflection import WRONG_REASON as OTHER_REASON

EASIER = f"Cancel order {ORDER} for me, I no longer need it. I'm Diego Johansson, zip code 92776."
HARDER = f"Cancel my order {ORDER}, check it before and after. I'm Diego Johansson, zip 92776."
CANCEL_CALLS = [{"name": FIND["function"], "arguments": FIND["arguments"]},
                {"name": "cancel_pending_order", "arguments": {"order_id": ORDER, "reason": REASON}}]
WRONG_CANCEL = [{"name": "cancel_pending_order", "arguments": {"order_id": ORDER, "reason": OTHER_REASON}}]
VERIFIER = ("def verify(state):\n    return any(o['order_id'] == %r and o['status'] == 'cancelled' "
            "for o in state['orders'])\n" % ORDER)


def _references() -> dict[str, list[Any]]:
    async def seed() -> list[Any]:
        async with RetailEnv(0) as env:
            return await env.reference_solution(SEED) or []

    done = MessageAction(content="Your request has been processed. Is there anything else?")
    easier = [ApiAction(function=c["name"], arguments=c["arguments"]) for c in CANCEL_CALLS] + [done]
    return {SEED.instruction: asyncio.run(seed()), EASIER: easier}


def writer(body: dict) -> dict | None:
    """The task writer: an easier variant with sound criteria; a harder one whose 'wrong' solution is right."""
    prompt = str(body["messages"][-1].get("content") or "")
    if not prompt.startswith("EVOLVE TASK"):
        return None
    code = "verifier" in json.dumps(body["response_format"])
    if prompt.startswith("EVOLVE TASK (easier)"):
        if code:
            return {"instruction": EASIER, "verifier": VERIFIER, "solution": CANCEL_CALLS, "final_answer": "Done.",
                    "wrong_solutions": [[{"name": "get_order_details", "arguments": {"order_id": ORDER}}]]}
        return {"instruction": EASIER, "actions": CANCEL_CALLS, "communicate_info": [],
                "wrong_solutions": [WRONG_CANCEL]}
    if code:  # a verifier that accepts anything: doing nothing passes it
        return {"instruction": HARDER, "verifier": "def verify(state):\n    return True\n", "solution": CANCEL_CALLS,
                "final_answer": "", "wrong_solutions": [WRONG_CANCEL]}
    lookup = {"name": "get_order_details", "arguments": {"order_id": ORDER}}
    return {"instruction": HARDER, "actions": [CANCEL_CALLS[0], lookup, CANCEL_CALLS[1], lookup],
            "communicate_info": [], "wrong_solutions": [CANCEL_CALLS]}


def _run(tmp: Path, **extra: Any):
    cfg = {"method": "curriculum", "env": "retail", "tasks": {"n": 1}, "rollouts": 2, "generations": 1, "select": 1,
           "max_steps": 8, "concurrency": 1, "unit_tasks": 1, **extra}
    model = GenericModel(_references(), judge=writer)
    with FakeServer(rules=[Rule(fn=model)]) as server:
        cfg["llm"] = {"backend": "openai", "base_url": server.base_url, "model": "fake-model", "api_key_env": None,
                      "max_retries": 0, "request_timeout_s": 5}
        summary = asyncio.run(generate(load_config(cfg), tmp / "out"))
        prompts = [e["body"]["messages"] for e in server.log if "body" in e]
    ds = Dataset.open(tmp / "out")
    return summary, list(ds.iter_records()), {f.record.id: f for f in ds.iter_records("filtered")}, prompts


def test_tracker_selects_by_variance_inside_the_band():
    tr = RewardTracker((0.0, 1.0))
    for tid, rewards in {"always": [1, 1, 1, 1], "never": [0, 0, 0, 0], "half": [1, 0, 1, 0], "most": [1, 1, 1, 0]}.items():
        for r in rewards:
            tr.record(tid, r)
    assert tr.select(["always", "never", "most", "half"], 5) == ["half", "most"]


def test_evolved_tasks_are_the_models_and_kept_only_when_their_criteria_check(tmp_path):
    summary, kept, filtered, prompts = _run(tmp_path)
    seed = [t for t in kept if t.details["curriculum"]["generation"] == 0]
    assert [t.reward for t in seed] == [1.0, 0.0] and seed[0].details["curriculum"]["in_band"]
    # The writer saw the seed, its criteria and how it is solved, with what the tools returned (real data).
    evolve = next(m for m in prompts if str(m[-1]["content"]).startswith("EVOLVE TASK (easier)"))
    assert SEED.instruction in evolve[-1]["content"] and '"communicate_info": []' in evolve[-1]["content"]
    assert "AGENT: call get_order_details" in evolve[-1]["content"] and "pending" in evolve[-1]["content"]
    assert "EASIER than the seed" in evolve[0]["content"] and "cancel_pending_order" in evolve[0]["content"]

    # The easier variant is a new task: the model's instruction and criteria, checked in the world.
    variants = [t for t in kept if t.details["curriculum"]["generation"] == 1]
    assert len(variants) == 2 and {t.details["curriculum"]["task_id"] for t in variants} == {f"{SEED.id}/easier"}
    v = variants[0]
    assert v.steps[0].name == "system" and v.steps[1].content == EASIER and v.details["task"]["instruction"] == EASIER
    assert v.details["task"]["goal"] == {"actions": CANCEL_CALLS, "communicate_info": []}
    assert v.details["task"]["metadata"]["evolved_from"] == SEED.id and v.provenance.parent_ids == [SEED.id]
    checks = {c["case"]: c for c in v.details["evolution"]["checks"]}
    assert checks["solution"]["passed"] and checks["solution"]["reason"] == "goal state reached"
    assert not checks["do-nothing"]["passed"] and not checks["wrong solution 1"]["passed"]
    assert checks["wrong solution 1"]["reason"] == "the database differs from the goal state"
    assert sorted(t.reward for t in variants) == [0.0, 1.0]

    # Independently of the method: the world passes the reference solution and fails the wrong one.
    async def evaluate(actions):
        async with RetailEnv(0) as env:
            task = type(SEED).model_validate(v.details["task"])
            await env.reset(task)
            for a in actions or await env.reference_solution(task):
                await env.step(a)
            return (await env.evaluate()).success

    assert asyncio.run(evaluate(None))
    assert not asyncio.run(evaluate([ApiAction(function=c["name"], arguments=c["arguments"]) for c in WRONG_CANCEL]))

    # The harder variant's 'wrong' solution is in fact right: not verifiable, filtered with the reason.
    [stub] = [f for f in filtered.values() if f.decision.filter == "evolution_check"]
    assert stub.record.details["task"]["instruction"] == HARDER
    assert stub.decision.reason == "wrong solution 1 passes: goal state reached"
    # The stub shows the solution's run: no model chose those actions, and the record says so.
    solution = [i for i, s in enumerate(stub.record.steps) if s.kind in ("api", "message")]
    assert solution and stub.record.details["rewrites"] == [
        {"steps": solution, "kind": "written", "reason": "the evolved task's solution, run by the evolution check"}]
    assert summary.counts["evolved_easier"] == 1 and summary.counts["evolve_rejected_harder"] == 1


def test_a_code_check_runs_the_models_verifier_in_the_sandbox(tmp_path):
    summary, kept, filtered, _ = _run(tmp_path, verify="code")
    variants = [t for t in kept if t.details["curriculum"]["generation"] == 1]
    assert variants and all(t.details["task"]["goal"] == {"verifier": VERIFIER} for t in variants)
    checks = {c["case"]: c for c in variants[0].details["evolution"]["checks"]}
    assert checks["solution"] == {"case": "solution", "passed": True, "reason": "verify(state) returned True"}
    assert checks["do-nothing"]["reason"] == "verify(state) returned False"
    # Each rollout is scored by the verifier on its final state, not by the world's own goal check.
    assert sorted(t.reward for t in variants) == [0.0, 1.0]
    assert {t.details["evaluation"]["reason"] for t in variants} == {"verify(state) returned True",
                                                                    "verify(state) returned False"}
    [stub] = [f for f in filtered.values() if f.decision.filter == "evolution_check"]
    assert stub.decision.reason == "a do-nothing agent passes: verify(state) returned True"


def test_a_variant_of_a_tau2_task_gives_its_simulated_user_the_new_request():
    from generators.base import TaskSpec
    from generators.curriculum import Curriculum, CurriculumConfig, CriteriaVariant

    scenario = {"persona": "Calm.", "instructions": {"domain": "retail", "reason_for_call": "old request",
                                                     "known_info": "You are Diego, zip 92776.",
                                                     "unknown_info": "the order id", "task_instructions": "old"}}
    seed = SEED.model_copy(update={"metadata": {**SEED.metadata, "user_scenario": scenario}})
    spec = TaskSpec(id=f"{SEED.id}/easier", payload={"parent": SEED.id, "direction": "easier", "generation": 1})
    answer = CriteriaVariant(instruction=EASIER, actions=CANCEL_CALLS, wrong_solutions=[WRONG_CANCEL])
    task, solution = Curriculum(CurriculumConfig(), None).variant_task(seed, spec, answer, "criteria")
    assert solution is None and task.id == spec.id and task.instruction == EASIER
    assert task.metadata["user_scenario"] == {"persona": "Calm.", "instructions": {
        "reason_for_call": EASIER, "task_instructions": EASIER, "known_info": "You are Diego, zip 92776.",
        "domain": "retail"}}


def test_a_variant_that_checks_what_the_seed_checks_is_not_new(tmp_path):
    def same(body: dict) -> dict | None:
        if str(body["messages"][-1].get("content") or "").startswith("EVOLVE TASK"):
            return {"instruction": EASIER, "actions": [{"name": a["function"], "arguments": a["arguments"]}
                                                       for a in SEED.goal["actions"]],
                    "communicate_info": [], "wrong_solutions": [WRONG_CANCEL]}
        return None

    with FakeServer(rules=[Rule(fn=GenericModel(_references(), judge=same))]) as server:
        cfg = {"method": "curriculum", "env": "retail", "tasks": {"n": 1}, "rollouts": 2, "max_steps": 8,
               "llm": {"backend": "openai", "base_url": server.base_url, "model": "fake-model", "api_key_env": None,
                       "max_retries": 0, "request_timeout_s": 5}}
        asyncio.run(generate(load_config(cfg), tmp_path / "out"))
    reasons = {f.decision.reason for f in Dataset.open(tmp_path / "out").iter_records("filtered")}
    assert reasons == {"the new task checks exactly what the seed checks: it is not a new task"}


def test_the_reward_variance_comes_from_independent_rollouts(tmp_path):
    """DreamGym picks tasks by the variance of rewards over independent rollouts of the agent. A policy whose
    first action never varies but whose later steps do (here: the draw seeded odd gives up after its first
    call) must show that variance: every rollout samples every step with a seed of its own, so no request of one
    rollout is answered from another's (cache or in-flight join)."""
    references = _references()

    def agent(body: dict) -> Any:
        if not body.get("tools"):
            return None
        answer = GenericModel(references)._next(body)
        acted = sum(1 for m in body["messages"] if m.get("tool_calls"))
        if int(body.get("n") or 1) > 1:
            return Samples([answer] * int(body["n"]))  # one first action, however many samples
        return GIVE_UP if acted >= 1 and int(body.get("seed") or 0) % 2 else answer

    model = GenericModel(references, judge=writer)
    with FakeServer(rules=[Rule(fn=agent), Rule(fn=model)]) as server:
        cfg = {"method": "curriculum", "env": "retail", "tasks": {"n": 1}, "rollouts": 4, "generations": 1,
               "select": 1, "max_steps": 8, "concurrency": 1, "unit_tasks": 1,
               "llm": {"backend": "openai", "base_url": server.base_url, "model": "fake-model", "api_key_env": None,
                       "max_retries": 0, "request_timeout_s": 5}}
        summary = asyncio.run(generate(load_config(cfg), tmp_path / "out"))
        agent_requests = [e["body"] for e in server.log if "body" in e and e["body"].get("tools")]
    kept = list(Dataset.open(tmp_path / "out").iter_records())
    seed = sorted((t for t in kept if t.details["curriculum"]["generation"] == 0), key=lambda t: t.id)
    assert [t.reward for t in seed] == [1.0, 0.0, 1.0, 0.0]
    info = seed[0].details["curriculum"]
    assert info["variance"] == 0.25 and info["mean_reward"] == 0.5 and info["in_band"]
    assert [s["seed"] for s in info["samples"]] == [0, 1, 2, 3] and [s["reward"] for s in info["samples"]] == [1, 0, 1, 0]
    # Each rollout's first request is its own (its own seed), sampled at the curriculum's temperature.
    first = [b for b in agent_requests if not any(m.get("tool_calls") for m in b["messages"])]
    assert sorted(b["seed"] for b in first if SEED.instruction in json.dumps(b["messages"])) == [0, 1, 2, 3]
    assert all(b.get("temperature") == 1.0 and int(b.get("n") or 1) == 1 for b in first)
    # The variance selected the seed: its variants were written and checked.
    assert summary.counts["evolved_easier"] == 1


MISMATCH = f"What is the status of my order {ORDER}? I'm Diego Johansson, zip 92776."


def test_a_variant_no_agent_attempt_solves_is_not_verified_by_the_writers_replay(tmp_path):
    """DreamGym keeps tasks the world verifies. In criteria mode the writer's solution is the criteria's own actions:
    replaying them proves only that they are accepted. Here the instruction asks something else than its criteria
    check; the band is wide open, so only the agent's attempts (judged by the criteria) can tell."""
    def mismatch(body: dict) -> dict | None:
        if str(body["messages"][-1].get("content") or "").startswith("EVOLVE TASK (easier)"):
            return {"instruction": MISMATCH, "actions": CANCEL_CALLS, "communicate_info": [],
                    "wrong_solutions": [WRONG_CANCEL]}
        return None

    def run(out: Path, **extra: Any) -> Dataset:
        with FakeServer(rules=[Rule(fn=GenericModel(_references(), judge=mismatch))]) as server:
            cfg = {"method": "curriculum", "env": "retail", "tasks": {"n": 1}, "rollouts": 2, "generations": 1,
                   "select": 1, "max_steps": 8, "concurrency": 1, "unit_tasks": 1, "band": [-1.0, 2.0], **extra,
                   "llm": {"backend": "openai", "base_url": server.base_url, "model": "fake-model",
                           "api_key_env": None, "max_retries": 0, "request_timeout_s": 5}}
            asyncio.run(generate(load_config(cfg), out))
        return Dataset.open(out)

    ds = run(tmp_path / "agent")
    assert not [t for t in ds.iter_records() if t.details["curriculum"]["task_id"] == f"{SEED.id}/easier"]
    rejected = [f for f in ds.iter_records("filtered") if f.record.details.get("curriculum", {}).get("task_id")
                == f"{SEED.id}/easier"]
    assert len(rejected) == 2 and {f.decision.filter for f in rejected} == {"evolution_check"}
    assert rejected[0].decision.reason.startswith("no attempt of the agent met the task's check")
    evolution = rejected[0].record.details["evolution"]
    assert evolution["solved_by"] == "agent" and evolution["checks"][0] == {
        "case": "solution", "passed": True, "reason": "goal state reached"}
    assert evolution["checks"][-1] == {"case": "agent attempts", "passed": False,
                                       "reason": "0 of 2 attempt(s) of the agent met the task's check"}
    # The earlier check (the writer's replay alone), kept as an option, says so on each record.
    kept = [t for t in run(tmp_path / "writer", solved_by="writer").iter_records()
            if t.details["curriculum"]["task_id"] == f"{SEED.id}/easier"]
    assert len(kept) == 2 and all(t.details["evolution"]["solved_by"] == "writer" and not t.success for t in kept)
