"""The code sandbox: ordinary code works; runaway, hostile or nosy code is contained and reported."""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest

from envs.sandbox import RUNNER, run_python, run_verifier


def _no_sandbox_processes_left() -> bool:
    me = psutil.Process()
    children = [c for c in me.children(recursive=True) if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    # Orphaned runners (re-parented to init) would be ours escaping; other sessions' live runners are not.
    strays = [p for p in psutil.process_iter(["cmdline", "ppid"])
              if str(RUNNER) in " ".join(p.info["cmdline"] or []) and p.info["ppid"] in (0, 1)]
    return not children and not strays


def test_ordinary_code_returns_values_and_output() -> None:
    r = run_python("import math\ndef f(a, b):\n    print('adding')\n    return {'sum': a + b, 'root': math.sqrt(b)}\n",
                   entry="f", args=[2, 9])
    assert r.ok and r.value == {"sum": 11, "root": 3.0} and r.stdout == "adding\n" and r.error_kind is None
    assert run_python("def f(x, y=1): return x * y", entry="f", args={"x": 3, "y": 4}).value == 12
    assert run_python("print('hi')").stdout == "hi\n"


def test_exceptions_and_bad_results_are_reported() -> None:
    r = run_python("def f(): raise ValueError('boom')", entry="f")
    assert not r.ok and r.error_kind == "exception" and "ValueError: boom" in r.error
    r = run_python("def f(): return object()", entry="f")
    assert r.error_kind == "exception" and "JSON-serializable" in r.error
    assert run_python("x = ", entry=None).error_kind == "exception"  # syntax error
    assert "not defined" in run_python("pass", entry="missing").error


def test_verifier_convenience() -> None:
    verifier = "def verify(state):\n    return state['balance'] == 10 and 'done' in state['log']\n"
    assert run_verifier(verifier, {"balance": 10, "log": ["done"]}).passed
    assert not run_verifier(verifier, {"balance": 9, "log": ["done"]}).passed
    assert not run_verifier("def verify(s): return 1", {}).passed  # truthy is not True


def test_infinite_loop_times_out_and_is_killed() -> None:
    r = run_python("while True:\n    pass\n", timeout_s=1, cpu_s=10)
    assert not r.ok and r.error_kind == "timeout" and r.duration_s < 3
    assert _no_sandbox_processes_left()


def test_cpu_limit() -> None:
    r = run_python("while True:\n    pass\n", timeout_s=10, cpu_s=1)
    assert r.error_kind == "cpu" and r.duration_s < 5


def test_fork_bomb_is_contained() -> None:
    r = run_python("import os\nwhile True:\n    os.fork()\n", timeout_s=3)
    assert not r.ok and r.error_kind == "forbidden" and "os.fork" in r.error
    assert _no_sandbox_processes_left()
    r = run_python("import multiprocessing\nmultiprocessing.Process(target=print).start()\n", timeout_s=3)
    assert r.error_kind == "forbidden" and _no_sandbox_processes_left()


def test_memory_hog_hits_memory_limit() -> None:
    r = run_python("x = bytearray(1024 ** 3)\n", memory_mb=256)
    assert r.error_kind == "memory"
    r = run_python("chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))\n", memory_mb=256, timeout_s=10)
    assert r.error_kind == "memory"


def test_network_is_blocked_even_to_loopback() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    try:
        # Loopback works for the parent...
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        server.accept()[0].close()
        for netns in (True, False):  # ...but not for the child, with or without a network namespace
            code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'x')\n"
            r = run_python(code, netns=netns)
            assert r.error_kind == "forbidden" and "network" in r.error
            # Bypassing the module-level guard still meets the audit hook.
            r = run_python(f"import socket\ns = socket.socket.__mro__[1]()\ns.connect(('127.0.0.1', {port}))\n", netns=netns)
            assert r.error_kind == "forbidden"
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # no connection ever arrived
    finally:
        server.close()


def test_isolation_mechanisms_are_reported() -> None:
    iso = run_python("pass").isolation
    assert {"audit_hook", "socket_guard", "process_guard", "rlimit_cpu", "rlimit_as", "rlimit_fsize"} <= set(iso)
    assert "netns" not in run_python("pass", netns=False).isolation


def test_writes_outside_scratch_are_refused(tmp_path: Path) -> None:
    target = tmp_path / "x"
    r = run_python(f"open({str(target)!r}, 'w').write('pwned')\n")
    assert r.error_kind == "forbidden" and not target.exists()
    r = run_python("open('/tmp/trajforge_sandbox_probe', 'w').write('x')\n")
    assert r.error_kind == "forbidden" and not Path("/tmp/trajforge_sandbox_probe").exists()
    r = run_python(f"import os\nos.remove({str(__file__)!r})\n")
    assert r.error_kind == "forbidden" and Path(__file__).exists()
    # Inside the scratch directory, files work; the directory is gone afterwards.
    r = run_python("import os\ndef f():\n    open('a.txt', 'w').write('ok')\n    return [open('a.txt').read(), os.getcwd()]\n",
                   entry="f")
    assert r.ok and r.value[0] == "ok" and not Path(r.value[1]).exists()


def test_secrets_are_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-test")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-secret-test")
    r = run_python("import os\ndef f(): return dict(os.environ)\n", entry="f")
    assert r.ok and "OPENAI_API_KEY" not in r.value and "GITHUB_TOKEN" not in r.value
    assert "secret" not in str(r.value)
    r = run_python("def f(): return open('/proc/self/environ').read()\n", entry="f")
    assert r.error_kind == "forbidden"
    r = run_python("import os\ndef f(): return open(f'/proc/{os.getppid()}/environ', 'rb').read().decode()\n", entry="f")
    assert r.error_kind == "forbidden" and "sk-secret-test" not in (r.stdout + r.stderr + str(r.value))


def test_subprocess_and_shell_are_refused() -> None:
    for code in ("import subprocess\nsubprocess.run(['sh', '-c', 'echo hi > /tmp/pwned'])\n",
                 "import os\nos.system('echo hi')\n",
                 "import os\nos.execv('/bin/sh', ['sh'])\n",
                 "import ctypes\nctypes.CDLL(None).fork()\n"):
        r = run_python(code)
        assert r.error_kind == "forbidden", code
        assert "hi" not in r.stdout
    assert _no_sandbox_processes_left()


def test_output_is_truncated() -> None:
    r = run_python("print('x' * 100000)\n", max_output=1000)
    assert r.ok and len(r.stdout) < 1100 and "truncated" in r.stdout


def test_caller_goes_on_after_failures() -> None:
    assert run_python("import os\nos.fork()").error_kind == "forbidden"
    assert run_python("def f(): return 42", entry="f").value == 42


def test_third_party_packages_only_on_request() -> None:
    assert run_python("import yaml\n").error_kind == "exception"  # -S: standard library only
    r = run_python("import yaml\ndef f(): return yaml.safe_load('a: 1')\n", entry="f", site_packages=True, memory_mb=512)
    assert r.ok and r.value == {"a": 1}
