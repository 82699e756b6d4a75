"""self_challenging end to end against the fake OpenAI-compatible server, verifiers run in the sandbox."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading

from backends.fake_server import FakeServer, Rule, ToolCallAnswer
from generators.runner import generate, load_config
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
        if first.startswith("EXPLORE FOR CHALLENGE"):
            return {"thoughts": "look at an order", "calls": [LOOK]}
        if first.startswith("WRITE CHALLENGE"):
            return challenges[int(re.search(r"#(\d+)", first).group(1))]
        if body.get("tools"):
            attempt2 = "(Attempt 2.)" in body["messages"][0]["content"]
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
    reasons = {f.record.provenance.task_id: f.decision.reason for f in ds.iter_records("filtered")
               if f.decision.filter == "challenge_check"}
    assert reasons["challenge-0001"] == "solution fails verifier: verify returned False"
    assert reasons["challenge-0002"] == "failure case 2 passes verifier"
    assert reasons["challenge-0003"].startswith("sandbox: timeout")
    assert reasons["challenge-0004"].startswith("sandbox: forbidden") and "network" in reasons["challenge-0004"]
    assert reasons["challenge-0005"].startswith("verifier crashed") and "leak=absent" in reasons["challenge-0005"]
    assert len(reasons) == 5
    (bad,) = ds.iter_records("quarantine")
    assert bad.stage == "challenger" and "challenge-0006" in bad.location
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
    assert first.steps[0].content == INSTRUCTION and first.steps[1].function == "cancel_pending_order"
    assert first.provenance.method == "self_challenging" and first.provenance.task_id == "challenge-0000"
    assert first.provenance.prompt_template_hash and first.provenance.parent_ids
    assert summary.counts["rollout_pass"] == 1 and summary.counts["rollout_fail"] == 1

    # Kept tasks are re-usable from a side file.
    rows = [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["retail-s0-challenge-0000"]
    assert rows[0]["instruction"] == INSTRUCTION and rows[0]["verifier"] == STRICT and rows[0]["env_config"] == {}
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
    assert reasons["challenge-0001"] == "solution fails verifier: verify returned False"  # verifiers really ran
