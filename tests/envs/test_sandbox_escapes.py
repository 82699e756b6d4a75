"""Escape attempts against the code sandbox: every one is contained, and no process of a run outlives it.

Each attempt runs twice: with every wall ("all") and with the OS walls alone ("os": bubblewrap's
namespaces and read-only root, seccomp, rlimits; no audit hook or module guards), since audit hooks
are not a security boundary. Two attempts target the in-process result seal itself (a forged result,
walking frames for the key): they run with every wall only. All runs go in parallel once per module;
the tests then judge each outcome.

Contained means: no file outside the scratch directory was made, changed or removed, no secret (a
file outside, the parent's environment, /etc/shadow) reached the output, the listening socket saw no
connection, the test process lives, no process whose command line names the run is alive afterwards,
and the result never carries the attempt's own "ESCAPED" marker or a forged value.
"""

from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest

from envs.sandbox import RUNNER, SandboxResult, run_python, sandbox_problem

pytestmark = pytest.mark.skipif(sandbox_problem() is not None, reason=f"no OS sandbox here: {sandbox_problem()}")

SECRET = "s3cr3t-escape-value-7c1"
ENV_SECRET = "TRAJFORGE_ESCAPE_TEST_TOKEN"
LIMITS = {"timeout_s": 3, "cpu_s": 2, "memory_mb": 256}
FORGED = ('{"ok":true,"value":"FORGED","error_kind":null,"error":null,"violations":[],"isolation":[],'
          '"user_time_s":0.0}')
# Writes the forged payload, sealed with `mac` (hex), to every open fd, then leaves before the runner can.
_WRITE_FORGED = f"""
def _forge(mac):
    message = (mac + "\\n").encode() + {FORGED!r}.encode()
    for fd in range(3, 64):
        try:
            os.write(fd, message)
        except OSError:
            pass
"""


@dataclass(frozen=True)
class Attempt:
    name: str
    code: str  # defines attempt(); {outside}, {parent_pid} and {port} are filled in
    layers: tuple[str, ...] = ("all", "os")
    expect: Callable[[SandboxResult], bool] | None = None  # an extra condition on the result
    limits: dict[str, Any] = field(default_factory=dict)


def _kind(*kinds: str) -> Callable[[SandboxResult], bool]:
    return lambda r: not r.ok and r.error_kind in kinds


ATTEMPTS = [
    Attempt("read_etc_shadow", "def attempt():\n    return open('/etc/shadow').read()\n", expect=_kind("forbidden", "exception")),
    Attempt("read_proc_environ", """
import glob
def attempt():
    found = [open(p, 'rb').read().decode('latin-1') for p in glob.glob('/proc/*/environ')]
    return found or open('/proc/1/environ', 'rb').read().decode('latin-1')
""", expect=lambda r: not r.ok),
    Attempt("read_proc_self_root", """
import os
def attempt():
    return [os.listdir('/proc/self/root/'), open('/proc/self/root/etc/shadow').read()]
""", expect=lambda r: not r.ok),
    Attempt("read_proc_self_mem", """
def attempt():
    with open('/proc/self/mem', 'rb') as f:
        return f.read(64).hex()
""", expect=lambda r: not r.ok),
    Attempt("read_file_outside", "def attempt():\n    return open('{outside}/secret.txt').read()\n", expect=lambda r: not r.ok),
    Attempt("stat_probe_outside", """
import os
def attempt():
    os.stat('{outside}/secret.txt')
    os.stat('/etc/shadow')
    return 'ESCAPED: both paths exist'
""", expect=lambda r: not r.ok),
    Attempt("list_host_root", """
import os
def attempt():
    names = os.listdir('/')
    return 'ESCAPED ' + repr(names) if {'etc', 'work', 'home', 'var'} & set(names) else names
"""),
    Attempt("write_outside", "def attempt():\n    open('{outside}/written.txt', 'w').write('x')\n    return 'ESCAPED'\n",
            expect=lambda r: not r.ok),
    Attempt("write_runner_script", "def attempt():\n    open('/sandbox/runner.py', 'a').write('#')\n    return 'ESCAPED'\n",
            expect=lambda r: not r.ok),
    Attempt("rename_outside", "import os\ndef attempt():\n    os.rename('{outside}/secret.txt', '{outside}/moved.txt')\n"
                              "    return 'ESCAPED'\n", expect=lambda r: not r.ok),
    Attempt("link_outside", """
import os
def attempt():
    for make in (os.link, os.symlink):
        try:
            make('{outside}/secret.txt', 'here-' + make.__name__)
            return 'ESCAPED ' + open('here-' + make.__name__).read()
        except OSError:
            continue
    raise PermissionError('no link')
""", expect=lambda r: not r.ok),
    Attempt("mkfifo_outside", "import os\ndef attempt():\n    os.mkfifo('{outside}/fifo')\n    return 'ESCAPED'\n",
            expect=lambda r: not r.ok),
    Attempt("mknod", """
import os, stat
def attempt():
    for path, mode, dev in (('{outside}/node', stat.S_IFREG | 0o600, 0),
                            ('null-device', stat.S_IFCHR | 0o666, os.makedev(1, 3))):
        try:
            os.mknod(path, mode, dev)
            return 'ESCAPED ' + path
        except OSError:
            continue
    raise PermissionError('no node')
""", expect=lambda r: not r.ok),
    Attempt("socket_connect", """
import socket
def attempt():
    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)
    s.sendall(b'x')
    return 'ESCAPED'
""", expect=lambda r: not r.ok),
    Attempt("raw_socket_type", """
def attempt():
    kinds = [c for c in object.__subclasses__() if c.__module__ == '_socket' and c.__name__ == 'socket']
    s = kinds[0](2, 1)
    s.settimeout(1)
    s.connect(('127.0.0.1', {port}))
    return 'ESCAPED'
""", expect=lambda r: not r.ok),
    Attempt("raw_socket_import", """
def attempt():
    import _socket
    s = _socket.socket(2, 1)
    s.settimeout(1)
    s.connect(('127.0.0.1', {port}))
    return 'ESCAPED'
""", expect=lambda r: not r.ok),
    Attempt("fork", """
import os, time
def attempt():
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    return 'ESCAPED child %d' % pid
""", expect=lambda r: not r.ok),
    Attempt("setsid_child", """
import os, time, subprocess
def attempt():
    try:
        subprocess.Popen(['/bin/sleep', '60'], start_new_session=True)
        return 'ESCAPED popen'
    except OSError:
        pass
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(60)
        os._exit(0)
    return 'ESCAPED fork'
""", expect=lambda r: not r.ok),
    Attempt("subprocess_run", """
import subprocess
def attempt():
    subprocess.run(['/bin/sh', '-c', 'touch {outside}/subprocess.txt'])
    return 'ESCAPED'
""", expect=lambda r: not r.ok),
    Attempt("subprocess_private_fork_exec", """
import os, subprocess
def attempt():
    r, w = os.pipe()
    pid = subprocess._fork_exec([b'/bin/sh', b'-c', b'touch {outside}/fork_exec.txt'], [b'/bin/sh'], True, (w,),
                                None, None, -1, -1, -1, -1, -1, -1, r, w, True, True, -1, None, None, None, -1,
                                None, True)
    return 'ESCAPED pid %d' % pid
""", expect=lambda r: not r.ok),
    Attempt("os_system_via_subclasses", """
def attempt():
    wrap = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]
    status = wrap.__init__.__globals__['system']('touch {outside}/system.txt')
    return 'ESCAPED' if status == 0 else status
"""),
    Attempt("exec_shell", "import os\ndef attempt():\n    os.execv('/bin/sh', ['sh', '-c', 'touch {outside}/exec.txt'])\n",
            expect=lambda r: not r.ok),
    Attempt("ctypes_libc", """
def attempt():
    import ctypes
    libc = ctypes.CDLL(None)
    results = [libc.system(b'touch {outside}/ctypes.txt'), libc.unshare(0x10000000), libc.fork()]
    return 'ESCAPED ' + repr(results) if 0 in results else results
"""),
    Attempt("memory_bomb", "def attempt():\n    hog = []\n    while True:\n        hog.append(bytearray(10 ** 7))\n",
            expect=_kind("memory")),
    Attempt("fork_bomb", "import os\ndef attempt():\n    while True:\n        os.fork()\n", expect=lambda r: not r.ok),
    Attempt("thread_bomb", """
import threading, time
def attempt():
    while True:
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
""", expect=lambda r: not r.ok),
    Attempt("thread_outlives_entry", """
import threading, time
def attempt():
    threading.Thread(target=time.sleep, args=(60,)).start()
    return 'returned'
""", expect=lambda r: r.ok and r.value == "returned"),
    Attempt("infinite_loop", "def attempt():\n    while True:\n        pass\n", expect=_kind("timeout", "cpu")),
    Attempt("disk_fill", """
def attempt():
    with open('big.bin', 'wb') as f:
        for _ in range(1000):
            f.write(bytes(1 << 20))
    return 'ESCAPED: wrote 1000 MiB'
""", expect=lambda r: not r.ok),
    Attempt("kill_parent", """
import os, signal
def attempt():
    done = []
    for pid in (os.getppid(), {parent_pid}, 1):
        try:
            os.kill(pid, signal.SIGKILL)
            done.append(pid)
        except (OSError, ProcessLookupError):
            pass
    return 'ESCAPED killed %r' % done if done else 'no kill'
"""),
    Attempt("raise_rlimits", """
import resource
def attempt():
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    return 'ESCAPED %d' % len(bytearray(1024 ** 3))
""", expect=lambda r: not r.ok),
    Attempt("env_secrets", "import os\ndef attempt():\n    return dict(os.environ)\n",
            expect=lambda r: r.ok and ENV_SECRET not in r.value and not any(k.endswith("API_KEY") for k in r.value)),
    Attempt("forged_result_channel", "import os\n" + _WRITE_FORGED + """
def attempt():
    _forge('0' * 64)
    os._exit(0)
""", layers=("all",), expect=lambda r: not r.ok and r.error_kind == "forbidden" and "integrity" in r.error),
    Attempt("frame_walk_for_the_key", "import gc, hmac, os, sys\n" + _WRITE_FORGED + """
def attempt():
    seen = []
    frame = sys._getframe()
    while frame is not None:
        seen += list(frame.f_locals.values())
        frame = frame.f_back
    for probe in (lambda: [v for f in sys._current_frames().values() for v in f.f_locals.values()], gc.get_objects):
        try:
            seen += probe()
        except Exception:
            pass
    for obj in seen:
        for cell in getattr(obj, '__closure__', None) or ():
            value = cell.cell_contents
            if callable(value) and getattr(value, '__name__', '') == 'seal':
                _forge(value({FORGED!r}.encode()))
                os._exit(0)
            if isinstance(value, bytes) and len(value) == 32:
                _forge(hmac.new(value, {FORGED!r}.encode(), 'sha256').hexdigest())
                os._exit(0)
    return 'key not found'
""".replace("{FORGED!r}", repr(FORGED)), layers=("all",)),
]
RUNS = [(a, layer) for a in ATTEMPTS for layer in a.layers]


@dataclass
class Outcome:
    result: SandboxResult
    left: list[str]  # command lines of processes of the run still alive afterwards


def _processes_of(run_id: str) -> list[str]:
    alive = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if run_id in cmdline and p.info["status"] != psutil.STATUS_ZOMBIE:
            alive.append(cmdline)
    return alive


@pytest.fixture(scope="module")
def listener() -> Any:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("outside")
    (path / "secret.txt").write_text(SECRET)
    return path


@pytest.fixture(scope="module")
def outcomes(outside: Path, listener: socket.socket) -> dict[tuple[str, str], Outcome]:
    os.environ[ENV_SECRET] = SECRET
    runner_mtime = RUNNER.stat().st_mtime_ns

    def run(attempt: Attempt, layer: str) -> Outcome:
        code = (attempt.code.replace("{outside}", str(outside)).replace("{parent_pid}", str(os.getpid()))
                .replace("{port}", str(listener.getsockname()[1])))
        result = run_python(code, entry="attempt", **{**LIMITS, **attempt.limits}, in_process_guards=layer == "all")
        return Outcome(result, _processes_of(result.run_id))

    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = {(a.name, layer): pool.submit(run, a, layer) for a, layer in RUNS}
            done = {key: future.result() for key, future in futures.items()}
    finally:
        del os.environ[ENV_SECRET]
    assert RUNNER.stat().st_mtime_ns == runner_mtime
    return done


@pytest.mark.parametrize(("attempt", "layer"), [pytest.param(a, layer, id=f"{a.name}-{layer}") for a, layer in RUNS])
def test_escape_attempt_is_contained(attempt: Attempt, layer: str, outcomes: dict[tuple[str, str], Outcome],
                                     outside: Path) -> None:
    outcome = outcomes[(attempt.name, layer)]
    r = outcome.result
    said = f"{r.stdout}\n{r.stderr}\n{r.value!r}\n{r.error}"
    assert "bwrap" in r.isolation, r.isolation
    if "sealed_result" in r.isolation:  # the child reported: its own walls were up
        assert "seccomp" in r.isolation and "rlimit_as" in r.isolation, r.isolation
    assert not outcome.left, f"processes of the run outlived it: {outcome.left}"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"], list(outside.iterdir())
    assert (outside / "secret.txt").read_text() == SECRET
    assert SECRET not in said, said[-1500:]
    assert "ESCAPED" not in repr(r.value), r.value
    assert r.value != "FORGED" and not r.passed
    if attempt.expect is not None:
        assert attempt.expect(r), r


def test_nothing_reached_the_listener_or_outlived_the_runs(outcomes: dict[tuple[str, str], Outcome],
                                                           listener: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        listener.accept()
    time.sleep(0.05)
    children = [c for c in psutil.Process().children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
    assert not children, children
    assert all(r.result.duration_s < LIMITS["timeout_s"] + 2 for r in outcomes.values())
