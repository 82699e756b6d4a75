"""Shared pieces of the crash tests: a deterministic fake agent, cache reading, killing `trajforge` runs."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backends.fake_server import ToolCallAnswer
from tests.conftest import REPO

DONE = "All done successfully. Is there anything else?"
_REF = re.compile(r"ref-([0-9a-f]{16})")


def body_ref(body: dict[str, Any]) -> str:
    """A digest of a request's messages: the same request always has the same ref."""
    return hashlib.sha256(json.dumps(body["messages"], sort_keys=True).encode()).hexdigest()[:16]


def retail_agent(body: dict[str, Any]) -> Any:
    """Two agent turns per task (a tool call, then the final answer), each carrying its request's ref.

    The ref lands in the answer, so the job's response cache tells which requests completed.
    """
    if not body.get("tools"):
        return None
    ref = body_ref(body)
    if not any(m.get("role") == "assistant" for m in body["messages"]):
        return ToolCallAnswer("find_user_id_by_email", {"email": f"ref-{ref}@example.com"})
    return f"{DONE} (ref-{ref})"


def cached_refs(cache: Path) -> set[str]:
    """Refs of every response the job stored in its cache (a killed job's committed rows included)."""
    if not cache.exists():
        return set()
    db = sqlite3.connect(f"file:{cache}?mode=ro", uri=True)
    try:
        values = [v if isinstance(v, str) else bytes(v).decode() for (v,) in db.execute("SELECT value FROM responses")]
    finally:
        db.close()
    return {m for v in values for m in _REF.findall(v)}


def kill_chain(
    *,
    seed: int,
    kills: int,
    start: Callable[[], subprocess.Popen],
    progress: Callable[[], int],
    remaining: Callable[[], int],
    after_kill: Callable[[], None],
    timeout_s: float = 180,
) -> list[str]:
    """Start the job, SIGKILL it once `progress()` advanced by a seeded number of steps, check, repeat.

    `remaining()` is the progress still to make; each kill point is drawn in [1, remaining - 1]
    so it lands inside the job. Returns a log of where each kill landed (for failure messages).
    """
    rng = random.Random(seed)
    history: list[str] = []
    for k in range(kills):
        left = remaining()
        if left < 2:
            history.append(f"kill {k}: nothing left to interrupt")
            break
        target = rng.randint(1, left - 1)
        base = progress()
        proc = start()
        deadline = time.time() + timeout_s
        try:
            while proc.poll() is None and progress() - base < target:
                assert time.time() < deadline, f"kill {k}: no progress to {target} within {timeout_s}s: {history}"
                time.sleep(0.005)
        finally:
            reached = progress() - base
            finished = proc.poll() is not None
            kill9(proc)
        history.append(f"kill {k}: target {target}/{left}, at {reached}" + (" (had already exited)" if finished else ""))
        assert not finished or proc.returncode == 0, f"the job failed on its own: {history}"
        after_kill()
    return history


def cli_env(**extra: str) -> dict[str, str]:
    """Environment of a `trajforge` subprocess: the repository importable, offline libraries."""
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def start_cli(args: list[str], log: Path, **env: str) -> subprocess.Popen:
    """`trajforge ARGS` in its own process group, output to `log` (a pipe could fill and block it)."""
    out = open(log, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "flows.cli", *args], cwd=REPO, env=cli_env(**env),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        out.close()  # the child holds its own copy


def kill9(proc: subprocess.Popen) -> None:
    """SIGKILL the whole process group (Beam and Prefect start helpers) and reap it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
