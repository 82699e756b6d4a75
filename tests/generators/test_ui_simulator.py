"""ui_simulator end to end against the fake OpenAI-compatible server: propose -> rollout -> judge -> rewrite -> grow
(by the student's teacher-forcing loss from prompt logprobs, or, warned and counted, by success rate)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from backends.fake_server import FakeServer, Rule, ToolCallAnswer
from envs.pages import page_elements
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
    """Attempt k is the agent's draw k - 1: its own sampling seed (the run's seed is 0)."""
    return int(body.get("seed") or 0) + 1


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
    if prompt.startswith("TASK CONTROL"):  # the teacher's step-wise task control of its exploration
        return {"completed": False, "guide": "Look at the mugs."}
    if prompt.startswith("EXPLORE STEP"):
        assert "Guide: Look at the mugs." in prompt
        return {"thought": "The home page links to the mugs.", "action": {"tool": "click", "arguments": {"bid": "1"}},
                "summary": "Open the mugs page."}
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
        n = int(prompt.split("Agent steps: ", 1)[1].split("\n", 1)[0])
        return {"instruction": f"Rewritten: {original}", "thoughts": [f"For the rewritten task, step {i}." for i in range(n)]}
    if prompt.startswith("GROW TASK VARIANTS"):
        return {"variants": VARIANTS}
    return None


def _config(base_url: str, **extra) -> dict:
    return {
        "method": "ui_simulator", "loop": "propose", "env": "simulated",
        "env_config": {"mode": "web", "policy": "A small web shop that sells mugs."},
        "rounds": 2, "tasks_per_round": 3, "walk_steps": 1, "attempts": 4, "max_failures": 2, "max_steps": 4,
        "grow": True, "band_low": 0.25, "band_high": 0.75, "variants_per_task": 2, "grow_rounds": 1,
        "concurrency": 2, "unit_tasks": 1,
        "llm": {"backend": "openai", "base_url": base_url, "model": "fake-model", "api_key_env": "TRAJFORGE_TEST_KEY",
                "max_retries": 0, "request_timeout_s": 5},
        **extra,
    }


def test_ui_simulator_propose_rollout_judge_rewrite_grow_by_success_rate(tmp_path, caplog):
    """No student model: Grow falls back to the teacher's success rate over 4 attempts, warned and counted."""
    out = tmp_path / "out"
    with FakeServer(rules=[Rule(fn=script)]) as server, caplog.at_level(logging.WARNING, "trajforge.generators"):
        summary = asyncio.run(generate(load_config(_config(server.base_url)), out))
        proposer = [b for b in (e["body"] for e in server.log if "body" in e)
                    if _first_user(b).startswith("PROPOSE TASKS (round 0)")]
        grow_prompts = [_first_user(e["body"]) for e in server.log
                        if "body" in e and _first_user(e["body"]).startswith("GROW TASK VARIANTS")]
    assert summary.tasks == 3 and summary.processed == 3  # two rounds and one grown task
    # The teacher explored under a guide it wrote; the proposer saw the start page, the page its action reached
    # and what it did.
    assert len(proposer) == 1 and "Page 1: http://mugs.test/" in _first_user(proposer[0])
    assert "Page 2: http://mugs.test/mugs" in _first_user(proposer[0])
    assert "(reached by: click link 'Mugs')" in _first_user(proposer[0])
    assert "- Look at the mugs.: Open the mugs page." in _first_user(proposer[0])

    ds = Dataset.open(out)
    kept = {t.id: t for t in ds.iter_records()}
    buy, price, cents = "round-0000/t0", "round-0000/t1", "round-0000/t1/v0"
    assert sorted(kept) == sorted([f"ui_simulator/{buy}#{a}" for a in range(4)]
                                  + [f"ui_simulator/{price}#{a}" for a in (0, 2, 3)]
                                  + [f"ui_simulator/{cents}#{a}" for a in range(4)])
    for t in kept.values():
        assert t.success is True and t.reward == 1.0 and t.source == "ui_simulator"
        assert t.steps[0].name == "system" and t.steps[1].source == "user"
        # Attempts are distinct draws (their own seeds); nothing in the prompt exports train on names the attempt.
        assert "Attempt" not in t.steps[0].content and t.details["loop"] in ("propose", "grow")
        assert t.steps[1].content == f"Rewritten: {t.details['original_instruction']}"
        assert t.details["rewritten_instruction"] == t.steps[1].content
        # Each action's thought was rewritten for the new instruction (the agent's own kept), and the record says
        # every action is written.
        actions = [i for i, s in enumerate(t.steps) if s.kind in ("api", "message")]
        assert [(r["kind"], r["steps"]) for r in t.details["rewrites"]] == [("written", actions)]
        assert [t.steps[i].thought for i in actions] == [f"For the rewritten task, step {k}." for k in range(len(actions))]
        assert all("original_thought" in t.steps[i].extra for i in actions)
        if t.details["task"]["depth"] == 0:  # a proposed task (variants come from their parent, not a round)
            assert t.details["explore"] == {"mode": "teacher", "guides": [{"guide": "Look at the mugs.",
                                                                           "steps": ["Open the mugs page."]}]}
        assert t.steps[2].kind == "web" and t.steps[2].url == "http://mugs.test/"  # the explored start page
        assert t.details["judge"]["success"] is True and t.details["judge"]["reasoning"] == "done as asked"
        assert t.details["walk"] == [HOME["url"], MUGS["url"]]
        assert [x.name for x in t.tools] == ["click", "type", "scroll", "go_back", "goto"]
        assert t.provenance.method == "ui_simulator" and t.provenance.task_id == t.details["task"]["id"]
    bought = kept[f"ui_simulator/{buy}#0"]
    assert [s.kind for s in bought.steps] == ["text", "text", "web", "api", "web", "message", "text"]
    assert bought.details["original_instruction"] == "Buy the blue mug." and bought.provenance.parent_ids == []
    # Only the price task (3 of 4 attempts) lies in the [0.25, 0.75] band: the purchase is always solved and
    # the moon never (with grow, every task has all its attempts).
    assert len(grow_prompts) == 1 and "Task: Find the price of the blue mug." in grow_prompts[0]
    assert "Agent success: 3 of 4 attempts." in grow_prompts[0]
    variant = kept[f"ui_simulator/{cents}#0"]
    assert variant.provenance.parent_ids == [price]
    assert variant.details["task"] | {} == {"id": cents, "expected_outcome": "500 cents", "depth": 1, "parent": price,
                                            "direction": "harder"}
    grow = variant.details["grow"]
    assert grow["selected_by"] == "success_rate" and grow["success_rate"] == 0.75 and grow["parent"] == price
    assert "no student model is configured" in grow["reason"]

    filtered = sorted((f.record.id, f.decision.filter, f.decision.reason) for f in ds.iter_records("filtered"))
    assert filtered == sorted(
        [(f"ui_simulator/{price}#1", "completion", "unsuccessful: outcome not reached")]
        + [(f"ui_simulator/round-0000/t2#{a}", "completion", "unsuccessful: outcome not reached") for a in range(4)]
        + [(f"ui_simulator/round-0000/t1/v1#{a}", "completion", "unsuccessful: outcome not reached") for a in range(4)])
    c = summary.counts
    assert "dropped_tasks" not in c and c["failed:unsuccessful"] == 9 and c["attempts"] == 20
    assert c["successes"] == 11 and c["rewritten"] == 11 and c["variants"] == 2 and c["proposed_tasks"] == 3
    assert c["outside_band"] == 2  # the purchase is too easy, the moon too hard
    assert c["grow_fallback"] == 1 and c["grow_selected_by_success_rate"] == 1
    assert any("Grow chooses tasks by the teacher's success rate over 4 attempts" in r.message and
               "no student model" in r.message for r in caplog.records)
    [q] = list(ds.iter_records("quarantine"))
    assert q.stage == "propose" and q.location == "task round-0001"
    assert summary.reasons == {"completion: unsuccessful": 9, "propose: no valid task proposals": 1}


def test_the_teacher_explores_with_step_wise_task_control(tmp_path):
    """UI-Simulator's explorer is the teacher, steered by guides: before each action it checks whether its guide is
    done (seeing its steps so far and the elements that just appeared) and, when it is, writes the next one; the
    action is chosen under the guide. An action the tools refuse is noted and the page stays."""
    controls: list[str] = []

    def explorer(body: dict):
        prompt = _first_user(body)
        if prompt.startswith("TASK CONTROL"):
            controls.append(prompt)
            if len(controls) == 1:
                return {"completed": False, "guide": "Look at the mugs."}
            if len(controls) == 2:
                return {"completed": True, "guide": "Buy the blue mug."}
            return {"completed": False, "guide": "Buy the blue mug."}
        if prompt.startswith("EXPLORE STEP"):
            guide = prompt.split("Guide: ", 1)[1].split("\n", 1)[0]
            if guide == "Look at the mugs.":
                return {"thought": "Mugs are linked.", "action": {"tool": "click", "arguments": {"bid": "1"}},
                        "summary": "Open the mugs page."}
            if "2. " not in prompt:
                return {"thought": "A buy button.", "action": {"tool": "click", "arguments": {"bid": "5"}},
                        "summary": "Buy the blue mug."}
            return {"thought": "Again.", "action": {"tool": "click", "arguments": {}}, "summary": "Click."}
        return script(body)

    config = _config("", rounds=1, tasks_per_round=1, walk_steps=3, attempts=1, grow=False, rewrite=False)
    with FakeServer(rules=[Rule(fn=explorer)]) as server:
        config["llm"]["base_url"] = server.base_url
        summary = asyncio.run(generate(load_config(config), tmp_path / "out"))
    assert len(controls) == 3
    # The second check saw the first step and what its page newly showed, and found the guide done.
    assert "Current guide: Look at the mugs." in controls[1]
    assert "1. click link 'Mugs': Open the mugs page." in controls[1] and "button 'Buy blue mug'" in controls[1]
    assert "Current guide: Buy the blue mug." in controls[2] and "2. click button 'Buy blue mug'" in controls[2]
    [t] = list(Dataset.open(tmp_path / "out").iter_records())
    assert t.details["explore"] == {"mode": "teacher", "guides": [
        {"guide": "Look at the mugs.", "steps": ["Open the mugs page."]},
        {"guide": "Buy the blue mug.", "steps": ["Buy the blue mug."]}]}
    c = summary.counts
    assert c["explore_guides"] == 2 and c["explore_actions"] == 2 and c["explore_refused"] == 1
    assert c["explore_calls"] == 6 and c["explored_pages"] == 3
    assert summary.roles["explorer"]["played_by"] == "actor"


def test_grow_without_a_student_needs_four_attempts():
    with pytest.raises(ValueError, match="needs attempts >= 4"):
        load_config(_config("http://127.0.0.1:9/v1", attempts=2))
    # The paper's loop has one wrapped trajectory per task: only the student's loss can rank them.
    with pytest.raises(ValueError, match="grow with loop: wrap ranks the wrapped tasks by the student's loss"):
        load_config(_config("http://127.0.0.1:9/v1", loop="wrap"))
    with pytest.raises(ValueError, match="loop: wrap makes its trajectories from the teacher's exploration"):
        load_config(_config("http://127.0.0.1:9/v1", loop="wrap", grow=False, explore="random"))


def test_grow_by_success_rate_measures_every_task_over_all_its_attempts(tmp_path):
    """Success rates over 4 attempts can be 1/4, 2/4 or 3/4 inside the band: a task failed twice is not dropped
    before its rate is known (with max_failures 2 it would be, and the band could only hold 3 of 4)."""
    solved = {"Task half.": (1, 2), "Task quarter.": (3,), "Task always.": (1, 2, 3, 4), "Task never.": ()}

    def rules(body: dict):
        prompt = _first_user(body)
        if body.get("tools"):
            return "Done." if _attempt(body) in solved[prompt] else "I could not."
        if prompt.startswith("PROPOSE TASKS"):
            return {"tasks": [{"instruction": t, "expected_outcome": "done"} for t in solved]}
        if prompt.startswith("JUDGE TASK COMPLETION"):
            ok = "Done." in prompt.split("Transcript:", 1)[1]
            return {"reasoning": "done" if ok else "not done", "success": ok}
        if prompt.startswith("GROW TASK VARIANTS"):
            task = prompt.split("Task: ", 1)[1].split("\n", 1)[0]
            return {"variants": [{"instruction": f"{task} Twice.", "expected_outcome": "done", "direction": "harder"}]}
        return None

    config = _config("", env="web", env_config={"seed": 0}, rounds=1, tasks_per_round=4, walk_steps=0, attempts=4,
                     max_failures=2, rewrite=False)
    with FakeServer(rules=[Rule(fn=rules)]) as server:
        config["llm"]["base_url"] = server.base_url
        summary = asyncio.run(generate(load_config(config), tmp_path / "out"))
        grown = sorted(_first_user(e["body"]).split("Task: ", 1)[1].split("\n", 1)[0] for e in server.log
                       if "body" in e and _first_user(e["body"]).startswith("GROW TASK VARIANTS"))
    assert grown == ["Task half.", "Task quarter."]
    variants = [t for t in Dataset.open(tmp_path / "out").iter_records() if t.details["task"]["depth"] == 1]
    assert {t.details["grow"]["success_rate"] for t in variants} <= {0.25, 0.5}
    assert summary.counts["attempts"] >= 16 and "dropped_tasks" not in summary.counts


LOSSES = {"Task A.": 0.5, "Task B.": 1.0, "Task C.": 2.0, "Task D.": 3.0, "Task E.": 4.0}


def _shop(body: dict):
    """Web-shop rounds: five proposed tasks, all done and judged done; one variant per grown task."""
    prompt = _first_user(body)
    if body.get("tools"):
        return "Done."
    if prompt.startswith("PROPOSE TASKS"):
        return {"tasks": [{"instruction": t, "expected_outcome": "done"} for t in LOSSES]}
    if prompt.startswith("JUDGE TASK COMPLETION"):
        return {"reasoning": "done", "success": True}
    if prompt.startswith("GROW TASK VARIANTS"):
        task = prompt.split("Task: ", 1)[1].split("\n", 1)[0]
        return {"variants": [{"instruction": f"{task} Twice.", "expected_outcome": "done", "direction": "harder"}]}
    return None


def _student_loss(body: dict) -> float:
    """The student finds each task's trajectories as hard as LOSSES says (nats per token)."""
    text = " ".join(str(m.get("content")) for m in body["messages"])
    return -next(loss for task, loss in LOSSES.items() if task in text)


def _grow_run(tmp_path, student_server: FakeServer, **extra):
    config = _config("", env="web", env_config={"seed": 0}, rounds=1, tasks_per_round=5, walk_steps=0, attempts=1,
                     rewrite=False, **extra)
    config["student"] = {"llm": {**config["llm"], "base_url": student_server.base_url, "model": "student"}}
    with FakeServer(rules=[Rule(fn=_shop)]) as server:
        config["llm"]["base_url"] = server.base_url
        summary = asyncio.run(generate(load_config(config), tmp_path / "out"))
        grown = sorted(_first_user(e["body"]).split("Task: ", 1)[1].split("\n", 1)[0] for e in server.log
                       if "body" in e and _first_user(e["body"]).startswith("GROW TASK VARIANTS"))
        assert not any("prompt_logprobs" in e["body"] for e in server.log if "body" in e)
    return summary, grown, list(Dataset.open(tmp_path / "out").iter_records())


def test_grow_picks_the_tasks_whose_student_loss_lies_in_the_band(tmp_path):
    with FakeServer(prompt_logprob=_student_loss) as student:
        summary, grown, kept = _grow_run(tmp_path, student)
        scored = [e["body"] for e in student.log if "body" in e]
    # The student scored each task's trajectory with prompt logprobs; the 25th-75th percentile of the
    # losses 0.5, 1, 2, 3, 4 is [1, 3]: B, C and D are grown, A (learned) and E (too hard) are not.
    assert len(scored) == 5 and all(b["prompt_logprobs"] == 1 and b["model"] == "student" for b in scored)
    assert grown == ["Task B.", "Task C.", "Task D."]
    variants = {t.details["original_instruction"]: t.details["grow"] for t in kept if t.details["task"]["depth"] == 1}
    assert sorted(variants) == ["Task B. Twice.", "Task C. Twice.", "Task D. Twice."]
    assert {v["student_loss"] for v in variants.values()} == {1.0, 2.0, 3.0}
    assert all(v["selected_by"] == "student_loss" and v["band"] == [1.0, 3.0] for v in variants.values())
    assert "within the 25%-75% percentile band [1.0000, 3.0000] of 5 tasks" in variants["Task C. Twice."]["reason"]
    c = summary.counts
    assert c["grow_selected_by_student_loss"] == 3 and c["outside_band"] == 2 and c["grow_scored_trajectories"] == 5
    assert "grow_fallback" not in c


def test_a_student_server_that_cannot_score_falls_back_with_a_warning(tmp_path, caplog):
    with FakeServer(prompt_logprob=None) as student, caplog.at_level(logging.WARNING, "trajforge.generators"):
        summary, grown, _ = _grow_run(tmp_path, student)
    # One attempt each, all solved: a success rate of 1 is outside the band, nothing is grown.
    assert grown == [] and summary.counts["grow_fallback"] == 1 and summary.counts["outside_band"] == 5
    [warning] = [r.message for r in caplog.records if "Grow chooses tasks" in r.message]
    assert "the student model cannot score" in warning and "returned no prompt_logprobs" in warning


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
                     grow=False, rewrite=False, explore="random")
    with FakeServer(rules=[Rule(fn=rules)]) as server:
        config["llm"]["base_url"] = server.base_url
        summary = asyncio.run(generate(load_config(config), tmp_path / "out"))
        proposer = next(b for b in (e["body"] for e in server.log if "body" in e)
                        if _first_user(b).startswith("PROPOSE TASKS"))
    [t] = list(Dataset.open(tmp_path / "out").iter_records())
    assert summary.counts["successes"] == 1 and t.success
    assert "Welcome to the shop" in _first_user(proposer) and len(t.details["walk"]) == 3
    assert t.steps[1].content == "Tell me a category of the shop." and t.steps[2].kind == "web"
    assert "rewritten_instruction" not in t.details and "rewrites" not in t.details


STARTS = {"/": "Task A.", "/cart": "Task B.", "/search?q=mug": "Task C.", "/search?q=cup": "Task D.",
          "/search?q=tea": "Task E."}


def _wrapping_shop(body: dict):
    """The paper's loop in the web shop: the teacher clicks the page's first link under one guide; the wrapper names
    each exploration by the page it started on; the agent does each grown variant; the judge reads the pages."""
    prompt = _first_user(body)
    if body.get("tools"):
        return "Done."
    if prompt.startswith("TASK CONTROL"):
        return {"completed": False, "guide": "Look around."}
    if prompt.startswith("EXPLORE STEP"):
        page = prompt.split("Current page:\n", 1)[1].split("\n", 1)[1]
        link = next(e for e in page_elements(page) if e.role == "link" and e.bid)
        return {"thought": "A link.", "action": {"tool": "click", "arguments": {"bid": link.bid}}, "summary": "Follow it."}
    if prompt.startswith("WRAP TRAJECTORY"):
        n = int(prompt.split("Agent steps: ", 1)[1].split("\n", 1)[0])
        first = prompt.split("SEEN: page http://shop.local", 1)[1].split("\n", 1)[0]
        return {"instruction": STARTS[first], "thoughts": ["Go on."] * n, "answer": "Done."}
    if prompt.startswith("JUDGE TASK COMPLETION"):
        return {"reasoning": "the pages show it", "success": True}
    if prompt.startswith("GROW TASK VARIANTS"):
        task = prompt.split("Task: ", 1)[1].split("\n", 1)[0]
        return {"variants": [{"instruction": f"{task} Twice.", "expected_outcome": "done", "direction": "harder"}]}
    return None


def test_grow_in_the_papers_loop_ranks_the_wrapped_explorations_by_the_students_loss(tmp_path):
    config = _config("", loop="wrap", env="web", env_config={"seed": 0}, rounds=5, walk_steps=1, attempts=1,
                     start_urls=list(STARTS))
    with FakeServer(prompt_logprob=_student_loss) as student:
        config["student"] = {"llm": {**config["llm"], "base_url": student.base_url, "model": "student"}}
        with FakeServer(rules=[Rule(fn=_wrapping_shop)]) as server:
            config["llm"]["base_url"] = server.base_url
            summary = asyncio.run(generate(load_config(config), tmp_path / "out"))
            bodies = [e["body"] for e in server.log if "body" in e]
        scored = [e["body"] for e in student.log if "body" in e]
    records = list(Dataset.open(tmp_path / "out").iter_records())
    wrapped = {t.steps[1].content: t for t in records if t.details["loop"] == "wrap"}
    assert sorted(wrapped) == sorted(STARTS.values()) and len(scored) == 5
    assert not any(_first_user(b).startswith("PROPOSE TASKS") for b in bodies)
    grown = {t.details["original_instruction"]: t for t in records if t.details["loop"] == "grow"}
    assert sorted(grown) == ["Task B. Twice.", "Task C. Twice.", "Task D. Twice."]
    for t in grown.values():
        parent = wrapped[t.details["original_instruction"].removesuffix(" Twice.")]
        assert t.provenance.parent_ids == [parent.details["task"]["id"]]
        assert t.details["grow"]["selected_by"] == "student_loss"
    assert summary.counts["wrapped"] == 5 and summary.counts["grow_selected_by_student_loss"] == 3
