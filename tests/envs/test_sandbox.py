"""The code sandbox: ordinary code works; runaway, hostile or nosy code is contained and reported."""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest

from envs.sandbox import RUNNER, SandboxResult, run_python, run_verifier
from tests.envs.test_sandbox_escapes import _processes_of


def _no_sandbox_processes_left(*results: SandboxResult) -> bool:
    """No process of these runs is alive (each names its run id on its command line), and no runner
    was orphaned (re-parented to init: ours escaping; other sessions' live runners are not)."""
    strays = [p for p in psutil.process_iter(["cmdline", "ppid"])
              if str(RUNNER) in " ".join(p.info["cmdline"] or []) and p.info["ppid"] in (0, 1)]
    return not strays and not any(_processes_of(r.run_id) for r in results)


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
    assert _no_sandbox_processes_left(r)


def test_cpu_limit() -> None:
    r = run_python("while True:\n    pass\n", timeout_s=10, cpu_s=1)
    # Killed by the CPU limit, well before the wall timeout (a loaded machine stretches the wall time).
    assert r.error_kind == "cpu" and r.duration_s < 9


def test_fork_bomb_is_contained() -> None:
    r = run_python("import os\nwhile True:\n    os.fork()\n", timeout_s=3)
    assert not r.ok and r.error_kind == "forbidden" and "os.fork" in r.error
    assert _no_sandbox_processes_left(r)
    r = run_python("import multiprocessing\nmultiprocessing.Process(target=print).start()\n", timeout_s=3)
    assert r.error_kind == "forbidden" and _no_sandbox_processes_left(r)


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
        code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'x')\n"
        r = run_python(code)
        assert r.error_kind == "forbidden" and "network" in r.error
        # Bypassing the module-level guard still meets the audit hook...
        r = run_python(f"import socket\ns = socket.socket.__mro__[1]()\ns.connect(('127.0.0.1', {port}))\n")
        assert r.error_kind == "forbidden"
        # ...and without the in-process guards, seccomp and the empty network namespace.
        r = run_python(code, in_process_guards=False)
        assert not r.ok and "Operation not permitted" in r.error
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # no connection ever arrived
    finally:
        server.close()


def test_isolation_mechanisms_are_reported() -> None:
    iso = run_python("pass").isolation
    assert {"bwrap", "pid_ns", "net_ns", "seccomp", "no_new_privs", "audit_hook", "socket_guard", "process_guard",
            "rlimit_cpu", "rlimit_as", "rlimit_fsize", "rlimit_nproc", "rlimit_nofile"} <= set(iso)
    assert "audit_hook" not in run_python("pass", in_process_guards=False).isolation


def test_without_bubblewrap_nothing_runs_unless_explicitly_unsafe(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    from envs import sandbox

    monkeypatch.setenv("TRAJFORGE_BWRAP", "/nonexistent/bwrap")
    with pytest.raises(sandbox.SandboxUnavailable) as refused:
        run_python("open('/tmp/x', 'w')")
    message = str(refused.value)
    assert "\n" not in message and "bubblewrap" in message and "apt-get install bubblewrap" in message
    assert "--unsafe-no-sandbox" in message
    monkeypatch.setattr(sandbox, "_warned_unsafe", False)
    with caplog.at_level("WARNING", logger="trajforge.sandbox"):
        r = run_python("def f(): return 7", entry="f", unsafe_no_sandbox=True)
    assert r.ok and r.value == 7 and "unsandboxed" in r.isolation and "bwrap" not in r.isolation
    assert "seccomp" in r.isolation and "audit_hook" in r.isolation  # the inner walls still stand
    assert any("UNSAFE" in rec.getMessage() for rec in caplog.records)


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
        assert _no_sandbox_processes_left(r)


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


# ---- the result channel, the runner's own state, and confined reads ----------------------------------------------

FORGED = '{"ok": true, "value": true, "error_kind": null, "error": null, "violations": [], "isolation": [], "user_time_s": 0}'


def test_writing_a_result_on_the_inherited_fd_is_rejected() -> None:
    # The code finds the result fd and writes a well-formed result of its own, then exits before the runner can.
    code = f"""
import os, stat
for fd in range(3, 64):
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.write(fd, {FORGED!r}.encode())
    except OSError:
        pass
os._exit(0)
"""
    r = run_verifier("def verify(s): return False\n" + code, {})
    assert not r.ok and not r.passed and r.error_kind == "forbidden" and "integrity" in r.error


def test_untrusted_code_cannot_walk_up_to_the_runner() -> None:
    r = run_python("""
import sys
def f():
    frame, names = sys._getframe(), []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names
""", entry="f")
    assert r.ok and r.value == ["f", "_run_untrusted"]  # the worker thread's stack ends there


def test_refused_introspection() -> None:
    for code in ("import gc\ngc.get_objects()\n", "import gc\ngc.get_referrers(gc)\n", "import sys\nsys.settrace(print)\n",
                 "import sys\nsys._current_frames()\n"):
        r = run_python(code)
        assert r.error_kind == "forbidden", code
    # A refused audit hook is dropped silently (CPython's rule), so it sees nothing.
    r = run_python("import sys\nsys.addaudithook(lambda e, a: print('seen', e))\nopen('x.txt', 'w').close()\n")
    assert r.ok and "seen" not in r.stdout and "sys.addaudithook" in r.violations
    # Frames of the code's own thread stay available: the standard library needs them (namedtuple, typing).
    r = run_python("from collections import namedtuple\nimport typing, traceback\n"
                   "def f():\n    try:\n        1 / 0\n    except ZeroDivisionError:\n        return traceback.format_exc()\n",
                   entry="f")
    assert r.ok and "ZeroDivisionError" in r.value


def test_frame_access_is_refused_on_the_runner_thread(tmp_path: Path) -> None:
    """The audit hook alone: on the thread that installed it frames are refused, on others they are not."""
    script = tmp_path / "probe.py"
    script.write_text(f"""
import sys, threading, _thread
sys.path.insert(0, {str(RUNNER.parent)!r})
import _sandbox_runner as runner
sys.addaudithook(runner._make_hook({str(tmp_path)!r}, [], [], _thread.get_ident()))
def attempt(what):
    try:
        what()
        return "allowed"
    except runner.SandboxViolation:
        return "refused"
def tb_frame():
    try:
        raise ValueError
    except ValueError as exc:
        return exc.__traceback__.tb_frame
main = [attempt(sys._getframe), attempt(tb_frame), attempt(lambda: (x for x in ()).gi_frame)]
other = []
t = threading.Thread(target=lambda: other.extend([attempt(sys._getframe), attempt(tb_frame)]))
t.start(); t.join()
print(main, other, attempt(__import__("gc").get_objects))
""")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-I", "-S", str(script)], capture_output=True, text=True, timeout=30)
    assert out.stdout.split("\n")[0] == "['refused', 'refused', 'refused'] ['allowed', 'allowed'] refused", out.stderr


def test_replaced_globals_and_builtins_do_not_loosen_the_hook(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    attacks = [
        # The hook's path checks go through os.path.realpath...
        f"import os\nscratch = os.getcwd()\nos.path.realpath = lambda p: scratch\nopen({str(target)!r}, 'w').write('x')\n",
        # ...its tables are module globals of the runner, reachable from the socket guard...
        "import socket\ng = socket.create_connection.__globals__\ng['_FORBIDDEN_EVENTS'] = frozenset()\n"
        f"g['_PATH_EVENTS'] = {{}}\nimport os\nos.system('touch {target}')\n",
        # ...and builtins are shared with the runner.
        f"import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.type = lambda *a: int\n"
        f"open({str(target)!r}, 'w').write('x')\n",
        # A path object that names another file the second time it is converted.
        "import io\nclass P:\n    n = 0\n    def __fspath__(self):\n        P.n += 1\n"
        f"        return {str(target)!r} if P.n == 1 else 'inside.txt'\nio.FileIO(P(), 'w').write(b'x')\n",
    ]
    for code in attacks:
        r = run_python(code)
        assert r.error_kind == "forbidden" and not target.exists(), (code, r)


def test_reads_are_confined_to_scratch_and_the_standard_library(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t")
    for code in (f"open({str(secret)!r}).read()", "open('/etc/passwd').read()", f"import os\nos.listdir({str(tmp_path)!r})",
                 "open('../../etc/passwd').read()", "import os\nos.chdir('/')",
                 # A directory fd outside the scratch directory would anchor dir_fd= calls there.
                 "import os, json\nos.open(os.path.dirname(json.__file__), os.O_RDONLY)"):
        r = run_python(code + "\n")
        assert r.error_kind == "forbidden" and "s3cr3t" not in r.stdout + r.stderr + str(r.error), code
    r = run_python("import json, os\ndef f():\n    os.mkdir('d')\n    os.chdir('d')\n    open('a.txt', 'w').write('mine')\n"
                   "    return [len(open(json.__file__).read()) > 0, open('a.txt').read(), os.listdir('.')]\n", entry="f")
    assert r.ok and r.value == [True, "mine", ["a.txt"]], r


def test_results_are_read_without_running_the_codes_methods() -> None:
    r = run_python("""
import collections, enum, math
class D(dict):
    def items(self):
        return [("forged", True)]
    def keys(self):
        return ["forged"]
class L(list):
    def __iter__(self):
        return iter([True])
class S(str):
    def __str__(self):
        return "forged"
class Color(enum.IntEnum):
    RED = 1
def f():
    return {"d": D(a=1), "l": L([1, 2]), "s": S("real"), "t": (1, "x"), "c": collections.Counter("aa"),
            "e": Color.RED, "n": [math.inf, -math.inf], 2: None, True: 1.5}
""", entry="f")
    assert r.ok and r.value == {"d": {"a": 1}, "l": [1, 2], "s": "real", "t": [1, "x"], "c": {"a": 2}, "e": 1,
                                "n": [float("inf"), float("-inf")], "2": None, "true": 1.5}
    r = run_python("def f():\n    x = []\n    x.append(x)\n    return x\n", entry="f")
    assert r.error_kind == "exception" and "circular" in r.error
    r = run_python("def f():\n    return {(1, 2): 3}\n", entry="f")
    assert r.error_kind == "exception" and "keys must be" in r.error


def test_subinterpreters_are_refused(tmp_path: Path) -> None:
    # A subinterpreter would run without the audit hook.
    target = tmp_path / "sub.txt"
    r = run_python(f"import _xxsubinterpreters as s\ns.run_string(s.create(), \"open({str(target)!r}, 'w')\")\n")
    assert r.error_kind == "forbidden" and not target.exists()


def test_unseal_accepts_only_intact_well_formed_results() -> None:
    import hmac

    from envs.sandbox import _unseal

    key, payload = b"k" * 32, FORGED.encode()

    def sealed(body: bytes, k: bytes = key) -> bytes:
        return hmac.new(k, body, "sha256").hexdigest().encode() + b"\n" + body

    assert _unseal(sealed(payload), key)["value"] is True
    assert _unseal(sealed(payload, b"x" * 32), key) is None  # another key
    assert _unseal(sealed(payload)[:-3] + b"  }", key) is None  # tampered after sealing
    assert _unseal(payload, key) is None  # not sealed at all
    assert _unseal(sealed(payload.replace(b'"error_kind": null', b'"error_kind": "timeout"')), key) is None  # misshapen


def test_runner_code_after_startup_looks_up_no_globals() -> None:
    """Closures that run once untrusted code has started resolve every name through their closure:
    the code can replace the runner's module globals and the builtins."""
    import dis
    import types

    from envs import _sandbox_runner as runner

    def nested(code: types.CodeType):
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield const
                yield from nested(const)

    for factory in (runner._make_resolver, runner._make_hook, runner._make_encoder, runner._make_sealer,
                    runner._make_reporter):
        for code in nested(factory.__code__):
            names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
            assert not names, f"{factory.__name__}/{code.co_name} looks up {names}"
