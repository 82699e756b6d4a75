"""step_verify: LLM judge + rules label mcts_splice output; the judge measured against replay labels and
reference actions; KTO export; the CLI."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import yaml
from typer.testing import CliRunner

from backends.fake_server import FakeServer, Rule, ToolCallAnswer
from backends.types import ChatRequest
from converters.export import ExportConfig, export
from envs.base import Task
from filters.step_judge import agreement
from generators.mcts_splice import MCTSSplice, MCTSSpliceConfig
from generators.step_verify import StepVerify, StepVerifyConfig
from generators.scripted import ScriptedRetailLLM, cancel_tasks
from schemas.models import ApiAction, MessageAction, TextObservation, Tool, Trajectory
from schemas.store import Dataset


def make_search_output(path: Path, llm: ScriptedRetailLLM, **cfg) -> Path:
    method = MCTSSplice(MCTSSpliceConfig(tasks={"n": 1}, **cfg), llm)
    asyncio.run(method.run(method.tasks(), Dataset.create(path, stage="generate:mcts_splice")))
    return path


def make_verified_output(root: Path, llm: ScriptedRetailLLM, **search) -> tuple[Path, Path, dict]:
    src = make_search_output(root / "search", llm, **search)
    method = StepVerify(StepVerifyConfig(input=str(src), verifier="both"), llm)
    out = Dataset.create(root / "verified", stage="generate:step_verify")
    summary = asyncio.run(method.run(method.tasks(), out))
    return src, root / "verified", summary.counts


def test_labels_reasons_and_agreement(tmp_path):
    llm = ScriptedRetailLLM(cancel_tasks(1))
    src, out, counts = make_verified_output(tmp_path, llm, search={"iterations": 2})
    before = {t.id: t for t in Dataset.open(src).iter_records()}
    after = {t.id: t for t in Dataset.open(out).iter_records()}
    assert set(after) == set(before)  # same ids, a new dataset
    # The first spliced trajectory in the search's (deterministic) order: the labelled output's order
    # follows task completion, which the rule replays in worker threads make timing-dependent.
    spliced = after[next(i for i, t in before.items() if t.details["role"] == "spliced")]
    labels = [(i, s.label) for i, s in enumerate(spliced.steps) if s.kind in ("api", "message")]
    # [2] the wrong cancel (masked) is bad, the revision [4] stays unlabeled, the rest is good.
    assert labels[0] == (2, "bad") and labels[1] == (4, "unknown")
    assert all(lab == "good" for _, lab in labels[2:])
    # Ground truth (the replay) wins over the judge: its label is written, the judge's is kept beside it.
    assert spliced.steps[2].extra["judge_reason"] and spliced.steps[2].extra["judge"] == "replay"
    assert spliced.steps[2].extra["llm_label"] == "bad" and "rule_label" not in spliced.steps[2].extra
    # They disagree only where the scripted judge calls a reference call good although it errs
    # (the correct cancel after the wrong one): the rules see the error.
    # The retail rules replay the world: they are ground truth ("replay") to measure the judge against.
    cells = {f"{a}_{b}": counts[f"judge_replay_{a}_{b}"] for a in ("good", "bad") for b in ("good", "bad")}
    assert cells["bad_good"] == 0 and cells["good_bad"] > 0 and cells["bad_bad"] > 0
    stats = agreement(cells)
    assert 0.8 < stats["accuracy"] < 1.0 and stats["kappa"] > 0.5
    assert stats["bad_precision"] == 1.0 and 0 < stats["bad_recall"] < 1.0
    assert Dataset.open(out).manifest()["step_verify"] == {"replay": stats, "ground_truth": stats}
    assert spliced.details["step_verify"] == {"reference": "replay", "ground_truth": True, "compared": 5,
                                              "accuracy": 1.0, "kappa": 1.0, "bad_precision": 1.0, "bad_recall": 1.0,
                                              "label_sources": {"llm": 3, "replay": 2}}
    # The replay settles the outcomes (the wrong cancel, the right one); the reads and the final message that merely
    # succeeded take the judge's label.
    assert [spliced.steps[i].extra["judge"] for i, _ in labels if i != 4] == ["replay", "llm", "llm", "replay", "llm"]


def test_kappa_math():
    assert agreement({"good_good": 5, "bad_bad": 5})["kappa"] == 1.0
    assert agreement({"good_good": 3, "good_bad": 1, "bad_good": 1, "bad_bad": 3}) == {
        "compared": 8, "accuracy": 0.75, "kappa": 0.5, "bad_precision": 0.75, "bad_recall": 0.75}
    # The judge calls 1 of 4 steps bad, rightly; it misses 2 bad steps: precision 1, recall 1/3.
    assert agreement({"good_good": 1, "good_bad": 2, "bad_bad": 1}) == {
        "compared": 4, "accuracy": 0.5, "kappa": 0.2, "bad_precision": 1.0, "bad_recall": 0.3333}
    assert agreement({"good_good": 2})["bad_precision"] is None


def test_kto_export_uses_step_labels(tmp_path):
    llm = ScriptedRetailLLM(cancel_tasks(1))
    _, out, _ = make_verified_output(tmp_path, llm, search={"iterations": 2})
    export(out, tmp_path / "kto", ExportConfig(format="trl-kto"))
    import pyarrow.parquet as pq

    rows = pq.read_table(sorted((tmp_path / "kto" / "data").glob("*.parquet"))).to_pylist()
    assert {r["label"] for r in rows} == {True, False}
    # Masked (train = false) steps give no example: the bad cancel inside a spliced path is context only.
    masked = {t.id: t.details["splice"]["masked"] for t in Dataset.open(out).iter_records() if "splice" in t.details}
    assert masked and all(r["step"] not in masked.get(r["id"], []) for r in rows)
    assert any(r["id"] in masked for r in rows)


# ---- the CLI, against the fake OpenAI-compatible server ------------------------------------------------


def _server_rule(llm: ScriptedRetailLLM):
    counter = {"agent": 0}

    def answer(body: dict):
        request = ChatRequest(body["messages"], {}, response_format=body.get("response_format"))
        if body.get("response_format"):
            return llm._judge(request)
        counter["agent"] += 1
        # All n samples of a server answer are alike: vary by request instead. The 2nd request (the first
        # rollout step) is the wrong write, so the first path fails and the next expansion succeeds.
        call = llm._agent(request, 1 if counter["agent"] == 2 else 0)
        if isinstance(call, str):
            return call
        return ToolCallAnswer(call.name, orjson.loads(call.arguments))

    return answer


def test_cli_runs_mcts_splice_then_step_verify(tmp_path):
    from flows.cli import app

    llm = ScriptedRetailLLM(cancel_tasks(1))
    with FakeServer(rules=[Rule(fn=_server_rule(llm))]) as server:
        common = {"concurrency": 1, "llm": {"backend": "openai", "base_url": server.base_url, "model": "fake",
                                             "api_key_env": "TRAJFORGE_TEST_KEY", "max_retries": 1,
                                             "request_timeout_s": 10}}
        (tmp_path / "mcts.yaml").write_text(yaml.safe_dump({**common, "tasks": {"n": 1}, "search": {"iterations": 3}}))
        run = CliRunner().invoke(app, ["generate", "--method", "mcts_splice", "--config", str(tmp_path / "mcts.yaml"),
                                       "--output", str(tmp_path / "search")])
        assert run.exit_code == 0, run.output
        (tmp_path / "verify.yaml").write_text(yaml.safe_dump({**common, "input": str(tmp_path / "search")}))
        run = CliRunner().invoke(app, ["generate", "--method", "step_verify", "--config", str(tmp_path / "verify.yaml"),
                                       "--output", str(tmp_path / "verified")])
        assert run.exit_code == 0, run.output
    # The judge's agreement with the retail replay labels is printed with the run's summary.
    stats = Dataset.open(tmp_path / "verified").manifest()["step_verify"]["replay"]
    printed = " ".join(run.output.replace("│", " ").split())
    assert f"judge vs replay labels compared {stats['compared']}, accuracy {stats['accuracy']}, kappa {stats['kappa']}" in printed
    search = Dataset.open(tmp_path / "search")
    verified = list(Dataset.open(tmp_path / "verified").iter_records())
    assert search.complete and search.count() > 0 and len(verified) == search.count()
    assert search.count("pairs") == 2  # one trajectory-level and one step-level pair
    assert sum(1 for t in verified if t.details["role"] == "spliced") == 1
    assert any(s.label in ("good", "bad") for t in verified for s in t.steps)


# ---- tau2-style reference actions as ground truth, through the CLI --------------------------------------

REFS = [{"action_id": "0_0", "name": "get_order_details", "arguments": {"order_id": "#W1"}},
        {"action_id": "0_1", "name": "cancel_pending_order", "arguments": {"order_id": "#W1", "reason": "no longer needed"}}]


def _reference_trajectory() -> Trajectory:
    def call(i: int, name: str, answer: str, **arguments) -> list:
        return [ApiAction(function=name, arguments=arguments, tool_call_id=f"call_{i}"),
                TextObservation(content=answer, source="environment", name=name, tool_call_id=f"call_{i}")]

    task = Task(id="tau2-0", env="mcp", instruction="Cancel order #W1, I no longer need it.", goal={"actions": REFS})
    steps = [TextObservation(content=task.instruction, source="user"),
             *call(1, "get_user_details", '{"user_id": "u1"}', user_id="u1"),          # a read: good
             *call(3, "cancel_pending_order", "ok", order_id="#W1", reason="ordered by mistake"),  # wrong write: bad
             *call(5, "get_order_details", "Error: order #W9 not found", order_id="#W9"),  # an error: bad
             *call(7, "cancel_pending_order", "ok", order_id="#W1", reason="no longer needed"),  # reference: good
             MessageAction(content="Your order is cancelled.")]                         # no reference: unlabeled
    return Trajectory(id="mcp/tau2-0", source="rollout", steps=steps, details={"task": task.model_dump(mode="json")})


def _reference_judge(body: dict) -> dict:
    """A judge that catches the wrong write but not the failed lookup."""
    step = body["messages"][-1]["content"].split("The step:\n", 1)[1].split("\n\nAfter the step:", 1)[0]
    bad = "ordered by mistake" in step
    return {"label": "bad" if bad else "good", "reason": "wrong cancel reason" if bad else "looks right"}


def test_judge_is_measured_against_reference_actions_and_the_cli_prints_it(tmp_path):
    from flows.cli import app

    src = Dataset.create(tmp_path / "rollouts")
    with src.unit("u0") as unit:
        unit.write_many("trajectories", [_reference_trajectory()])
    with FakeServer(rules=[Rule(fn=_reference_judge)]) as server:
        llm = {"backend": "openai", "base_url": server.base_url, "api_key_env": None, "max_retries": 0}
        (tmp_path / "verify.yaml").write_text(yaml.safe_dump({
            "input": str(tmp_path / "rollouts"), "verifier": "llm",
            "llm": {**llm, "model": "agent-model"}, "judge": {"llm": {**llm, "model": "judge-model"}}}))
        run = CliRunner().invoke(app, ["generate", "--method", "step_verify", "--config", str(tmp_path / "verify.yaml"),
                                       "--output", str(tmp_path / "verified")], terminal_width=240)
        models = {e["body"]["model"] for e in server.log if "body" in e}
    assert run.exit_code == 0, run.output
    assert models == {"judge-model"}  # the grading model, configured apart from the acting one
    # Truth: good, bad (a write no reference action has), bad (an error), good (the reference write).
    # Judge: good, bad, good, good -> accuracy 3/4, its one "bad" is right (precision 1), it finds 1 of 2 (recall 0.5).
    stats = {"compared": 4, "accuracy": 0.75, "kappa": 0.5, "bad_precision": 1.0, "bad_recall": 0.5}
    assert Dataset.open(tmp_path / "verified").manifest()["step_verify"] == {"reference": stats, "ground_truth": stats}
    printed = " ".join(run.output.replace("│", " ").split())  # the summary table, its wrapped cells joined
    assert "judge vs reference actions compared 4, accuracy 0.75, kappa 0.5, bad precision 1.0, bad recall 0.5" in printed
    assert "judge LLM calls 5" in printed  # one per agent step
    (out,) = Dataset.open(tmp_path / "verified").iter_records()
    # Ground truth wins over the judge where it settles an outcome: the judge's label is written at [1] (a read
    # that succeeded) and [9], where the reference actions say nothing; its misses ([5]) stay beside the label.
    assert out.details["step_verify"] == {"reference": "reference", "ground_truth": True, **stats,
                                          "label_sources": {"llm": 2, "reference": 3}}
    labels = {i: (s.label, s.extra["judge"], s.extra.get("llm_label"), s.extra.get("truth_reason"))
              for i, s in enumerate(out.steps) if s.kind in ("api", "message")}
    # Ground truth settles outcomes only: the read that succeeded ([1]) takes the judge's label.
    assert labels == {
        1: ("good", "llm", None, "read-only call succeeded"),
        3: ("bad", "reference", "bad", "a write (cancel_pending_order) that matches no reference action"),
        5: ("bad", "reference", "good", "tool error: Error: order #W9 not found"),
        7: ("good", "reference", "good", "matches reference action 2 (cancel_pending_order)"),
        9: ("good", "llm", None, None)}
    assert out.steps[3].extra["llm_reason"] == "wrong cancel reason"
    assert out.steps[3].extra["judge_reason"] == "a write (cancel_pending_order) that matches no reference action"


def test_the_judge_gets_the_rules_the_agent_followed(tmp_path):
    """The judge's prompt names no domain of its own; it carries the agent's rules: the config's, else the
    trajectory's system turn, else the policy of the environment the trajectory recorded."""
    weather = {"name": "get_weather", "description": "Weather for a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    steps = [TextObservation(content="Weather in Paris?", source="user"),
             ApiAction(function="get_weather", arguments={"city": "Paris"}, tool_call_id="call_1"),
             TextObservation(content="sunny", source="environment", tool_call_id="call_1"),
             MessageAction(content="It is sunny.")]
    system = TextObservation(content="Answer in French.", source="environment", name="system")
    records = [
        Trajectory(id="own", source="test", steps=[system, *steps]),
        Trajectory(id="env", source="test", steps=steps,
                   details={"env": {"name": "simulated"}, "env_config": {"tools": [weather], "policy": "Cite the source."}}),
        Trajectory(id="plain", source="test", steps=steps),
    ]
    src = Dataset.create(tmp_path / "in")
    with src.unit("u0") as unit:
        unit.write_many("trajectories", records)
    prompts: dict[str, list[str]] = {}

    def judge(body: dict) -> dict:
        system_prompt, prompt = body["messages"][0]["content"], body["messages"][-1]["content"]
        assert "customer" not in system_prompt
        prompts.setdefault(prompt.split("Task:", 1)[0], []).append(prompt)
        return {"label": "good", "reason": "fine"}

    def run(out: str, **cfg) -> dict:
        with FakeServer(rules=[Rule(fn=judge)]) as server:
            llm = {"backend": "openai", "base_url": server.base_url, "api_key_env": None, "max_retries": 0}
            config = StepVerifyConfig(input=str(tmp_path / "in"), verifier="llm", llm=llm, **cfg)
            from backends.registry import make_llm

            model = make_llm(config.llm)
            try:
                method = StepVerify(config, model)
                return asyncio.run(method.run(method.tasks(), Dataset.create(tmp_path / out))).counts
            finally:
                asyncio.run(model.aclose())

    counts = run("a")
    assert (counts["policy_system"], counts["policy_env"], counts["policy_none"]) == (1, 1, 1)
    assert set(prompts) == {"Rules the agent must follow:\nAnswer in French.\n\n",
                            "Rules the agent must follow:\nCite the source.\n\n", ""}
    prompts.clear()
    counts = run("b", policy="Be brief.")
    assert counts["policy_config"] == 3 and set(prompts) == {"Rules the agent must follow:\nBe brief.\n\n"}


def test_the_judge_is_told_the_users_request_not_the_system_turn_as_the_task(tmp_path):
    """Converted data opens with its system turn as environment text (no `system` name) and simia_sft's records
    with their policy: the task the judge reads is the user's request after them."""
    steps = [TextObservation(content="Weather in Paris?", source="user"),
             ApiAction(function="get_weather", arguments={"city": "Paris"}, tool_call_id="call_1"),
             TextObservation(content="sunny", source="environment", tool_call_id="call_1"),
             MessageAction(content="It is sunny.")]
    records = [Trajectory(id="converted", source="test",
                          steps=[TextObservation(content="You are a weather assistant. Be polite.",
                                                 source="environment"), *steps]),
               Trajectory(id="simia", source="test",
                          steps=[TextObservation(content="Policy: answer truthfully.", source="environment",
                                                 name="system"), *steps])]
    src = Dataset.create(tmp_path / "in")
    with src.unit("u0") as unit:
        unit.write_many("trajectories", records)
    tasks: list[str] = []

    def judge(body: dict) -> dict:
        tasks.append(body["messages"][-1]["content"].split("Task:\n", 1)[1].split("\n\nBefore the step:", 1)[0])
        return {"label": "good", "reason": "fine"}

    with FakeServer(rules=[Rule(fn=judge)]) as server:
        llm = {"backend": "openai", "base_url": server.base_url, "api_key_env": None, "max_retries": 0}
        config = StepVerifyConfig(input=str(tmp_path / "in"), verifier="llm", llm=llm)
        from backends.registry import make_llm

        model = make_llm(config.llm)
        try:
            method = StepVerify(config, model)
            asyncio.run(method.run(method.tasks(), Dataset.create(tmp_path / "out")))
        finally:
            asyncio.run(model.aclose())
    assert tasks and set(tasks) == {"Weather in Paris?"}


def _verify(tmp_path: Path, records: list[Trajectory], judge, verifier: str = "llm") -> tuple[str, Dataset]:
    """step_verify through the CLI on `records`, the judge on the fake server."""
    from flows.cli import app

    src = Dataset.create(tmp_path / "in")
    with src.unit("u0") as unit:
        unit.write_many("trajectories", records)
    with FakeServer(rules=[Rule(fn=judge)]) as server:
        llm = {"backend": "openai", "base_url": server.base_url, "api_key_env": None, "max_retries": 0}
        (tmp_path / "verify.yaml").write_text(yaml.safe_dump({
            "input": str(tmp_path / "in"), "verifier": verifier, "llm": {**llm, "model": "agent-model"},
            "judge": {"llm": {**llm, "model": "judge-model", "structured_attempts": 1}}}))
        run = CliRunner().invoke(app, ["generate", "--method", "step_verify", "--config", str(tmp_path / "verify.yaml"),
                                       "--output", str(tmp_path / "out")], terminal_width=240)
    assert run.exit_code == 0, run.output
    return " ".join(run.output.replace("│", " ").split()), Dataset.open(tmp_path / "out")


def test_policy_breaks_are_bad_whatever_ground_truth_and_the_judge_say(tmp_path):
    """tau2 retail's rules (the record's domain): a private read before authentication and the reference write
    without a confirmed yes are labelled bad (KTO-undesirable rows) over a judge that calls every step good and a
    reference that the write matches; the lookup and the read after it take the judge's label."""
    def call(i: int, name: str, answer: str, **arguments) -> list:
        return [ApiAction(function=name, arguments=arguments, tool_call_id=f"call_{i}"),
                TextObservation(content=answer, source="environment", name=name, tool_call_id=f"call_{i}")]

    refs = [{"name": "find_user_id_by_email", "arguments": {"email": "a@b.com"}},
            {"name": "cancel_pending_order", "arguments": {"order_id": "#W1", "reason": "no longer needed"}}]
    scenario = {"instructions": {"domain": "retail", "reason_for_call": "Cancel order #W1.", "known_info": "a@b.com"}}
    task = Task(id="tau2-retail-0", env="mcp", instruction="Cancel order #W1.", goal={"actions": refs},
                metadata={"user_scenario": scenario})
    steps = [TextObservation(content="Cancel order #W1, I no longer need it. I am a@b.com.", source="user"),
             *call(1, "get_order_details", '{"order_id": "#W1"}', order_id="#W1"),    # before authentication
             *call(3, "find_user_id_by_email", "u1", email="a@b.com"),
             *call(5, "get_user_details", '{"user_id": "u1"}', user_id="u1"),
             *call(7, "cancel_pending_order", "ok", order_id="#W1", reason="no longer needed"),  # no yes asked
             MessageAction(content="Your order is cancelled.")]
    tools = [Tool(name=n) for n in ("get_order_details", "find_user_id_by_email", "get_user_details",
                                    "cancel_pending_order")]
    record = Trajectory(id="mcp/tau2-retail-0", source="rollout", steps=steps, tools=tools, details={
        "task": task.model_dump(mode="json"),
        "env_config": {"read_only_tools": ["get_order_details", "find_user_id_by_email", "get_user_details"]}})
    printed, out = _verify(tmp_path, [record], lambda body: {"label": "good", "reason": "looks right"})
    (t,) = out.iter_records()
    labels = {i: (s.label, s.extra["judge"]) for i, s in enumerate(t.steps) if s.kind in ("api", "message")}
    assert labels == {1: ("bad", "policy"), 3: ("good", "llm"), 5: ("good", "llm"), 7: ("bad", "policy"),
                      9: ("good", "llm")}
    assert t.steps[1].extra["judge_reason"].startswith("policy: acts before authentication")
    assert t.steps[7].extra["judge_reason"].startswith("policy: writes without a confirmation")
    assert t.steps[7].extra["llm_label"] == "good" and t.steps[7].extra["truth_label"] == "good"
    assert "step labels by source llm 3, policy 2" in printed
    export(out.path, tmp_path / "kto", ExportConfig(format="trl-kto"))
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "kto" / "data").to_pylist()
    undesirable = [r["completion"][0] for r in rows if not r["label"]]
    assert len(undesirable) == 2 and {c["tool_calls"][0]["function"]["name"] for c in undesirable} == {
        "get_order_details", "cancel_pending_order"}


def test_steps_the_judge_could_not_label_say_what_labelled_them_and_the_summary_counts_them(tmp_path):
    """A judge that never answers usably: every step says so and what labelled it instead (ground truth where it
    settles an outcome, else nothing); the record and the printed summary count them by source."""
    printed, out = _verify(tmp_path, [_reference_trajectory()], lambda body: "no verdict here")
    (t,) = out.iter_records()
    fallback = {i: s.extra["label_fallback"] for i, s in enumerate(t.steps) if s.kind in ("api", "message")}
    assert fallback == {1: "unlabeled", 3: "reference", 5: "reference", 7: "reference", 9: "unlabeled"}
    assert all("no usable answer from the judge" in t.steps[i].extra["judge_error"] for i in fallback)
    assert t.details["step_verify"]["judge_failed"] == 5 and t.details["step_verify"]["label_sources"] == {"reference": 3}
    assert ("step labels by source reference 3, judge failed, then reference 3, judge failed, then unlabeled 2, "
            "unlabeled 2") in printed
