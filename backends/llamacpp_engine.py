"""The embedded model's engine process: llama-cpp-python loaded in a child of its own.

llama.cpp is native code: a crash in it (a CPU path it was built for and the machine mishandles, a bug in a kernel)
kills the process it runs in. Run in the trajforge process, such a crash took a whole job down without a word, and
under pytest-xdist it took workers down and hung the run. Here it kills only this child: the parent
(`backends/llamacpp_backend.py`) sees the pipe close, names the model and the signal in one line, and the job ends
resumable. Served over a pipe rather than llama-cpp-python's OpenAI server because the backend records what that
server cannot give: the exact prompt ids llama.cpp fed and the ids and logprobs it sampled (token-exact RL).

The protocol is one request at a time: the parent sends `(op, payload)` and reads back `("ok", result)` or
`("error", exception type, message)`. The child ends when the pipe closes, on `close`, or when its parent is gone.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

def serve(conn: Connection, options: dict[str, Any]) -> None:
    """The child's main: load the model, say it is ready (with what the parent needs to know), answer requests."""
    _exit_with_parent(os.getppid())
    import llama_cpp

    llama = llama_cpp.Llama(model_path=options["model_path"], n_ctx=options["n_ctx"], n_threads=options["n_threads"],
                            seed=options["seed"], verbose=False)
    recorder = TokenRecorder(llama) if options["record_tokens"] else None
    engine = _Engine(llama, recorder, options)
    conn.send(("ready", {"chat_template": llama.metadata.get("tokenizer.chat_template"),
                         "system_info": system_info(), "version": llama_cpp.__version__}))
    while True:
        try:
            op, payload = conn.recv()
        except EOFError:  # the parent closed its end (or died)
            return
        if op == "close":
            conn.send(("ok", None))
            return
        try:
            result = getattr(engine, op)(**payload)
        except Exception as exc:  # noqa: BLE001 - handed back to the parent, which classifies it
            conn.send(("error", type(exc).__name__, str(exc)))
        else:
            conn.send(("ok", result))


def system_info() -> str:
    """What the loaded llama.cpp build uses on this CPU (`llama_print_system_info`): AVX2 = 1 | AMX_INT8 = 1 | ..."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()


def _exit_with_parent(parent: int) -> None:
    """End this process when its parent is gone (killed with -9 mid-generation, say): a daemon thread watches the
    parent pid; the pipe's EOF covers the idle case, this the busy one. Not PR_SET_PDEATHSIG: that fires when the
    parent *thread* that started the child ends, which an LLM made in a worker thread would outlive."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class _Engine:
    def __init__(self, llama: Any, recorder: TokenRecorder | None, options: dict[str, Any]) -> None:
        self.llama = llama
        self.recorder = recorder
        self.options = options
        # Scoring needs the logits of every prompt position (logits_all), which slows generation and holds
        # n_ctx x vocabulary floats: a second instance of the same weights, made on first use.
        self.scorer: Any = None

    def complete(self, messages: list[dict[str, Any]], kwargs: dict[str, Any], n: int) -> list[dict[str, Any]]:
        """`n` generations of the chat (llama.cpp has no n): text, finish reason, usage and the recorded tokens."""
        out = []
        for i in range(n):
            if i and "seed" in kwargs:
                kwargs = {**kwargs, "seed": kwargs["seed"] + 1}  # the same seed would repeat sample 0
            if self.recorder is not None:
                self.recorder.start()
            resp = self.llama.create_chat_completion(messages=messages, **kwargs)
            choice = resp["choices"][0]
            out.append({"content": choice["message"].get("content") or "", "finish_reason": choice.get("finish_reason"),
                        "usage": resp.get("usage") or {},
                        "tokens": self.recorder.tokens() if self.recorder is not None else None})
        return out

    def score(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The chat template applied to the messages, then llama.cpp's echoed logprobs of the prompt."""
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        if self.scorer is None:
            self.scorer = llama_cpp.Llama(model_path=self.options["model_path"], n_ctx=self.options["n_ctx"],
                                          logits_all=True, n_threads=self.options["n_threads"], verbose=False)
        scorer = self.scorer
        template = scorer.metadata.get("tokenizer.chat_template")
        if not template:
            return {"template": None}
        special = {name: scorer.detokenize([tok], special=True).decode("utf-8", "replace")
                   for name, tok in (("eos_token", scorer.token_eos()), ("bos_token", scorer.token_bos()))}
        prompt = Jinja2ChatFormatter(template, **special)(messages=messages).prompt
        resp = scorer.create_completion(prompt, max_tokens=1, logprobs=1, echo=True, temperature=0.0)
        logprobs = resp["choices"][0]["logprobs"]
        n = len(logprobs["tokens"]) - int((resp.get("usage") or {}).get("completion_tokens", 1))
        return {"template": template, "tokens": [str(t) for t in logprobs["tokens"][:n]],
                "logprobs": [None if lp is None else float(lp) for lp in logprobs["token_logprobs"][:n]]}


class TokenRecorder:
    """What llama.cpp fed and produced in one generation: the prompt ids `generate` was given (as llama.cpp
    formatted and tokenized the chat, special tokens and all), every token `sample` returned (the end token
    too, which llama-cpp-python's answer leaves out), and each one's logprob under the model's raw logits.

    It wraps the two methods on the instance: llama-cpp-python hands out neither the ids nor (without
    `logits_all`, which slows every generation) their logprobs.
    """

    def __init__(self, llama: Any) -> None:
        self.prompt: list[int] | None = None
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        generate, sample = llama.generate, llama.sample

        def recorded_generate(tokens: Any, *args: Any, **kwargs: Any) -> Any:
            self.prompt = list(tokens)
            return generate(tokens, *args, **kwargs)

        def recorded_sample(*args: Any, idx: int | None = None, **kwargs: Any) -> int:
            row = idx - llama.n_tokens if idx is not None else -1  # as `Llama.sample` reads the logits
            logits = np.ctypeslib.as_array(llama._ctx.get_logits_ith(row), shape=(llama.n_vocab(),)).astype(np.float64)
            token = sample(*args, idx=idx, **kwargs)
            top = logits.max()
            self.ids.append(int(token))
            self.logprobs.append(float(logits[token] - top - np.log(np.exp(logits - top).sum())))
            return token

        llama.generate, llama.sample = recorded_generate, recorded_sample

    def start(self) -> None:
        self.prompt, self.ids, self.logprobs = None, [], []

    def tokens(self) -> list[Any] | None:
        return None if self.prompt is None else [self.prompt, self.ids, self.logprobs]


def main(fd: int) -> None:
    """Entry point of `python -m backends.llamacpp_engine FD`: FD is this end of the parent's socket pair, whose
    first message is the options."""
    import faulthandler
    import signal

    faulthandler.enable()  # a crash leaves its native and Python stack in the engine's stderr (the parent's log)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    conn = Connection(fd)
    serve(conn, conn.recv())


if __name__ == "__main__":
    main(int(sys.argv[1]))
