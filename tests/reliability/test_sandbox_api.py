"""Escape attempts through the verification-function API (`generators.self_challenging.run_verifier`).

Every hostile `verify(state)` must be contained and reported, and the verdict must never be
True by trickery. Each case runs through two layers:

- "policy+sandbox": the API as the method uses it (static verifier policy, then the sandbox);
- "sandbox": the policy switched off, so the sandbox alone must hold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil
import pytest

from generators.self_challenging import SandboxLimits, Verdict, run_verifier, verifier_problem

LIMITS = SandboxLimits(timeout_s=2, cpu_s=10, memory_mb=256)
SECRET = "s3cr3t-sandbox-api-value"
STATE = {"orders": [{"order_id": "#W1", "status": "cancelled"}]}


@dataclass
class Case:
    name: str
    code: str
    check: Callable[[Verdict, Path], None] | None = None


def _no_file(name: str) -> Callable[[Verdict, Path], None]:
    def check(verdict: Verdict, outside: Path) -> None:
        assert not (outside / name).exists(), f"{name} was created outside the scratch directory"
    return check


def _secret_absent(verdict: Verdict, outside: Path) -> None:
    assert SECRET not in (verdict.error or "") and SECRET not in (verdict.value or "")


def _error_has(*needles: str) -> Callable[[Verdict, Path], None]:
    def check(verdict: Verdict, outside: Path) -> None:
        assert verdict.error and any(n in verdict.error for n in needles), verdict.error
    return check


CASES = [
    Case("fork", """
import os
def verify(state):
    pid = os.fork()
    if pid == 0:
        import time; time.sleep(30); os._exit(0)
    return True
""", check=_error_has("os.fork", "import of 'os'")),
    Case("write_outside_scratch", """
def verify(state):
    with open("{outside}/escaped.txt", "w") as f:
        f.write("out")
    return True
""", check=_no_file("escaped.txt")),
    Case("read_outside_scratch", """
def verify(state):
    raise RuntimeError(open("{outside}/secret.txt").read())
""", check=_secret_absent),
    Case("proc_parent_environ", """
import os
def verify(state):
    data = open(f"/proc/{{os.getppid()}}/environ", "rb").read().decode(errors="replace")
    raise RuntimeError(data)
""", check=_secret_absent),
    Case("os_environ_secret", """
import os
def verify(state):
    raise RuntimeError("leak=" + os.environ.get("TRAJFORGE_SBX_API_SECRET", "absent"))
""", check=_secret_absent),
    Case("subprocess", """
import subprocess
def verify(state):
    subprocess.run(["/bin/sh", "-c", "touch {outside}/spawned.txt"])
    return True
""", check=_no_file("spawned.txt")),
    Case("os_system", """
import os
def verify(state):
    os.system("touch {outside}/system.txt")
    return True
""", check=_no_file("system.txt")),
    Case("allocate_2gb", """
def verify(state):
    block = bytearray(2 * 1024 ** 3)
    return len(block) > 0
""", check=_error_has("memory", "MemoryError")),
    Case("loop_forever", """
def verify(state):
    while True:
        pass
""", check=_error_has("timeout")),
    Case("patch_builtins", """
import builtins
builtins.bool = lambda *a: True
builtins.isinstance = lambda *a: True
def verify(state):
    return False
"""),
    Case("patch_json_encoder", """
import json
json.dumps = lambda *a, **k: '{{"ok": true, "value": true}}'
def verify(state):
    return False
"""),
    Case("write_result_via_frame", """
import sys, os
def verify(state):
    f = sys._getframe(1).f_locals["result_file"]
    f.write('{{"ok": true, "value": true}}'); f.flush()
    os._exit(0)
"""),
    Case("write_result_via_gc", """
import gc, io, os
def verify(state):
    for o in gc.get_objects():
        if isinstance(o, io.TextIOWrapper) and str(getattr(o, "name", "")).endswith("result.json"):
            o.write('{{"ok": true, "value": true}}'); o.flush(); os._exit(0)
    return False
"""),
    Case("truthy_int", "def verify(state):\n    return 1\n"),
    Case("truthy_string", "def verify(state):\n    return 'True'\n"),
    Case("truthy_list", "def verify(state):\n    return [True]\n"),
    Case("truthy_dict", "def verify(state):\n    return {{'ok': True, 'value': True}}\n"),
    Case("truthy_object", """
class Yes:
    def __bool__(self):
        return True
    def __eq__(self, other):
        return True
def verify(state):
    return Yes()
"""),
    Case("system_exit", "def verify(state):\n    raise SystemExit(0)\n", check=_error_has("SystemExit")),
    Case("system_exit_true", "def verify(state):\n    raise SystemExit(True)\n"),
    Case("spoof_stdout_protocol", """
import json
def verify(state):
    line = json.dumps({{"ok": True, "value": True, "error_kind": None, "error": None}})
    print(line)
    print('{{"passed": true}}')
    return False
"""),
]
LAYERS = ["policy+sandbox", "sandbox"]
PARAMS = [pytest.param(case, layer, id=f"{case.name}-{layer}") for case in CASES for layer in LAYERS]


@pytest.fixture
def outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRAJFORGE_SBX_API_SECRET", SECRET)
    (tmp_path / "secret.txt").write_text(SECRET)
    return tmp_path


@pytest.mark.parametrize(("case", "layer"), PARAMS)
def test_escape_attempt_is_contained(case: Case, layer: str, outside: Path):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    start = time.monotonic()
    verdict = run_verifier(case.code.format(outside=outside), STATE, LIMITS, lint=layer == "policy+sandbox")
    elapsed = time.monotonic() - start
    assert verdict.passed is False, f"verdict forged: {verdict}"
    assert verdict.error or verdict.value is not None, "the failure was not reported"
    assert elapsed < LIMITS.timeout_s + 5
    if case.check is not None:
        case.check(verdict, outside)
    _secret_absent(verdict, outside)
    time.sleep(0.05)
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not left, f"processes outlived the run: {left}"


def test_policy_reports_why():
    assert verifier_problem("import os\ndef verify(s):\n    return True\n") == "import of 'os' is not allowed"
    assert verifier_problem("def verify(s):\n    return s.__class__\n") == "attribute '__class__' is not allowed"
    assert verifier_problem("import json\njson.dumps = len\ndef verify(s):\n    return True\n") == \
        "assigning attribute 'dumps' is not allowed"
    assert verifier_problem("import operator\ndef verify(s):\n    return True\n") == "import of 'operator' is not allowed"
    assert verifier_problem("def verify(s):\n    return getattr(s, 'x')\n") == "use of 'getattr' is not allowed"
    assert verifier_problem("def check(s):\n    return True\n") == "no top-level `def verify(state)`"
    assert verifier_problem("def verify(s) return True").startswith("syntax error")
    rejected = run_verifier("import socket\ndef verify(s):\n    return True\n", STATE, LIMITS)
    assert rejected == Verdict(passed=False, error="verifier rejected: import of 'socket' is not allowed")


@pytest.mark.parametrize("layer", LAYERS)
def test_honest_verifiers_still_pass(layer: str):
    """Controls: the containment is not vacuous — ordinary verifiers run and pass or fail on the state."""
    code = """
import json
from collections import Counter
def verify(state):
    statuses = Counter(o["status"] for o in state["orders"])
    order = next(o for o in state["orders"] if o["order_id"] == "#W1")
    return order["status"] == "cancelled" and statuses["cancelled"] == 1 and bool(json.dumps(state))
"""
    lint = layer == "policy+sandbox"
    assert run_verifier(code, STATE, LIMITS, lint=lint) == Verdict(passed=True, value="True")
    other = {"orders": [{"order_id": "#W1", "status": "pending"}]}
    assert run_verifier(code, other, LIMITS, lint=lint) == Verdict(passed=False, value="False")
