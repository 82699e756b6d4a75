"""Run untrusted generated Python (verifiers, model-written tasks) in a confined child process.

Mechanisms, best available without extra privileges (the result lists those in effect):
- a fresh `python -I -S -B` interpreter (no site-packages, no PYTHON* variables, no user site)
  in its own session / process group, killed as a group on wall timeout and after every run;
- a minimal environment allowlist (no API keys, tokens or secrets reach the child);
- rlimits: CPU time, address space, file size, process count, no core dumps, few open files;
- an empty network namespace when the parent is root and unshare works, plus a socket guard;
- an audit hook refusing writes outside the scratch directory, reads outside it and the standard
  library (plus site-packages when asked), process creation (fork/exec/spawn/system/subprocess),
  signals, sockets, ctypes, subinterpreters, tracing, `gc` and cross-thread frame introspection;
- the code runs on a worker thread with no runner frame beneath it, while the runner's main
  thread keeps the result channel and a per-run key out of its reach (see _sandbox_runner);
- a fresh scratch directory as cwd/HOME/TMPDIR, deleted afterwards.
Inputs and outputs travel as JSON, never pickle. The result comes back on an inherited fd, sealed
with HMAC-SHA256 under a random per-run key; anything unsealed, forged or misshapen is rejected.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import os
import shutil
import signal
import secrets
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

ErrorKind = Literal["timeout", "memory", "cpu", "exception", "forbidden", "crash"]
RUNNER = Path(__file__).with_name("_sandbox_runner.py")
# The only variables the child sees; nothing is passed through from the parent.
_BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
             "PYTHONHASHSEED": "0", "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1"}
# What a sealed result must hold, and the error kinds the child reports itself.
_RESULT_KEYS = frozenset({"ok", "value", "error_kind", "error", "violations", "isolation", "user_time_s"})
_CHILD_ERROR_KINDS = frozenset({"exception", "forbidden", "memory", "crash"})


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

    @property
    def passed(self) -> bool:
        """For verifiers: ran cleanly and returned exactly True."""
        return self.ok and self.value is True


def _read_capped(path: Path, limit: int) -> str:
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            data = f.read(limit)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text + (f"\n...[truncated {size - limit} bytes]" if size > limit else "")


@functools.cache
def _read_roots(site_packages: bool) -> tuple[str, ...]:
    """Directories the child may read besides its scratch directory: the standard library and its
    extension modules, time-zone data, and the installed packages when it may import them."""
    paths = sysconfig.get_paths()
    roots = [paths["stdlib"], sysconfig.get_config_var("DESTSHARED") or paths["platstdlib"], "/usr/share/zoneinfo"]
    if site_packages:
        roots += [paths["purelib"], paths["platlib"]]
    return tuple(dict.fromkeys(os.path.realpath(r) for r in roots))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
    netns: bool = True,
    site_packages: bool = False,
) -> SandboxResult:
    """Run `code` in the sandbox; if `entry` is given, call it and return its JSON result as `value`.

    `args` is passed as `entry(*args)` for a list, `entry(**args)` for a dict, `entry(args)`
    for any other non-None value. `site_packages=True` lets the code import the installed
    third-party packages (drops `-S`; give it more memory). Never raises for anything the code does.
    """
    if args is None:
        mode, payload = "none", None
    elif isinstance(args, (list, tuple)):
        mode, payload = "positional", list(args)
    elif isinstance(args, dict):
        mode, payload = "keyword", args
    else:
        mode, payload = "positional", [args]
    workdir = Path(tempfile.mkdtemp(prefix="trajforge-sbx-"))
    scratch = workdir / "scratch"
    scratch.mkdir(mode=0o700)
    key = secrets.token_bytes(32)
    # The child writes its result to this inherited fd; it cannot open the file by name.
    result_fd = os.open(workdir / "result", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    job = {
        "code": code, "entry": entry, "args": payload, "args_mode": mode,
        "scratch": str(scratch), "result_fd": result_fd, "key": key.hex(),
        "read_roots": list(_read_roots(site_packages)),
        "cpu_s": max(1, int(cpu_s)), "memory_mb": int(memory_mb), "fsize_mb": int(fsize_mb), "nproc": int(nproc),
        "netns": netns,
    }
    env = {**_BASE_ENV, "HOME": str(scratch), "TMPDIR": str(scratch)}
    out_path, err_path = workdir / "stdout", workdir / "stderr"
    timed_out = False
    try:
        try:
            job_text = json.dumps(job)
        except (TypeError, ValueError) as exc:
            return SandboxResult(ok=False, error_kind="exception", error=f"args are not JSON-serializable: {exc}")
        # Readable by this user only: it holds the key until the child deletes it.
        with os.fdopen(os.open(workdir / "job.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(job_text)
        start = time.monotonic()
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", *([] if site_packages else ["-S"]), "-B", str(RUNNER), str(workdir / "job.json")],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=scratch, env=env,
                start_new_session=True, close_fds=True, pass_fds=(result_fd,),
            )
            os.close(result_fd)
            result_fd = -1
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid)
                proc.wait()
            finally:
                # Whatever the outcome, nothing the child started outlives the run.
                _kill_group(proc.pid)
        duration = time.monotonic() - start
        result = _collect(workdir, key, proc.returncode, timed_out, timeout_s)
        result.duration_s = duration
        result.stdout = _read_capped(out_path, max_output)
        result.stderr = _read_capped(err_path, max_output)
        if result.error_kind == "crash" and "MemoryError" in result.stderr:
            result.error_kind = "memory"
        return result
    finally:
        if result_fd >= 0:
            os.close(result_fd)
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


def isolation_in_effect() -> list[str]:
    """The mechanisms the sandbox actually gets on this machine (runs a trivial program)."""
    return run_python("pass").isolation
