"""A flow's hook (a user's trainer): its last printed line is its answer, a missing program is one line, and
nothing of it outlives the flow's process, even one killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from flows.hooks import HookError, run_hook
from tests.conftest import REPO

# A hook that starts a helper of its own, says where both are, then works for a long time.
SLOW_HOOK = """
import os, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {helper.pid}")
time.sleep(300)
"""

# The flow's process: runs the hook as improve and agent-r do.
DRIVER = """
import sys
from pathlib import Path
from flows.hooks import run_hook
run_hook([sys.executable, sys.argv[1], sys.argv[2]], env={"PATH": "/usr/bin:/bin"}, cwd=None,
         log_path=Path(sys.argv[3]), timeout_s=600, what="train hook")
"""


def test_the_hook_answers_with_its_last_line_and_a_missing_program_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "hook.log"
    said = run_hook([sys.executable, "-c", "print('training'); print('out/model'); print()"], env=dict(os.environ),
                    cwd=None, log_path=log, timeout_s=60, what="train hook")
    assert said == "out/model" and log.read_text().split() == ["training", "out/model"]  # the guard adds nothing
    with pytest.raises(HookError, match=r"^train hook 'no-such-trainer' cannot start: not an executable"):
        run_hook(["no-such-trainer"], env=dict(os.environ), cwd=None, log_path=log, timeout_s=60, what="train hook")
    with pytest.raises(HookError, match=r"train hook exited with status 3; log: "):
        run_hook([sys.executable, "-c", "raise SystemExit(3)"], env=dict(os.environ), cwd=None, log_path=log,
                 timeout_s=60, what="train hook")


def test_a_hook_and_its_helpers_die_with_a_flow_killed_by_sigkill(tmp_path: Path) -> None:
    (tmp_path / "hook.py").write_text(SLOW_HOOK)
    pids_file = tmp_path / "pids"
    flow = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "hook.py"), str(pids_file),
                             str(tmp_path / "hook.log")], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while not (pids_file.exists() and len(pids_file.read_text().split()) == 2):
            assert flow.poll() is None and time.monotonic() < deadline, (tmp_path / "hook.log").read_text()
            time.sleep(0.05)
        pids = [int(p) for p in pids_file.read_text().split()]
        assert all(psutil.pid_exists(p) for p in pids)
        flow.send_signal(signal.SIGKILL)
        flow.wait()
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in pids if _alive(p)], "the hook outlived its flow"
    finally:
        if flow.poll() is None:
            flow.kill()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
