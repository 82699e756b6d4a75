"""self_challenging end to end against the fake OpenAI-compatible server, verifiers run in the sandbox."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading

import pytest

from backends.fake_server import FakeServer, Rule, ToolCallAnswer
from envs.base import Environment, Evaluation, StepResult, Task
from envs.registry import register_env
from envs.toolspec import obj
from generators.runner import generate, load_config
from schemas.models import TextObservation, Tool
from schemas.store import Dataset

ORDER = "#W3907450"  # a pending order of Diego Johansson in world 0
SECRET = "hunter2-sc-secret"

STRICT = f'''
def verify(state):
    order = next(o for o in state["orders"] if o["order_id"] == "{ORDER}")
    return order["status"] == "cancelled" and order["cancel_reason"] == "no longer needed"
'''
LOOSE = f'''
def verify(state):
    return any(o["order_id"] == "{ORDER}" and o["status"] == "cancelled" for o in state["orders"])
'''
WRONG = STRICT.replace('"no longer needed"', '"ordered by mistake"')
LOOP = "def verify(state):\n    while True:\n        pass\n"
SOCKET = '''
import socket
def verify(state):
    socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(b"leak")
    return True
'''
ENVIRON = '''
import os
def verify(state):
    raise RuntimeError("leak=" + os.environ.get("TRAJFORGE_SC_SECRET", "absent"))
'''


def _call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


CANCEL = _call("cancel_pending_order", order_id=ORDER, reason="no longer needed")
CANCEL_MISTAKE = _call("cancel_pending_order", order_id=ORDER, reason="ordered by mistake")
LOOK = _call("get_order_details", order_id=ORDER)
INSTRUCTION = f"Please cancel my pending order {ORDER} because I no longer need it."


def _challenge(verifier: str, failure_cases=None) -> dict:
    return {"instruction": INSTRUCTION, "verifier": verifier, "solution": [CANCEL],
            "failure_cases": failure_cases if failure_cases is not None else [[], [CANCEL_MISTAKE], [LOOK]]}


class Listener:
    """A local TCP server that records every connection (there must be none)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


def _script(port: int):
    challenges = {
        1: _challenge(STRICT),  # valid
        2: _challenge(WRONG),  # the solution does not satisfy its own verifier
        3: _challenge(LOOSE),  # failure case 2 (the other cancel reason) passes too
        4: _challenge(LOOP),  # the verifier never returns
        5: _challenge(SOCKET.format(port=port)),  # the verifier phones home
        6: _challenge(ENVIRON),  # the verifier reads a secret from the environment
        7: {**_challenge(STRICT), "failure_cases": [[], [LOOK]]},  # malformed: two failure cases, every time
    }

    def answer(body: dict):
        first = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if first.startswith("EXPLORE FOR CHALLENGE"):  # one lookup, then a note
            if any(m["role"] == "tool" for m in body["messages"]):
                return "The order is pending."
            return ToolCallAnswer(LOOK["name"], LOOK["arguments"])
        if first.startswith("WRITE CHALLENGE"):
            return challenges[int(re.search(r"#(\d+)", first).group(1))]
        if body.get("tools"):
            attempt2 = body.get("seed") == 1  # draw 1 of the agent (sampling seed 0 + 1), under the same prompt
            if not any(m["role"] == "tool" for m in body["messages"]):
                call = CANCEL_MISTAKE if attempt2 else CANCEL
                return ToolCallAnswer(call["name"], call["arguments"])
            return "Your order has been cancelled successfully."
        return None

    return answer


def test_self_challenging_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAJFORGE_SC_SECRET", SECRET)
    listener = Listener()
    try:
        with FakeServer(rules=[Rule(fn=_script(listener.port))]) as server:
            cfg = load_config({
                "method": "self_challenging", "env": "retail", "challenges": 7, "rollouts": 2, "max_steps": 5,
                "concurrency": 2, "unit_tasks": 2,
                "sandbox": {"timeout_s": 2, "cpu_s": 10, "memory_mb": 256},
                # The static policy would refuse the socket / os verifiers before they run; off here so
                # the sandbox itself is exercised (tests/reliability covers the policy).
                "verifier_lint": False,
                # Every challenge here asks the same thing with another verifier; dedup is tested below.
                "dedup_threshold": None,
                "llm": {"backend": "openai", "base_url": server.base_url, "model": "fake-model",
                        "api_key_env": "TRAJFORGE_TEST_KEY", "max_retries": 1, "backoff_base_s": 0.01,
                        "request_timeout_s": 5},
            })
            out = tmp_path / "out"
            summary = asyncio.run(generate(cfg, out))
            challenge_prompts = [m for m in server.asked() if m.startswith("WRITE CHALLENGE")]
    finally:
        listener.close()
    assert listener.accepted == 0, "a verifier reached the network"
    assert summary.tasks == 7 and summary.processed == 7
    # The exploratory call ran in the environment and its result was shown back.
    assert challenge_prompts and all(f'RESULT {{"order_id": "{ORDER}"' in p and '"status": "pending"' in p
                                     for p in challenge_prompts)

    ds = Dataset.open(out)
    reasons = {f.record.provenance.task_id.rsplit("-s0-", 1)[1]: f.decision.reason for f in ds.iter_records("filtered")
               if f.decision.filter == "challenge_check"}
    assert reasons["challenge-0001"] == "solution fails verifier: verify returned False"
    assert reasons["challenge-0002"] == "failure case 2 passes verifier"
    assert reasons["challenge-0003"].startswith("sandbox: timeout")
    assert reasons["challenge-0004"].startswith("sandbox: forbidden") and "network" in reasons["challenge-0004"]
    assert reasons["challenge-0005"].startswith("verifier crashed") and "leak=absent" in reasons["challenge-0005"]
    assert len(reasons) == 5
    (bad,) = ds.iter_records("quarantine")
    assert bad.stage == "challenger" and "challenge-0006" in bad.location
    # Every check's verdict carries its reason.
    loose = next(f.record for f in ds.iter_records("filtered") if f.record.id.endswith("challenge-0002"))
    assert [(c["case"], c["reason"]) for c in loose.details["checks"]] == [
        ("solution", "verify returned True"), ("failure 1", "verify returned False"), ("failure 2", "verify returned True")]
    counted = {k: v for k, v in summary.reasons.items() if k.startswith("challenge_check")}
    assert counted["challenge_check: solution fails verifier"] == 1
    assert counted["challenge_check: failure case 2 passes verifier"] == 1
    assert sum(counted.values()) == 5
    dumped = json.dumps([f.model_dump(mode="json") for f in ds.iter_records("filtered")])
    assert SECRET not in dumped

    # The valid challenge was kept and rolled out twice; rewards come from its verifier.
    kept = sorted(ds.iter_records(), key=lambda t: t.id)
    assert [t.id.rsplit("#", 1)[1] for t in kept] == ["0", "1"]
    assert [t.reward for t in kept] == [1.0, 0.0] and [t.success for t in kept] == [True, False]
    first = kept[0]
    assert first.details["challenge"]["verifier"] == STRICT and first.details["challenge"]["solution"] == [CANCEL]
    assert len(first.details["challenge"]["failure_cases"]) == 3 and first.details["verifier"]["passed"] is True
    assert first.steps[0].name == "system" and first.steps[1].content == INSTRUCTION
    assert first.steps[2].function == "cancel_pending_order"
    assert first.provenance.method == "self_challenging" and first.provenance.task_id == "retail-s0-challenge-0000"
    # The task is replayable: the solution is its reference actions, beside the verifier.
    assert first.details["task"]["goal"]["actions"] == [CANCEL] and first.details["evaluation"]["reason"] == "verify returned True"
    assert first.provenance.prompt_template_hash and first.provenance.parent_ids
    assert summary.counts["rollout_pass"] == 1 and summary.counts["rollout_fail"] == 1

    # Kept tasks are re-usable from a side file.
    rows = [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["retail-s0-challenge-0000"]
    assert rows[0]["instruction"] == INSTRUCTION and rows[0]["verifier"] == STRICT and rows[0]["env_config"] == {}
    assert rows[0]["state"] == "env" and rows[0]["exploration"] == [LOOK]
    assert not list(out.glob(".tasks-*"))


def test_without_bubblewrap_the_cli_refuses_before_any_model_call_unless_unsafe(tmp_path, monkeypatch):
    """Generated code never runs outside the OS sandbox by default: one line says how to install it;
    `--unsafe-no-sandbox` runs anyway, with a warning, and the inner walls still contain the code."""
    import yaml
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.setenv("TRAJFORGE_BWRAP", str(tmp_path / "no-bwrap"))
    listener = Listener()
    try:
        with FakeServer(rules=[Rule(fn=_script(listener.port))]) as server:
            config = tmp_path / "sc.yaml"
            config.write_text(yaml.safe_dump({
                "challenges": 2, "rollouts": 1, "max_steps": 3, "verifier_lint": False,
                "sandbox": {"timeout_s": 2, "cpu_s": 10, "memory_mb": 256},
                "llm": {"backend": "openai", "base_url": server.base_url, "model": "fake-model", "api_key_env": None,
                        "max_retries": 0, "request_timeout_s": 5}}))
            args = ["generate", "--method", "self_challenging", "--config", str(config)]
            refused = CliRunner().invoke(app, [*args, "--output", str(tmp_path / "refused")])
            calls_when_refused = len(server.asked())
            unsafe = CliRunner().invoke(app, [*args, "--output", str(tmp_path / "unsafe"), "--unsafe-no-sandbox"])
    finally:
        listener.close()
    assert refused.exit_code == 1 and "Traceback" not in refused.output, refused.output
    (line,) = [ln for ln in refused.output.splitlines() if ln.startswith("error:")]
    assert "bubblewrap" in line and "apt-get install bubblewrap" in line and "--unsafe-no-sandbox" in line
    assert calls_when_refused == 0
    assert unsafe.exit_code == 0, unsafe.output
    assert "warning: UNSAFE" in unsafe.output and "WITHOUT the OS sandbox" in unsafe.output
    assert listener.accepted == 0
    reasons = {f.record.provenance.task_id: f.decision.reason for f in Dataset.open(tmp_path / "unsafe").iter_records("filtered")}
    assert reasons["retail-s0-challenge-0001"] == "solution fails verifier: verify returned False"  # verifiers really ran


# ---- a world without state(): the verifier reads declared read-only calls ------------------------------


class NotesEnv(Environment):
    """Notes behind tools and nothing else: no state(), no snapshots (as an MCP server)."""

    name = "notes"
    evaluation = "none"

    def __init__(self, max_steps: int = 10, user=None, policy: str | None = None) -> None:
        super().__init__(max_steps=max_steps, user=user, policy=policy)
        self.notes: dict[str, str] = {}
        self.tickets = 0

    def tools(self) -> list[Tool]:
        key = {"key": {"type": "string"}}
        return [Tool(name="get_note", description="Read a note.", parameters=obj(key)),
                Tool(name="set_note", description="Write a note.", parameters=obj({**key, "value": {"type": "string"}})),
                Tool(name="get_ticket", description="A fresh ticket number.", parameters=obj({}))]

    async def _reset(self, task: Task) -> None:
        self.notes, self.tickets = {"greeting": "hello"}, 0

    async def _act(self, action) -> StepResult:
        if action.kind == "message":
            return StepResult(TextObservation(content="bye", source="environment"), done=True)
        ids = {"name": action.function, "tool_call_id": action.tool_call_id}
        if action.function == "get_note":
            text = json.dumps({"key": action.arguments["key"], "value": self.notes.get(action.arguments["key"])})
        elif action.function == "set_note":
            self.notes[action.arguments["key"]] = action.arguments["value"]
            text = "ok"
        else:
            self.tickets += 1  # looks like a read, changes the world
            text = json.dumps({"ticket": self.tickets})
        return StepResult(TextObservation(content=text, source="environment", **ids))

    async def _evaluate(self, task, history) -> Evaluation:
        return Evaluation(0.0, False, "no goal of its own")


register_env("notes", NotesEnv, replace=True)

NOTE_TASK = "Set my note 'farewell' to 'bye'."
SET_BYE = _call("set_note", key="farewell", value="bye")
READ_FAREWELL = _call("get_note", key="farewell")
NOTE_VERIFIER = 'def verify(state):\n    return state[0]["value"] == "bye"\n'
EXPLORE_CALLS = [_call("get_note", key="greeting"), _call("get_note", key="farewell"), _call("get_ticket")]


def _notes_script(explore_bodies: list):
    note = {"instruction": NOTE_TASK, "state_calls": [READ_FAREWELL], "verifier": NOTE_VERIFIER, "solution": [SET_BYE],
            "failure_cases": [[], [_call("set_note", key="farewell", value="hi")],
                              [_call("set_note", key="greeting", value="bye")]]}
    challenges = {
        1: note,
        2: {**note, "instruction": "set my note 'farewell' to 'bye'!"},  # the same task, written again
        3: {**note, "instruction": "Set my note 'todo' to 'bye'.", "state_calls": [_call("get_ticket")],
            "verifier": "def verify(state):\n    return True\n"},  # its 'read' changes the world
    }

    def answer(body: dict):
        first = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if first.startswith("EXPLORE FOR CHALLENGE"):
            explore_bodies.append(body)
            done = sum(1 for m in body["messages"] if m["role"] == "tool")
            call = EXPLORE_CALLS[done]  # a fourth would fail the test: the budget is 3 calls
            return ToolCallAnswer(call["name"], call["arguments"])
        if first.startswith("WRITE CHALLENGE"):
            return challenges[int(re.search(r"#(\d+)", first).group(1))]
        if not any(m["role"] == "tool" for m in body["messages"]):
            return ToolCallAnswer(SET_BYE["name"], SET_BYE["arguments"])
        return "Your note is set."

    return answer


def test_challenger_explores_then_tasks_are_checked_through_read_only_calls_and_deduped(tmp_path):
    explore_bodies: list = []
    with FakeServer(rules=[Rule(fn=_notes_script(explore_bodies))]) as server:
        llm = {"backend": "openai", "base_url": server.base_url, "model": "fake-model", "api_key_env": None,
               "max_retries": 0, "request_timeout_s": 5}
        with pytest.raises(ValueError, match="needs a state a verifier can read"):
            load_config({"method": "self_challenging", "env": "notes", "state": "env", "llm": llm})
        cfg = load_config({"method": "self_challenging", "env": "notes", "challenges": 3, "explore_steps": 3,
                           "rollouts": 1, "max_steps": 4, "concurrency": 1, "unit_tasks": 1, "llm": llm})
        summary = asyncio.run(generate(cfg, tmp_path / "out"))
        written = [m for m in server.asked() if m.startswith("WRITE CHALLENGE")]

    # The challenger explored over three turns, each prompt showing the results before it.
    first_challenge = explore_bodies[:3]
    assert [sum(m["role"] == "tool" for m in b["messages"]) for b in first_challenge] == [0, 1, 2]
    second = first_challenge[1]["messages"]
    assert [m for m in second if m["role"] == "tool"][0]["content"] == '{"key": "greeting", "value": "hello"}'
    assert len(explore_bodies) == 9 and summary.counts["exploration_calls"] == 9
    assert 'RESULT {"key": "greeting", "value": "hello"}' in written[0] and 'RESULT {"ticket": 1}' in written[0]
    assert "state calls" in written[0]

    ds = Dataset.open(tmp_path / "out")
    decisions = {f.record.id.rsplit("-", 1)[1]: (f.decision.filter, f.decision.reason) for f in ds.iter_records("filtered")}
    assert decisions["0001"] == ("dedup", "near-duplicate task: of notes-s0-challenge-0000 (similarity 1.0)")
    assert decisions["0002"] == ("challenge_check", "state calls are not read-only: a second read gave different "
                                                    "results (after the solution)")
    assert summary.counts["challenges_duplicate"] == 1 and summary.counts["challenges_kept"] == 1
    assert summary.reasons["dedup: near-duplicate task"] == 1

    # The kept task was rolled out; the verifier read the note back through get_note after the episode.
    (rollout,) = ds.iter_records()
    assert rollout.reward == 1.0 and rollout.details["verifier"] == {"passed": True, "error": None, "value": "True",
                                                                     "reason": "verify returned True"}
    assert rollout.details["challenge"]["state_calls"] == [READ_FAREWELL]
    assert [s.function for s in rollout.steps if s.kind == "api"] == ["set_note"]  # state reads are not in the record
    rows = [json.loads(line) for line in (tmp_path / "out" / "tasks.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["notes-s0-challenge-0000"] and rows[0]["state"] == "calls"


def test_the_challenger_writes_tasks_under_the_worlds_policy(tmp_path):
    """The agent that attempts a task follows the world's policy (tau2's retail rules): the challenger explores and
    writes under the same policy, so it does not ask for call sequences the policy forbids."""
    policy = "Never change a note without reading it first; the note 'greeting' is read-only."
    explore_bodies: list = []
    with FakeServer(rules=[Rule(fn=_notes_script(explore_bodies))]) as server:
        llm = {"backend": "openai", "base_url": server.base_url, "model": "fake-model", "api_key_env": None,
               "max_retries": 0, "request_timeout_s": 5}
        cfg = load_config({"method": "self_challenging", "env": "notes", "env_config": {"policy": policy},
                           "challenges": 1, "explore_steps": 1, "rollouts": 1, "max_steps": 4, "concurrency": 1,
                           "llm": llm})
        asyncio.run(generate(cfg, tmp_path / "out"))
        bodies = [e["body"] for e in server.log if "body" in e]
    written = [b for b in bodies if b["messages"][-1]["content"].startswith("WRITE CHALLENGE")]
    assert explore_bodies and written
    for body in [explore_bodies[0], *written]:
        system = body["messages"][0]["content"]
        assert policy in system and "Only ask for what it allows" in system
    # The executor's rollout is under the same policy.
    rollout = next(b for b in bodies if b.get("tools") and NOTE_TASK in json.dumps(b["messages"]))
    assert policy in rollout["messages"][0]["content"]


class StrictNotesEnv(NotesEnv):
    """Notes whose reads refuse a missing note (as a filesystem server's read_file of a file never written)."""

    name = "strict_notes"

    async def _act(self, action) -> StepResult:
        if action.kind == "api" and action.function == "get_note" and action.arguments["key"] not in self.notes:
            from envs.base import refused

            return refused(action, f"no note {action.arguments['key']!r}")
        return await super()._act(action)


register_env("strict_notes", StrictNotesEnv, replace=True)


def test_a_failure_case_whose_state_call_fails_is_not_done_and_attempts_carry_no_marker(tmp_path):
    """Failure case 1 writes nothing, so reading the note it should have written fails: the task is not done there
    (not a broken challenge). Attempts after the first are the agent's own draws under the very same prompt."""
    with FakeServer(rules=[Rule(fn=_notes_script([]))]) as server:
        llm = {"backend": "openai", "base_url": server.base_url, "model": "fake-model", "api_key_env": None,
               "max_retries": 0, "request_timeout_s": 5}
        cfg = load_config({"method": "self_challenging", "env": "strict_notes", "challenges": 1, "explore_steps": 0,
                           "rollouts": 2, "max_steps": 4, "concurrency": 1, "llm": llm})
        summary = asyncio.run(generate(cfg, tmp_path / "out"))
        attempts = [e["body"] for e in server.log if "body" in e and e["body"].get("tools")
                    and not any(m["role"] == "tool" for m in e["body"]["messages"])]
    assert summary.counts["challenges_kept"] == 1, list(Dataset.open(tmp_path / "out").iter_records("filtered"))
    rollouts = sorted(Dataset.open(tmp_path / "out").iter_records(), key=lambda t: t.id)
    [kept] = [json.loads(line) for line in (tmp_path / "out" / "tasks.jsonl").read_text().splitlines()]
    assert kept["id"] == "strict_notes-s0-challenge-0000"
    assert len(rollouts) == 2 and all(t.reward == 1.0 for t in rollouts)
    # No attempt marker in any recorded (trained) prompt: both rollouts open with the same system step.
    assert rollouts[0].steps[0] == rollouts[1].steps[0]
    assert not any("(Attempt" in json.dumps(t.model_dump(mode="json")) for t in rollouts)
    assert [b.get("seed") for b in attempts] == [0, 1]
    assert attempts[0]["messages"] == attempts[1]["messages"]


def test_failure_case_state_call_failures_are_recorded_as_not_done(tmp_path):
    from generators.self_challenging import SelfChallenging, SelfChallengingConfig, StateCallChallenge

    method = SelfChallenging(SelfChallengingConfig(env="strict_notes"), None)
    asyncio.run(method.setup())
    challenge = StateCallChallenge.model_validate(
        {"instruction": NOTE_TASK, "state_calls": [READ_FAREWELL], "verifier": NOTE_VERIFIER, "solution": [SET_BYE],
         "failure_cases": [[], [_call("set_note", key="farewell", value="hi")],
                           [_call("set_note", key="greeting", value="bye")]]})
    task = method._task("c", NOTE_TASK, challenge)
    reason, checks, _ = asyncio.run(method._validate(challenge, task))
    assert reason is None
    assert [(c["case"], c["passed"]) for c in checks] == [("solution", True), ("failure 1", False), ("failure 2", False),
                                                          ("failure 3", False)]
    assert checks[1]["error"] == "not done: state call 1 (get_note) failed: no note 'farewell'"
    assert checks[3]["error"].startswith("not done: state call 1")
