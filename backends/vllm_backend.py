"""In-process vLLM backend: concurrent requests are gathered into batched `LLM.chat` calls.

Optional (`pip install 'trajforge[vllm]'`, needs a GPU). For a shared server, prefer
`vllm serve MODEL` with the `openai` backend instead (see docs/llm.md).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from backends.base import LLM
from backends.config import LLMConfig
from backends.emulation import prepare, to_completion
from backends.errors import BackendError
from backends.types import ChatRequest, Completion, TokenIds, Usage

INSTALL_HINT = (
    "the vllm backend needs vLLM: pip install 'trajforge[vllm]' "
    "(or run `vllm serve MODEL` and use backend: openai with base_url http://HOST:8000/v1)"
)


def _structured_kwargs(schema: dict[str, Any]) -> dict[str, Any]:
    """Guided JSON decoding; the parameter was renamed across vLLM releases."""
    try:
        from vllm.sampling_params import StructuredOutputsParams

        return {"structured_outputs": StructuredOutputsParams(json=schema)}
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        return {"guided_decoding": GuidedDecodingParams(json=schema)}


class VLLMLLM(LLM):
    backend_name = "vllm"
    local = True  # in process: no bill

    def __init__(self, config: LLMConfig):
        super().__init__(config)
        try:
            import vllm
        except ImportError:
            raise ImportError(INSTALL_HINT) from None
        self._engine = vllm.LLM(model=config.model_path or config.model, seed=config.seed or 0)
        self._pending: list[tuple[ChatRequest, asyncio.Future[list[Completion]]]] = []
        self._worker: asyncio.Task[None] | None = None

    async def _complete(self, request: ChatRequest) -> list[Completion]:
        fut: asyncio.Future[list[Completion]] = asyncio.get_running_loop().create_future()
        self._pending.append((request, fut))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        # Everything that queued while the previous batch ran becomes the next batch: the engine
        # schedules a batch far better than one request at a time.
        while self._pending:
            batch, self._pending = self._pending, []
            live = [(r, f) for r, f in batch if not f.done()]  # skip requests that timed out
            if not live:
                continue
            try:
                results = await asyncio.to_thread(self._generate, [r for r, _ in live])
            except Exception as exc:
                for _, f in live:
                    if not f.done():
                        f.set_exception(BackendError("server", f"vLLM generation failed: {type(exc).__name__}: {exc}"))
                continue
            for (_, f), result in zip(live, results):
                if not f.done():
                    if isinstance(result, BackendError):
                        f.set_exception(result)
                    else:
                        f.set_result(result)

    def _generate(self, requests: list[ChatRequest]) -> list[list[Completion] | BackendError]:
        from vllm import SamplingParams

        conversations, sampling, tool_flags = [], [], []
        for r in requests:
            messages, schema, tool_call = prepare(r)
            p = r.params
            extra = _structured_kwargs(schema) if schema is not None else {}
            stop = p.get("stop")
            sampling.append(
                SamplingParams(
                    n=r.n, temperature=p.get("temperature", 1.0), top_p=p.get("top_p", 1.0),
                    max_tokens=p.get("max_tokens", 512), seed=p.get("seed"),
                    stop=[stop] if isinstance(stop, str) else stop,
                    # 0: the logprob of each sampled token only (the token truth of `llm.token_ids`).
                    logprobs=None if self.config.token_ids == "off" else 0, **extra,
                )
            )
            conversations.append(messages)
            tool_flags.append(tool_call)
        outputs = self._engine.chat(conversations, sampling_params=sampling, use_tqdm=False)
        results: list[list[Completion] | BackendError] = []
        for out, tool_call in zip(outputs, tool_flags):
            # A bad emulated tool call comes back marked unusable: the wrapper asks again for that request only.
            results.append([
                replace(to_completion(
                    o.text, o.finish_reason,
                    Usage(len(out.prompt_token_ids or ()) if i == 0 else 0, len(o.token_ids)), tool_call,
                ), tokens=TokenIds(list(out.prompt_token_ids or ()), list(o.token_ids), _sampled_logprobs(o)))
                for i, o in enumerate(out.outputs)
            ])
        return results


def _sampled_logprobs(output: Any) -> list[float] | None:
    """The logprob of each token a vLLM `CompletionOutput` sampled (its `logprobs`: one dict per token,
    token id -> Logprob), or None when not asked for."""
    if not output.logprobs:
        return None
    return [float(step[token].logprob) for token, step in zip(output.token_ids, output.logprobs)]
