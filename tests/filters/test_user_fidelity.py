"""User-simulator fidelity: the rules on the hand-labelled tau2 turns, the judge on the fake server, and the
check in a real run (`trajforge generate` on tau2's MCP server with an LLM persona), quarantining or marking."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from backends.fake_server import FakeServer, Rule, ToolCallAnswer
from benchmarks.user_fidelity import agreement, episode_steps, load_set, tau2_tasks, verdicts
from envs.base import USER_STOP
from envs.users import TURN_CAP_REPLY
from filters.user_fidelity import check_user_turns, rule_verdict
from schemas.models import MessageAction, TextObservation
from schemas.store import Dataset
from tests.conftest import REPO
from tests.envs.mcp_support import TASKS, tau2_config
from tests.filters.conftest import llm_config


def test_rules_on_the_labelled_tau2_turns_flag_no_good_turn_and_every_visible_break() -> None:
    pairs = asyncio.run(verdicts(load_set()))
    result = agreement(pairs)
    assert result["turns"] >= 40 and result["broken"] >= 15
    assert result["false_positives"] == 0, result["false_positive_examples"]
    per = result["per_label"]
    # What rules can see, they see: empty turns, agent speech and tool calls, echoes.
    assert per["empty"]["flagged"] == per["empty"]["turns"] and per["role_flip"]["flagged"] == per["role_flip"]["turns"]
    # What needs reading (contradictions) is left to the judge.
    assert per["contradiction"]["flagged"] == 0
    assert 0.6 <= result["recall"] < 1.0


def test_rule_reasons_name_what_the_user_said() -> None:
    task = tau2_tasks()["6"]
    steps = [TextObservation(content="Hi, I want to exchange a lamp.", source="user"),
             MessageAction(content="Sure, what is your name and zip code?"),
             TextObservation(content="Mei Kovacs, zip code 28236, order #W1111111.", source="user"),
             MessageAction(content="Thanks."),
             TextObservation(content=TURN_CAP_REPLY, source="user")]
    invented = rule_verdict(task, steps, 2)
    assert invented is not None and invented.label == "invented" and "#W1111111" in invented.reason
    assert rule_verdict(task, steps, 0) is None
    cap = rule_verdict(task, steps, 4)
    assert cap is not None and cap.label == "ok" and "turn cap" in cap.reason
    opening = [TextObservation(content=f"Bye {USER_STOP}", source="user")]
    assert rule_verdict(task, opening, 0).label == "early_stop"  # type: ignore[union-attr]
    # The system step is never a user turn.
    system = [TextObservation(content="You are an agent.", source="environment", name="system"), *steps[:1]]
    assert [t.step for t in asyncio.run(check_user_turns(task, system)).turns] == [1]


def _verdicts(body: dict[str, Any]) -> Any:
    text = body["messages"][-1]["content"]
    if not text.startswith("You check one message"):
        return None
    turn = text.split("<message to check>")[1]
    if "Sorry, I meant size 8" in turn:
        return "not json at all"
    if "Size 9, please" in turn:
        return {"label": "contradiction", "reason": "the scenario asks for size 8"}
    return {"label": "ok", "reason": "follows the scenario"}


def test_judge_grades_what_the_rules_pass_and_an_unusable_verdict_is_unknown() -> None:
    from backends.config import LLMConfig
    from backends.registry import make_llm

    episode = next(e for e in load_set() if e["id"] == "e07")
    steps, labels = episode_steps(episode)
    with FakeServer(rules=[Rule(fn=_verdicts)]) as server:
        async def run() -> Any:
            judge = make_llm(LLMConfig.model_validate(llm_config(server)))
            try:
                return await check_user_turns(tau2_tasks()["15"], steps, judge=judge, tools=[])
            finally:
                await judge.aclose()

        result = asyncio.run(run())
    by_step = {t.step: t for t in result.turns}
    contradiction = next(i for i, label in labels.items() if label == "contradiction")
    assert by_step[contradiction].label == "contradiction" and by_step[contradiction].by == "judge"
    assert by_step[min(labels)].label == "ok" and by_step[min(labels)].by == "judge"
    assert by_step[max(labels)].label == "unknown"  # the judge's answer was not JSON: unchecked, not broken
    record = result.as_dict()
    assert record["ok"] is False and record["judge"] == "openai:fake-model" and record["unchecked"] == 1
    assert record["reason"].startswith(f"user turn at step {contradiction}: contradiction (judge)")


# ---- a real run: tau2's MCP server, the persona and the judge on the fake server -------------------------


class Run:
    """The agent, the persona and the fidelity judge of three tau2 tasks, all on one fake server."""

    def __call__(self, body: dict[str, Any]) -> Any:
        messages = body["messages"]
        system, last = messages[0]["content"], messages[-1]["content"]
        if body.get("tools"):  # the agent: ask, look up, close
            said = sum(1 for m in messages if m["role"] == "assistant")
            plan = ["Could you give me your name and zip code?",
                    ToolCallAnswer("find_user_id_by_name_zip", {"first_name": "Yusuf", "last_name": "Rossi",
                                                                "zip": "19122"}),
                    "Your request is noted. Anything else?"]
            return plan[min(said, 2)]
        if system.startswith("You are playing a customer"):
            tshirts = "tshirt" in system  # task 2; tasks 0 and 1 exchange items of order #W2378156
            if last == "Hi! How can I help you today?":
                return "Hi, how many t-shirt options do you have?" if tshirts else "Hi, I need help with order #W2378156."
            if "name and zip" in last:
                if "rather only exchange the thermostat" in system:  # task 1: an order id nobody gave it
                    return "Yusuf Rossi, 19122, and my other order is #W7777777."
                return "Yusuf Rossi, 19122."
            return f"Thanks, that's all. {USER_STOP}"
        if last.startswith("You check one message"):
            if "tshirt" in last and "that's all" in last.split("<message to check>")[1]:
                return {"label": "early_stop", "reason": "leaves before asking about the t-shirts"}
            return {"label": "ok", "reason": "follows the scenario"}
        return None


def _config(tmp_path: Path, server: FakeServer, on_broken: str) -> dict[str, Any]:
    llm = llm_config(server)
    return {"method": "rollout", "env": "mcp", "env_config": tau2_config(str(tmp_path / f"state-{on_broken}")),
            "tasks": {"source": "tau2", "path": TASKS, "ids": ["tau2-retail-0", "tau2-retail-1", "tau2-retail-2"]},
            "user": {"kind": "llm", "max_turns": 4, "fidelity": {"on_broken": on_broken, "judge_llm": llm}},
            "llm": llm, "max_steps": 6, "concurrency": 3}


def test_cli_generate_quarantines_or_marks_episodes_of_a_broken_user_and_filter_drops_them(tmp_path: Path) -> None:
    from generators.runner import generate, load_config
    from pipelines.filter import run_filter

    with FakeServer(rules=[Rule(fn=Run())]) as server:
        path = tmp_path / "quarantine.yaml"
        path.write_text(yaml.safe_dump(_config(tmp_path, server, "quarantine")))
        out = tmp_path / "quarantine"
        done = subprocess.run([sys.executable, "-m", "flows.cli", "generate", "--method", "rollout", "--config",
                               str(path), "--output", str(out)], cwd=REPO, env={**os.environ}, capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        ds = Dataset.open(out)
        kept = {t.provenance.task_id: t for t in ds.iter_records()}
        assert list(kept) == ["tau2-retail-0"]
        fidelity = kept["tau2-retail-0"].details["user_fidelity"]
        assert fidelity["ok"] is True and fidelity["judge"] == "openai:fake-model" and fidelity["checked"] == 3
        assert [t["label"] for t in fidelity["turns"]] == ["ok", "ok", "ok"]
        quarantined = {q.location: q for q in ds.iter_records("quarantine")}
        assert set(quarantined) == {"task tau2-retail-1", "task tau2-retail-2"}
        invented = quarantined["task tau2-retail-1"]
        assert invented.stage == "user" and "invented (rule): states '#W7777777'" in invented.error
        assert json.loads(invented.raw)["details"]["user_fidelity"]["ok"] is False  # nothing lost: the record is kept
        assert "early_stop (judge): leaves before asking about the t-shirts" in quarantined["task tau2-retail-2"].error
        counts = ds.manifest()["counts"]
        assert counts["user_fidelity:checked"] == 3 and counts["user_fidelity:broken"] == 2
        assert counts["user_fidelity:invented"] == 1 and counts["user_fidelity:early_stop"] == 1

        marked = tmp_path / "mark"
        asyncio.run(generate(load_config(_config(tmp_path, server, "mark")), marked))
    records = {t.provenance.task_id: t for t in Dataset.open(marked).iter_records()}
    assert {k: r.details["user_fidelity"]["ok"] for k, r in records.items()} == {
        "tau2-retail-0": True, "tau2-retail-1": False, "tau2-retail-2": False}

    # The same check as a filter over a stored dataset (rules only here: no llm given).
    run_filter(str(marked), [{"name": "user_fidelity"}], str(tmp_path / "filtered"))
    filtered = Dataset.open(tmp_path / "filtered")
    assert sorted(t.provenance.task_id for t in filtered.iter_records()) == ["tau2-retail-0", "tau2-retail-2"]
    (dropped,) = list(filtered.iter_records("filtered"))
    assert dropped.decision.reason == "broken user: invented" and dropped.record.provenance.task_id == "tau2-retail-1"
    # Exported as it is, the marked dataset trains on none of its spoiled episodes: each format leaves them out
    # with the reason (tau2-retail-0 is also a failed episode of the scripted agent in some formats: count ids).
    for fmt in ("trl-sft", "trl-kto", "openai"):
        export = subprocess.run([sys.executable, "-m", "flows.cli", "export", str(marked), "--format", fmt,
                                 "--output", str(tmp_path / f"export-{fmt}"), "--include-failed"], cwd=REPO,
                                env={**os.environ, "COLUMNS": "300"}, capture_output=True, text=True, timeout=180)
        assert export.returncode == 0, export.stdout + export.stderr
        card = json.loads((tmp_path / f"export-{fmt}" / "card.json").read_text())
        assert card["counts"]["skipped"].get("the simulated user broke the episode (details.user_fidelity)") == 2, card
