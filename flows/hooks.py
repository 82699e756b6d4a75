"""A user's command run from a flow (a training hook): one process group, its output in a log, killed with its
children on timeout, when the flow stops, or when the flow's process dies (even by SIGKILL: the command runs
under the guard MCP servers run under, `envs/mcp/_guard.py`, which ends the group when its parent dies)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from flows import console as term

# The guard's file, not its module: importing the envs.mcp package would load the MCP SDK (~0.7 s).
GUARD = Path(__file__).resolve().parents[1] / "envs" / "mcp" / "_guard.py"


class HookError(RuntimeError):
    """The hook failed (exit status, timeout, no model reported); the message says which and where its log is."""


def run_hook(argv: list[str], *, env: dict[str, str], cwd: str | None, log_path: Path, timeout_s: float,
             what: str) -> str:
    """Run `argv` (no shell), appending its output to `log_path`; the last non-empty line it printed.

    Raises HookError (naming `what` and the log) when it cannot start, runs past `timeout_s` or exits non-zero.
    """
    started = time.monotonic()
    term.console.print(f"  hook: {shlex.join(argv)} (output in {log_path})", highlight=False, markup=False)
    with open(log_path, "ab") as log:
        offset = log.tell()
        program = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
        if program is None or not os.access(Path(cwd or ".", program), os.X_OK):
            raise HookError(f"{what} {argv[0]!r} cannot start: not an executable file (or not on PATH)")
        try:
            proc = subprocess.Popen([sys.executable, "-I", str(GUARD), str(os.getpid()), "--quiet", "--", *argv],
                                    cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise HookError(f"{what} {argv[0]!r} cannot start: {exc.strerror or exc}") from None
        try:
            status = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise HookError(f"{what} ran past its {timeout_s:g}s timeout; log: {log_path}") from None
        finally:
            if proc.poll() is None:  # timeout, or the flow was stopped: nothing of the hook survives
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    printed = log_path.read_bytes()[offset:].decode("utf-8", "replace").splitlines()
    term.console.print(f"  hook: exited with status {status} after {time.monotonic() - started:.1f}s", highlight=False)
    if status != 0:
        raise HookError(f"{what} exited with status {status}; log: {log_path}")
    return next((line for line in reversed(printed) if line.strip()), "")
