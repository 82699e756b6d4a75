"""Run untrusted generated Python (verifiers, model-written tasks) in a confined child process.

Walls, outermost first (the result lists those in effect):
- bubblewrap (`envs._bwrap`): new user, pid, network, mount, ipc and uts namespaces; nobody
  (65534) with no capabilities; a root holding only read-only binds of what the interpreter needs,
  a size-limited tmpfs scratch directory and a minimal /dev (no /proc); dies with its parent, and
  its pid namespace takes every process of the run with it. Without bubblewrap nothing runs
  (`SandboxUnavailable`), unless the caller passes `unsafe_no_sandbox=True`: then the walls below
  stand alone, and a warning says so;
- a seccomp filter (`envs._seccomp`): no new processes, exec, signals, ptrace, sockets, device or
  FIFO nodes, links, raised limits, mounts or namespaces;
- rlimits: CPU time, address space, file size, process count, open files, no core dumps;
- a fresh `python -I -S -B` interpreter with a minimal environment allowlist (no API keys, tokens
  or secrets reach the child);
- an audit hook refusing writes outside the scratch directory, reads outside it and the standard
  library (plus site-packages when asked), process creation, signals, sockets, ctypes,
  subinterpreters, tracing, `gc` and cross-thread frame introspection; module-level guards on
  sockets and subprocess;
- the code runs on a worker thread with no runner frame beneath it, while the runner's main
  thread keeps the result channel and a per-run key out of its reach (see _sandbox_runner).
Inputs and outputs travel as JSON, never pickle: the job (with the key) arrives on stdin and never
touches a disk; the result comes back on an inherited fd, sealed with HMAC-SHA256 under that key;
anything unsealed, forged or misshapen is rejected.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import shutil
import signal
import secrets
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from envs import _bwrap, _seccomp

ErrorKind = Literal["timeout", "memory", "cpu", "exception", "forbidden", "crash"]
RUNNER = Path(__file__).with_name("_sandbox_runner.py")
# The only variables the child sees; nothing is passed through from the parent.
_BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
             "PYTHONHASHSEED": "0", "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1"}
# What a sealed result must hold, and the error kinds the child reports itself.
_RESULT_KEYS = frozenset({"ok", "value", "error_kind", "error", "violations", "isolation", "user_time_s"})
_CHILD_ERROR_KINDS = frozenset({"exception", "forbidden", "memory", "crash"})
# bubblewrap reports a child killed by signal N as exit status 128 + N.
_SIGNAL_EXIT = 128
log = logging.getLogger("trajforge.sandbox")
_warned_unsafe = False


class SandboxUnavailable(RuntimeError):
    """Generated code cannot run here: no working bubblewrap and no explicit unsafe override."""


@dataclass
class SandboxResult:
    ok: bool
    value: Any = None
    stdout: str = ""
    stderr: str = ""
    error_kind: ErrorKind | None = None
    error: str | None = None
    exit_code: int | None = None
    duration_s: float = 0.0
    violations: list[str] = field(default_factory=list)
    isolation: list[str] = field(default_factory=list)
    run_id: str = ""  # in the command line of every process of the run (to check none outlives it)

    @property
    def passed(self) -> bool:
        """For verifiers: ran cleanly and returned exactly True."""
        return self.ok and self.value is True


def sandbox_problem() -> str | None:
    """Why generated code cannot run in the OS sandbox here (None when it can)."""
    bwrap = _bwrap.bwrap_path()
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    return _bwrap.problem(bwrap)


def require_sandbox(*, unsafe_no_sandbox: bool = False) -> None:
    """Raise SandboxUnavailable (one line: what is missing, how to install it) unless generated
    code can run under bubblewrap here, or the caller explicitly accepts running without it."""
    problem = sandbox_problem()
    if problem is None:
        return
    if not unsafe_no_sandbox:
        raise SandboxUnavailable(f"generated code runs only in the sandbox, and {problem}: {_bwrap.INSTALL_HINT}")
    _warn_unsafe(problem)


def _warn_unsafe(problem: str) -> None:
    global _warned_unsafe
    if not _warned_unsafe:
        _warned_unsafe = True
        log.warning("UNSAFE: %s; generated code runs WITHOUT the OS sandbox (--unsafe-no-sandbox): "
                    "only seccomp, rlimits and in-process guards stand between it and this machine", problem)


def _read_capped(path: Path, limit: int) -> str:
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            data = f.read(limit)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text + (f"\n...[truncated {size - limit} bytes]" if size > limit else "")


def _kill_group(pgid: int, wait_s: float = 5.0) -> None:
    """SIGKILL the run's process group and wait (bounded) until none of its processes is alive: a kill
    is delivered asynchronously, and a run must not return while its processes are still tearing down."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + wait_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.005)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` is alive (zombies, already dead, do not count)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the command (which may hold spaces) start after the last ')': state, ppid, pgrp.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def _kill_namespace(info_fd: int) -> None:
    """Kill the sandbox's pid-1 (named by bwrap's --info-fd): the kernel then kills every process
    in its pid namespace, and bwrap exits only once they are all gone."""
    child = _namespace_init(info_fd)
    if child is not None:
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)


def _namespace_init(info_fd: int) -> int | None:
    """The pid of the sandbox's pid-1 as bwrap's --info-fd names it (None once read or never written)."""
    try:
        os.set_blocking(info_fd, False)
        child = json.loads(os.read(info_fd, 65536) or b"{}").get("child-pid")
    except (OSError, ValueError, AttributeError):
        return None
    return child if isinstance(child, int) and child > 1 else None


def _await_gone(pid: int, run_id: str, wait_s: float = 5.0) -> None:
    """Wait (bounded) until the sandbox's pid-1 is dead, then kill it if it is not. bwrap's outer process
    can exit as soon as pid-1 reports its status, while pid-1 itself is still tearing down; only a process
    whose command line names this run is ever waited on or killed (a reused pid is left alone)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                ours = run_id.encode() in f.read()
        except OSError:
            return
        if not ours or stat[stat.rfind(b")") + 2:].startswith(b"Z"):
            return
        if time.monotonic() >= deadline:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.005)


def _call_mode(args: Any) -> tuple[str, Any]:
    if args is None:
        return "none", None
    if isinstance(args, (list, tuple)):
        return "positional", list(args)
    if isinstance(args, dict):
        return "keyword", args
    return "positional", [args]


def run_python(
    code: str,
    *,
    entry: str | None = None,
    args: Any = None,
    timeout_s: float = 5,
    cpu_s: int = 5,
    memory_mb: int = 256,
    fsize_mb: int = 16,
    nproc: int = 64,
    max_output: int = 20_000,
    site_packages: bool = False,
    unsafe_no_sandbox: bool = False,
    in_process_guards: bool = True,
) -> SandboxResult:
    """Run `code` in the sandbox; if `entry` is given, call it and return its JSON result as `value`.

    `args` is passed as `entry(*args)` for a list, `entry(**args)` for a dict, `entry(args)`
    for any other non-None value. `site_packages=True` lets the code import the installed
    third-party packages (give it more memory). Never raises for anything the code does; raises
    SandboxUnavailable when bubblewrap cannot run here, unless `unsafe_no_sandbox`.
    `in_process_guards=False` drops the audit hook and module guards: only for tests that check
    the OS walls (namespaces, seccomp, rlimits) hold on their own.
    """
    require_sandbox(unsafe_no_sandbox=unsafe_no_sandbox)
    bwrap = _bwrap.bwrap_path() if sandbox_problem() is None else None
    mode, payload = _call_mode(args)
    run_id = f"trajforge-sbx-{secrets.token_hex(8)}"
    workdir = Path(tempfile.mkdtemp(prefix="trajforge-sbx-"))
    if bwrap:
        scratch = _bwrap.SCRATCH
    else:
        (workdir / "scratch").mkdir(mode=0o700)
        scratch = str(workdir / "scratch")
    key = secrets.token_bytes(32)
    try:
        seccomp_program = _seccomp.filter_program().hex()
    except _seccomp.SeccompUnavailable:
        seccomp_program = None
    # The child writes its result to this inherited fd; inside the sandbox the file has no name.
    result_fd = os.open(workdir / "result", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    job = {
        "code": code, "entry": entry, "args": payload, "args_mode": mode,
        "scratch": scratch, "result_fd": result_fd, "key": key.hex(),
        "read_roots": list(_bwrap.read_roots(site_packages)), "site_dirs": list(_bwrap.site_dirs(site_packages)),
        "cpu_s": max(1, int(cpu_s)), "memory_mb": int(memory_mb), "fsize_mb": int(fsize_mb), "nproc": int(nproc),
        "seccomp": seccomp_program, "guards": in_process_guards,
    }
    env = {**_BASE_ENV, "HOME": scratch, "TMPDIR": scratch}
    out_path, err_path = workdir / "stdout", workdir / "stderr"
    timed_out = False
    info_read = info_write = -1
    try:
        try:
            job_bytes = json.dumps(job).encode("utf-8")
        except (TypeError, ValueError) as exc:
            return SandboxResult(ok=False, error_kind="exception", error=f"args are not JSON-serializable: {exc}")
        if bwrap:
            info_read, info_write = os.pipe()
            argv = _bwrap.command(bwrap, RUNNER, run_id, site_packages=site_packages,
                                  scratch_bytes=max(1, int(fsize_mb)) * 4 * 1024 * 1024, info_fd=info_write)
            cwd = str(workdir)
        else:
            _warn_unsafe(sandbox_problem() or "the sandbox is off")
            argv = [_bwrap.interpreter(), "-I", "-S", "-B", str(RUNNER), run_id]
            cwd = scratch
        start = time.monotonic()
        with out_path.open("wb") as out, err_path.open("wb") as err:
            # The job (and its key) goes through a pipe: it never exists as a file the code could find.
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=cwd, env=env,
                                    start_new_session=True, close_fds=True,
                                    pass_fds=(result_fd,) if info_write < 0 else (result_fd, info_write))
            os.close(result_fd)
            result_fd = -1
            if info_write >= 0:
                os.close(info_write)
                info_write = -1
            try:
                proc.communicate(job_bytes, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                if info_read >= 0:
                    _kill_namespace(info_read)
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        pass
                _kill_group(proc.pid)
                proc.wait()
            finally:
                # Whatever the outcome, nothing the child started outlives the run: its process group,
                # and the sandbox's pid-1, which bwrap's --new-session puts in a session of its own.
                _kill_group(proc.pid)
                if info_read >= 0 and (init := _namespace_init(info_read)) is not None:
                    _await_gone(init, run_id)
        duration = time.monotonic() - start
        rc = proc.returncode
        if bwrap and rc > _SIGNAL_EXIT:
            rc = _SIGNAL_EXIT - rc  # as subprocess reports a signal: negative
        result = _collect(workdir, key, rc, timed_out, timeout_s)
        result.duration_s = duration
        result.run_id = run_id
        result.stdout = _read_capped(out_path, max_output)
        result.stderr = _read_capped(err_path, max_output)
        if result.error_kind == "crash" and "MemoryError" in result.stderr:
            result.error_kind = "memory"
        result.isolation = (["bwrap", "user_ns", "pid_ns", "net_ns", "mount_ns", "readonly_root", "tmpfs_scratch"]
                            if bwrap else ["unsandboxed"]) + result.isolation
        return result
    finally:
        for fd in (result_fd, info_read, info_write):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)


def _unseal(message: bytes, key: bytes) -> dict[str, Any] | None:
    """The result dict if `message` is `hex HMAC-SHA256(key, payload)\\n payload` with a well-formed
    payload, else None (forged, tampered with, truncated or misshapen)."""
    mac, sep, payload = message.partition(b"\n")
    if not sep or not hmac.compare_digest(mac, hmac.new(key, payload, "sha256").hexdigest().encode()):
        return None
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    well_formed = (
        isinstance(data, dict) and set(data) == _RESULT_KEYS and isinstance(data["ok"], bool)
        and (data["error_kind"] is None) == data["ok"]
        and (data["error_kind"] is None or data["error_kind"] in _CHILD_ERROR_KINDS)
        and (data["error"] is None or isinstance(data["error"], str))
        and all(isinstance(v, list) and all(isinstance(s, str) for s in v) for v in (data["violations"], data["isolation"]))
        and isinstance(data["user_time_s"], (int, float))
    )
    return data if well_formed else None


def _collect(workdir: Path, key: bytes, rc: int, timed_out: bool, timeout_s: float) -> SandboxResult:
    if timed_out:
        return SandboxResult(ok=False, error_kind="timeout", error=f"wall time limit of {timeout_s}s exceeded", exit_code=rc)
    try:
        message = (workdir / "result").read_bytes()
    except OSError:
        message = b""
    data = _unseal(message, key) if message else None
    if message and data is None:
        return SandboxResult(ok=False, error_kind="forbidden", exit_code=rc,
                             error="the child's result failed its integrity check (forged or tampered with)")
    if not data:
        if rc == -signal.SIGXCPU or rc == -signal.SIGKILL:
            # RLIMIT_CPU sends SIGXCPU at the soft limit and SIGKILL at the hard one.
            kind: ErrorKind = "cpu" if rc == -signal.SIGXCPU else "crash"
            return SandboxResult(ok=False, error_kind=kind, error=f"killed by signal {-rc}", exit_code=rc)
        return SandboxResult(ok=False, error_kind="crash", error=f"the child exited with {rc} without a result", exit_code=rc)
    return SandboxResult(
        ok=bool(data.get("ok")), value=data.get("value"), error_kind=data.get("error_kind"), error=data.get("error"),
        exit_code=rc, violations=list(data.get("violations", [])), isolation=list(data.get("isolation", [])),
    )


async def arun_python(code: str, **kwargs: Any) -> SandboxResult:
    """`run_python` off the event loop (the child is a separate process; this only waits)."""
    return await asyncio.to_thread(run_python, code, **kwargs)


def run_verifier(verifier_code: str, solution_or_state: Any, *, entry: str = "verify", **limits: Any) -> SandboxResult:
    """Run `verify(solution_or_state)` from `verifier_code`; `result.passed` is True iff it returned True.

    `solution_or_state` is any JSON-able value and is passed as the single argument.
    """
    return run_python(verifier_code, entry=entry, args=[solution_or_state], **limits)


def isolation_in_effect(*, unsafe_no_sandbox: bool = False) -> list[str]:
    """The mechanisms the sandbox actually gets on this machine (runs a trivial program)."""
    return run_python("pass", unsafe_no_sandbox=unsafe_no_sandbox).isolation
