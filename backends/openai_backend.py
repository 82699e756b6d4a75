"""OpenAI-compatible HTTP backend (vLLM serve, llama.cpp server, hosted APIs).

Two transports: a lean bare-aiohttp hot path (default; client CPU is the throughput bottleneck)
and the official `openai` SDK, kept for servers/features where its handling matters.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from backends.base import LLM
from backends.config import LLMConfig
from backends.errors import BackendError, kind_for_status, parse_retry_after
from backends.types import ChatRequest, Completion, ToolCall, split_usage

# Parameters the SDK accepts as keyword arguments; anything else must travel in extra_body.
_SDK_PARAMS = frozenset(
    {"temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "stop", "presence_penalty",
     "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "user", "parallel_tool_calls"}
)


def build_payload(model: str, request: ChatRequest) -> dict[str, Any]:
    payload: dict[str, Any] = {"model": model, "messages": request.messages, **request.params}
    if request.n != 1:
        payload["n"] = request.n
    if request.tools:
        payload["tools"] = request.tools
    if request.tool_choice is not None:
        payload["tool_choice"] = request.tool_choice
    if request.response_format is not None:
        payload["response_format"] = request.response_format
    return payload


def parse_response(body: dict[str, Any]) -> list[Completion]:
    """Chat-completions JSON -> Completions. KeyError/TypeError means a malformed body."""
    choices = sorted(body["choices"], key=lambda c: c.get("index", 0))
    usage = body.get("usage") or {}
    usages = split_usage(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0, len(choices))
    out = []
    for choice, u in zip(choices, usages):
        msg = choice["message"]
        calls = [
            ToolCall(tc.get("id") or "", tc["function"]["name"], tc["function"].get("arguments") or "{}")
            for tc in msg.get("tool_calls") or ()
        ]
        out.append(Completion(msg.get("content") or "", calls, choice.get("finish_reason"), u))
    return out


class OpenAILLM(LLM):
    backend_name = "openai"

    def __init__(self, config: LLMConfig):
        super().__init__(config)
        base = (config.base_url or "https://api.openai.com/v1").rstrip("/")
        self._url = base + "/chat/completions"
        self._base_url = base
        key = config.api_key()
        # Built once: per-request dict work is measurable at hundreds of requests per second.
        self._headers = {"Content-Type": "application/json"}
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._session: aiohttp.ClientSession | None = None
        self._sdk: Any = None
        if config.transport == "openai":
            # Import (slow) now, not inside the first request's timeout window.
            import openai  # noqa: F401

    # ---- aiohttp transport --------------------------------------------------------------------

    def _get_session(self) -> aiohttp.ClientSession:
        # A session is bound to the loop it was made in; a client reused under a new
        # asyncio.run() needs a fresh one.
        if self._session is None or self._session.closed or self._session._loop is not asyncio.get_running_loop():
            # No connector limit and no aiohttp timeout: the shared limiter and asyncio.timeout
            # already bound both, and a second layer would only add per-request overhead.
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None), skip_auto_headers=("User-Agent",)
            )
        return self._session

    async def _complete(self, request: ChatRequest) -> list[Completion]:
        if self.config.transport == "openai":
            return await self._complete_sdk(request)
        body = orjson.dumps(build_payload(self.config.model, request))
        try:
            async with self._get_session().post(self._url, data=body, headers=self._headers) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise BackendError(
                        kind_for_status(resp.status),
                        self.redact(f"HTTP {resp.status}: {raw[:500].decode('utf-8', 'replace')}"),
                        status=resp.status,
                        retry_after=parse_retry_after(resp.headers.get("Retry-After")),
                    )
        except aiohttp.ClientError as exc:
            # Covers refused/dropped connections and payload errors; the request may be resent.
            raise BackendError("connection", self.redact(f"{type(exc).__name__}: {exc}")) from None
        try:
            return parse_response(orjson.loads(raw))
        except (orjson.JSONDecodeError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise BackendError("malformed", f"unparseable response body ({type(exc).__name__})") from None

    # ---- openai SDK transport -----------------------------------------------------------------

    def _get_sdk(self) -> Any:
        if self._sdk is None:
            import openai

            self._sdk = openai.AsyncOpenAI(
                base_url=self._base_url,
                api_key=self.config.api_key() or "EMPTY",
                max_retries=0,  # retries belong to the shared layer, which also adapts concurrency
                timeout=self.config.request_timeout_s,
                http_client=openai.DefaultAioHttpClient(),
            )
        return self._sdk

    async def _complete_sdk(self, request: ChatRequest) -> list[Completion]:
        import openai

        payload = build_payload(self.config.model, request)
        extra = {k: payload.pop(k) for k in list(payload) if k not in _SDK_PARAMS and k not in
                 ("model", "messages", "n", "tools", "tool_choice", "response_format")}
        try:
            raw = await self._get_sdk().chat.completions.with_raw_response.create(**payload, extra_body=extra or None)
        except openai.APIStatusError as exc:
            raise BackendError(
                kind_for_status(exc.status_code),
                self.redact(f"HTTP {exc.status_code}: {exc.message}"),
                status=exc.status_code,
                retry_after=parse_retry_after(exc.response.headers.get("retry-after")),
            ) from None
        except openai.APITimeoutError:
            raise BackendError("timeout", "SDK request timed out") from None
        except openai.APIConnectionError as exc:
            raise BackendError("connection", self.redact(f"connection error: {exc}")) from None
        # Parse the raw body ourselves: same code path as the aiohttp transport, and malformed
        # bodies surface as retryable errors instead of SDK validation exceptions.
        try:
            return parse_response(orjson.loads(raw.content))
        except (orjson.JSONDecodeError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise BackendError("malformed", f"unparseable response body ({type(exc).__name__})") from None

    async def _close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        if self._sdk is not None:
            await self._sdk.close()
            self._sdk = None
        await asyncio.sleep(0)  # let aiohttp finish closing transports before the loop ends
