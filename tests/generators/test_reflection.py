"""reflection: a teacher model (its own endpoint) reviews a failed retail rollout step by step; two wrong steps
(one recorded, one the agent makes later) are masked, reflected on and corrected; the outcome decides."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from backends.fake_server import FakeServer, Rule, ToolCallAnswer
from generators.runner import generate, load_config
from generators.scripted import BAD_ORDER, cancel_tasks
from schemas.store import Dataset
from viewer.records import segments

TASK = cancel_tasks(1)[0]
FIND, DETAILS, CANCEL = TASK.goal["actions"]
ORDER, REASON = CANCEL["arguments"]["order_id"], CANCEL["arguments"]["reason"]
WRONG_REASON = "ordered by mistake" if REASON == "no longer needed" else "no longer needed"
R1 = f"I looked up an order that does not exist; the customer's order is {ORDER}."
R2 = f"I cancelled with the wrong reason; the customer said: {REASON}."
DONE = "Your order has been cancelled. Is there anything else?"


def _calls(body: dict) -> list[tuple[str, dict, str]]:
    """(name, arguments, answer) of every tool call in the agent's prompt."""
    answers = {m.get("tool_call_id"): str(m.get("content")) for m in body["messages"] if m["role"] == "tool"}
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]), answers.get(c["id"], ""))
            for m in body["messages"] for c in m.get("tool_calls") or []]


def agent(body: dict):
    """Without a reflection in its history it looks up a wrong order and gives up (the failed input);
    after the teacher's first reflection it cancels with the wrong reason once, then wraps up."""
    calls = _calls(body)
    text = " ".join(str(m.get("content") or "") for m in body["messages"])
    if R1 not in text:
        if not calls:
            return ToolCallAnswer(FIND["function"], FIND["arguments"])
        if len(calls) == 1:
            return ToolCallAnswer("get_order_details", {"order_id": BAD_ORDER})
        return "I could not find your order. Is there anything else?"
    if any(name == "cancel_pending_order" and not answer.startswith("Error") for name, _, answer in calls):
        return DONE
    return ToolCallAnswer("cancel_pending_order", {"order_id": ORDER, "reason": WRONG_REASON})


def teacher(body: dict):
    prompt = body["messages"][-1]["content"]
    if not prompt.startswith("REVIEW THE AGENT'S STEP"):
        return None
    step = prompt.split("The step to review:\n", 1)[1].split("\n", 1)[0]
    if f'"order_id":"{BAD_ORDER}"' in step:
        return {"verdict": "wrong", "reason": "that order id is not the customer's", "reflection": R1,
                "action": {"tool": "get_order_details", "arguments": {"order_id": ORDER}}}
    if "cancel_pending_order" in step and WRONG_REASON in step:
        return {"verdict": "wrong", "reason": "the cancellation reason is not the one the customer gave",
                "reflection": R2, "action": {"tool": "cancel_pending_order",
                                             "arguments": {"order_id": ORDER, "reason": REASON}}}
    return {"verdict": "correct", "reason": f"fine: {step[:40]}", "reflection": "", "action": None}


def _llm(server: FakeServer) -> dict:
    return {"backend": "openai", "base_url": server.base_url, "model": "fake-model", "api_key_env": None,
            "max_retries": 0, "request_timeout_s": 5}


def _failed_rollout(tmp: Path, server: FakeServer) -> Path:
    out = tmp / "rollouts"
    cfg = {"method": "rollout", "env": "retail", "tasks": {"n": 1, "ids": [TASK.id]}, "keep_failed": True,
           "max_steps": 6, "llm": _llm(server)}
    asyncio.run(generate(load_config(cfg), out))
    [failed] = list(Dataset.open(out).iter_records())
    assert not failed.success and [s.function for s in failed.steps if s.kind == "api"] == [FIND["function"],
                                                                                           "get_order_details"]
    return out


def test_two_wrong_steps_are_masked_reflected_on_and_corrected(tmp_path):
    """`wrong_steps: undone`: each wrong step is taken back in the world before its correction."""
    with FakeServer(rules=[Rule(fn=agent)]) as acting, FakeServer(rules=[Rule(fn=teacher)]) as teaching:
        inputs = _failed_rollout(tmp_path, acting)
        cfg = {"method": "reflection", "env": "retail", "input": str(inputs), "max_steps": 10, "llm": _llm(acting),
               "teacher": {"llm": {**_llm(teaching), "model": "teacher-model"}}, "wrong_steps": "undone"}
        summary = asyncio.run(generate(load_config(cfg), tmp_path / "out"))
        capped = asyncio.run(generate(load_config({**cfg, "max_corrections": 1}), tmp_path / "capped"))
        acting_prompts, teacher_prompts = acting.asked(), teaching.asked()
    assert not any(p.startswith("REVIEW THE AGENT'S STEP") for p in acting_prompts)
    assert teacher_prompts and all(p.startswith("REVIEW THE AGENT'S STEP") for p in teacher_prompts)

    [t] = list(Dataset.open(tmp_path / "out").iter_records())
    assert t.success and t.reward == 1.0 and t.source == "reflection"
    kinds = [(s.kind, s.train) for s in t.steps]
    wrong = [i for i, s in enumerate(t.steps) if s.kind == "api" and not s.train]
    # The recorded wrong lookup and the agent's later wrong cancel: each masked with its observation, then the
    # teacher's reflection (trained, a revision thought) and the teacher's corrected action (trained).
    assert len(wrong) == 2
    first, second = (t.steps[i] for i in wrong)
    assert first.function == "get_order_details" and first.arguments == {"order_id": BAD_ORDER}
    assert second.function == "cancel_pending_order" and second.arguments["reason"] == WRONG_REASON
    for i, text in zip(wrong, (R1, R2)):
        assert kinds[i + 1] == ("text", False) and t.steps[i].label == "bad" and t.steps[i].extra["teacher_reason"]
        assert t.steps[i + 2].kind == "message" and t.steps[i + 2].extra == {"kind": "revision"}
        assert t.steps[i + 2].content == text and t.steps[i + 2].train and t.steps[i + 3].train
    assert t.steps[wrong[0] + 3].arguments == {"order_id": ORDER}
    assert t.steps[wrong[1] + 3].arguments == {"order_id": ORDER, "reason": REASON}
    assert sum(1 for s in t.steps if s.kind == "message" and s.extra.get("kind") == "revision") == 2
    info = t.details["reflection"]
    assert [c["source"] for c in info["corrections"]] == ["recorded", "agent"]
    assert [c["wrong_step"] for c in info["corrections"]] == wrong
    assert info["masked"] == [wrong[0], wrong[0] + 1, wrong[1], wrong[1] + 1]
    assert info["teacher"] == "openai:teacher-model"
    assert all(v["reason"] for v in info["verdicts"]) and info["verdicts"][0]["verdict"] == "correct"
    assert t.details["evaluation"]["success"] and t.provenance.parent_ids == [f"rollout/{TASK.id}#0"]
    assert summary.counts["corrections"] == 2 and summary.counts["kept"] == 1
    # The record opens with the failed rollout's system prompt (its replayed actions answered it) and declares
    # the teacher's words: no request of the agent produced them.
    [failed] = list(Dataset.open(inputs).iter_records())
    assert t.steps[0] == failed.steps[0] and t.steps[0].name == "system"
    assert t.details["rewrites"] == [{"steps": [wrong[0] + 2, wrong[0] + 3, wrong[1] + 2, wrong[1] + 3],
                                      "kind": "written", "reason": "the teacher's reflection and corrected action"}]
    # The viewer shows both corrections: masked bad segments and two revision thoughts.
    segs = segments(t)
    assert [i for i, seg in enumerate(segs) if seg == "revision"] == [wrong[0] + 2, wrong[1] + 2]
    assert [i for i, seg in enumerate(segs) if seg == "bad"] == info["masked"]

    # With one correction allowed, the agent's later mistake stays: the outcome fails and the record is
    # filtered with the reason.
    [f] = list(Dataset.open(tmp_path / "capped").iter_records("filtered"))
    assert f.decision.filter == "outcome"
    assert re.match(r"still failed after 1 correction\(s\): reward 0\.0: the database differs", f.decision.reason)
    assert capped.counts["corrections"] == 1


def test_an_undone_step_is_answered_neutrally_never_by_a_verdict(tmp_path):
    """The wrong cancel succeeded in the world, then the world was put back: the record (and every later request of
    the agent) answers it with a neutral observation, never the cancellation it reported nor a verdict."""
    from generators.reflection import NEUTRAL

    with FakeServer(rules=[Rule(fn=agent)]) as acting, FakeServer(rules=[Rule(fn=teacher)]) as teaching:
        inputs = _failed_rollout(tmp_path, acting)
        cfg = {"method": "reflection", "env": "retail", "input": str(inputs), "max_steps": 10, "llm": _llm(acting),
               "teacher": {"llm": {**_llm(teaching), "model": "teacher-model"}}, "wrong_steps": "undone"}
        asyncio.run(generate(load_config(cfg), tmp_path / "out"))
        later = [e["body"] for e in acting.log if "body" in e and R2 in json.dumps(e["body"])]
    [t] = list(Dataset.open(tmp_path / "out").iter_records())
    wrong = [i for i, s in enumerate(t.steps) if s.kind == "api" and not s.train]
    cancel = wrong[1]
    assert t.steps[cancel].arguments["reason"] == WRONG_REASON
    answer = t.steps[cancel + 1]
    assert answer.kind == "text" and answer.content == NEUTRAL and answer.extra == {"undone": True}
    assert t.details["reflection"]["corrections"][1]["wrong_step_kept"] == "undone"
    assert answer.tool_call_id == t.steps[cancel].tool_call_id and not answer.train
    # No observation anywhere in the record reports the undone cancellation (its reason appears in none).
    assert not any(WRONG_REASON in str(s.content) for s in t.steps if s.kind == "text")
    # The world's real answer is kept for audit on the correction only.
    assert WRONG_REASON in t.details["reflection"]["corrections"][1]["undone_observation"]
    # The agent continued from a context without it.
    assert later and not any(WRONG_REASON in str(m.get("content")) for b in later for m in b["messages"]
                             if m["role"] == "tool")


def test_stepwise_wrong_steps_are_carried_out_and_the_teacher_sees_only_the_conversation(tmp_path):
    """STeP, the default: a wrong step keeps the world's real answer and the world goes on from it. The wrong
    lookup's error stays (masked context the world went through); the wrong cancel cannot be taken back, so the
    teacher's corrected cancel is refused and the record filtered with the reason. No verdict enters the context;
    the teacher is shown the user's request as the conversation made it."""
    with FakeServer(rules=[Rule(fn=agent)]) as acting, FakeServer(rules=[Rule(fn=teacher)]) as teaching:
        inputs = _failed_rollout(tmp_path, acting)
        cfg = {"method": "reflection", "env": "retail", "input": str(inputs), "max_steps": 10, "llm": _llm(acting),
               "teacher": {"llm": {**_llm(teaching), "model": "teacher-model"}}}
        summary = asyncio.run(generate(load_config(cfg), tmp_path / "out"))
        teacher_prompts = teaching.asked()
    [f] = list(Dataset.open(tmp_path / "out").iter_records("filtered"))
    t = f.record
    assert f.decision.filter == "teacher" and "was refused" in f.decision.reason
    first, second = t.details["reflection"]["corrections"]
    assert first["wrong_step_kept"] == second["wrong_step_kept"] == "carried_out" and "undone_observation" not in first
    lookup = t.steps[first["wrong_step"]]
    assert lookup.arguments == {"order_id": BAD_ORDER} and not lookup.train and lookup.extra["masked"] == "context"
    assert t.steps[first["wrong_step"] + 1].content.startswith("Error")  # what the world answered
    cancel = t.steps[second["wrong_step"]]
    assert cancel.arguments["reason"] == WRONG_REASON and "Error" not in t.steps[second["wrong_step"] + 1].content
    assert not any(s.extra.get("undone") for s in t.steps) and summary.counts["corrections"] == 2
    request = t.steps[1].content
    assert all(p.split("Task: ", 1)[1].split("\n\nConversation so far", 1)[0] == request for p in teacher_prompts)
