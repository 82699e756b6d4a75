"""A crash inside llama.cpp (a real SIGSEGV in the engine process) never takes a job down silently or hangs it.

The fault is injected the way a bad native build shows it: a `sitecustomize` on the engine's PYTHONPATH makes
`Llama.create_chat_completion` read address 0 in the engine process only (counted across restarts in a file, so a
crash can come after N good generations), and the process dies of SIGSEGV inside the call.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from backends import make_llm
from backends.errors import EngineCrashed
from schemas.store import Dataset
from tests.cli_errors import one_error_line

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.local_llm,
    pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp is not importable"),
]

SITECUSTOMIZE = '''
import os, sys
_counter = os.environ.get("ENGINE_FAULT_COUNTER")
if _counter and "backends.llamacpp_engine" in sys.orig_argv:
    import ctypes
    import llama_cpp

    _real = llama_cpp.Llama.create_chat_completion

    def _faulty(self, *args, **kwargs):
        with open(_counter, "a") as f:
            f.write("x")
        calls = os.path.getsize(_counter)
        crash = os.environ["ENGINE_FAULT"]
        if crash == "always" or (crash == "first" and calls == 1) or (crash.startswith("after:") and calls > int(crash[6:])):
            ctypes.string_at(0)
        return _real(self, *args, **kwargs)

    llama_cpp.Llama.create_chat_completion = _faulty
'''


def fault_env(tmp_path: Path, mode: str) -> dict[str, str]:
    """The environment of a process whose llama.cpp engines crash as `mode` says (always, first, after:N)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "ENGINE_FAULT": mode, "ENGINE_FAULT_COUNTER": str(tmp_path / f"calls-{mode.replace(':', '')}")}


def engines_of(marker: str) -> list[psutil.Process]:
    """Engine processes (anyone's child or an orphan) started with this test's fault counter in their environment."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "backends.llamacpp_engine" in (proc.info["cmdline"] or []) and \
                    proc.environ().get("ENGINE_FAULT_COUNTER") == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def chat_once() -> str:
    async def go() -> str:
        async with make_llm({"backend": "llamacpp", "max_tokens": 4, "temperature": 0.0, "max_retries": 0}) as llm:
            [answer] = await llm.chat([{"role": "user", "content": "Say hello."}])
            return answer.text

    return asyncio.run(go())


def test_a_crash_on_every_try_raises_one_clear_error_and_leaves_no_engine(tmp_path, monkeypatch):
    env = fault_env(tmp_path, "always")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(EngineCrashed) as caught:
        chat_once()
    message = str(caught.value)
    assert "llama.cpp engine" in message and "SIGSEGV" in message and "twice" in message
    assert ".gguf" in message and "re-run resumes" in message
    assert Path(env["ENGINE_FAULT_COUNTER"]).read_text() == "xx"  # asked once, then once more of a fresh engine
    assert engines_of(env["ENGINE_FAULT_COUNTER"]) == []


def test_one_crash_is_survived_by_a_fresh_engine(tmp_path, monkeypatch, caplog):
    env = fault_env(tmp_path, "first")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert chat_once().strip()
    assert Path(env["ENGINE_FAULT_COUNTER"]).read_text() == "xx"
    assert any("starting it again" in r.getMessage() and "SIGSEGV" in r.getMessage() for r in caplog.records)
    assert engines_of(env["ENGINE_FAULT_COUNTER"]) == []  # closed with the backend


def _cli(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=REPO, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout)


class _Result:
    """A finished CLI process in the shape tests/cli_errors.py reads."""

    def __init__(self, done: subprocess.CompletedProcess[str]) -> None:
        self.exit_code = done.returncode
        self.output = done.stdout + done.stderr
        self.exception = None


def test_generate_stops_in_one_line_and_a_rerun_finishes_the_rest(tmp_path):
    """`trajforge generate` on the embedded model: the engine crashes after the first task's answer; the run stops
    with one line and exit 1, the finished task is kept, no engine is left, and the re-run does only the rest."""
    config = yaml.safe_load((REPO / "configs" / "rollout_retail.yaml").read_text())
    config["llm"] = {**config["llm"], "max_tokens": 8, "n_ctx": 2048}
    # One model call per task: one action, and an unusable answer ends the episode.
    config.update(max_steps=1, max_parse_failures=1, agent_mode="text", unit_tasks=1, concurrency=1)
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    env = fault_env(tmp_path, "after:1")
    args = ["generate", "--method", "rollout", "--config", str(path), "--output", str(out)]
    line = one_error_line(_Result(_cli(args, env)), "llama.cpp engine", "SIGSEGV", "re-run resumes")
    assert "twice" in line
    assert engines_of(env["ENGINE_FAULT_COUNTER"]) == []
    assert Dataset.open(out).count() == 1  # the first task's unit was committed before the crash

    done = _cli(args, {k: v for k, v in env.items() if not k.startswith("ENGINE_FAULT")})
    assert done.returncode == 0, done.stderr
    records = list(Dataset.open(out).iter_records())
    assert len(records) == len({r.id for r in records}) == 2  # nothing lost, nothing twice


@pytest.mark.parametrize("command", ["eval", "run"])
def test_eval_and_run_report_a_crashed_engine_in_one_line(tmp_path, command):
    env = fault_env(tmp_path, "always")
    llm = {"backend": "llamacpp", "max_tokens": 8, "n_ctx": 2048, "max_retries": 0, "seed": 0}
    if command == "eval":
        config = {"llm": llm, "env": "retail", "env_config": {"seed": 0}, "tasks": {"n": 1, "seed": 0},
                  "max_steps": 1, "max_parse_failures": 1, "samples": 1}
        args = ["eval", "--config", "CONFIG", "--output", str(tmp_path / "out"), "--split", "all"]
    else:
        config = {"output": str(tmp_path / "out"), "llm": llm, "generate": [
            {"name": "rollout", "method": "rollout", "env": "retail", "env_config": {"seed": 0},
             "tasks": {"n": 1, "seed": 0}, "max_steps": 1, "max_parse_failures": 1, "concurrency": 1,
             "unit_tasks": 1}]}
        args = ["run", "CONFIG"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    args = [str(path) if a == "CONFIG" else a for a in args]
    done = _cli(args, {**env, "PREFECT_HOME": str(tmp_path / "prefect")})
    one_error_line(_Result(done), "llama.cpp engine", "SIGSEGV")
    assert engines_of(env["ENGINE_FAULT_COUNTER"]) == []
    assert json.dumps(done.stderr).count("Traceback") == 0
