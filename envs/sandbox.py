"""Run untrusted generated Python (verifiers, model-written tasks) in a confined child process.

Mechanisms, best available without extra privileges (the result lists those in effect):
- a fresh `python -I -S -B` interpreter (no site-packages, no PYTHON* variables, no user site)
  in its own session / process group, killed as a group on wall timeout and after every run;
- a minimal environment allowlist (no API keys, tokens or secrets reach the child);
- rlimits: CPU time, address space, file size, process count, no core dumps, few open files;
- an empty network namespace when the parent is root and unshare works, plus a socket guard;
- an audit hook refusing writes outside the scratch directory, reading /proc and /sys,
  process creation (fork/exec/spawn/system/subprocess), signals, sockets and ctypes;
- a fresh scratch directory as cwd/HOME/TMPDIR, deleted afterwards.
Inputs and outputs travel as JSON files, never pickle.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
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
    job = {
        "code": code, "entry": entry, "args": payload, "args_mode": mode,
        "scratch": str(scratch), "result_path": str(workdir / "result.json"),
        "cpu_s": max(1, int(cpu_s)), "memory_mb": int(memory_mb), "fsize_mb": int(fsize_mb), "nproc": int(nproc),
        "netns": netns,
    }
    try:
        (workdir / "job.json").write_text(json.dumps(job), encoding="utf-8")
    except (TypeError, ValueError) as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        return SandboxResult(ok=False, error_kind="exception", error=f"args are not JSON-serializable: {exc}")
    env = {**_BASE_ENV, "HOME": str(scratch), "TMPDIR": str(scratch)}
    out_path, err_path = workdir / "stdout", workdir / "stderr"
    start = time.monotonic()
    timed_out = False
    try:
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", *([] if site_packages else ["-S"]), "-B", str(RUNNER), str(workdir / "job.json")],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=scratch, env=env,
                start_new_session=True, close_fds=True,
            )
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
        result = _collect(workdir, proc.returncode, timed_out, timeout_s)
        result.duration_s = duration
        result.stdout = _read_capped(out_path, max_output)
        result.stderr = _read_capped(err_path, max_output)
        if result.error_kind == "crash" and "MemoryError" in result.stderr:
            result.error_kind = "memory"
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _collect(workdir: Path, rc: int, timed_out: bool, timeout_s: float) -> SandboxResult:
    if timed_out:
        return SandboxResult(ok=False, error_kind="timeout", error=f"wall time limit of {timeout_s}s exceeded", exit_code=rc)
    try:
        data = json.loads((workdir / "result.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
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
