"""Run a stdio MCP server (or a flow's hook) so that it never outlives the process that started it.

    python -I _guard.py PARENT_PID [--quiet] -- COMMAND [ARGS...]

The MCP SDK starts a stdio server in a session of its own and stops it when the client closes;
a client killed with SIGKILL gets no chance to. Most servers exit when their stdin closes, but a
busy or hung one does not, and neither does a helper the server started. This guard sits between
the two: it runs the server as its child, in the process group the SDK made for it, and ends the
whole group when the parent dies (Linux: PR_SET_PDEATHSIG; elsewhere: polling the parent pid),
when it is asked to stop (SIGTERM, which the SDK sends the group on close), or when the server
exits. A server that exits on its own gets a last line on its stderr (the run's log of the
server), `EXIT_MARK` and the status, which trajforge quotes when a start fails; `--quiet` (a
hook, whose last printed line is its answer) adds nothing to the output. It imports only the
standard library, so it starts in milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
GRACE_S = 1.0
EXIT_MARK = "[trajforge] the MCP server exited with status "


def _others_in_group() -> bool:
    """Whether a process other than this one is still in this process group (Linux /proc; else assume so)."""
    me, group = os.getpid(), os.getpgid(0)
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses: split after the last ")".
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == group:  # state, ppid, pgrp
            return True
    return False


def _end_group(code: int) -> None:
    """SIGTERM the process group (the server and its helpers), SIGKILL what is left after a grace, exit."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(0, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while _others_in_group() and time.monotonic() < deadline:
            time.sleep(0.02)
        if _others_in_group():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.killpg(0, signal.SIGKILL)
    except OSError:
        pass
    os._exit(code)


def _watch_parent(parent: int) -> None:
    """Where the kernel cannot signal the parent's death: notice it by polling."""
    while os.getppid() == parent:
        time.sleep(0.25)
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> None:
    quiet = len(argv) > 1 and argv[1] == "--quiet"
    if quiet:
        argv = [argv[0], *argv[2:]]
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: _guard.py PARENT_PID [--quiet] -- COMMAND [ARGS...]\n")
        os._exit(2)
    parent = int(argv[0])
    if os.getpgrp() != os.getpid():  # ending "our" group must never reach the caller's
        os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, lambda *_: _end_group(143))
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    else:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the parent died before the death signal was armed
        _end_group(143)
    try:
        child = subprocess.Popen(argv[2:])
    except OSError as exc:
        sys.stderr.write(f"cannot start {argv[2]!r}: {exc}\n" if quiet else
                         f"cannot start MCP server {argv[2]!r}: {exc}\n{EXIT_MARK}127\n")
        sys.stderr.flush()
        os._exit(127)
    # The server holds the pipes now; without our copies the client sees EOF as soon as it exits.
    os.close(0)
    os.close(1)
    code = child.wait()
    status = code if code >= 0 else 128 - code
    if quiet:
        _end_group(status)
    try:
        sys.stderr.write(f"{EXIT_MARK}{status}" + (f" (signal {-code})" if code < 0 else "") + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    _end_group(status)


if __name__ == "__main__":
    main(sys.argv[1:])
