"""OpenAI-compatible HTTP backend (vLLM serve, llama.cpp server, hosted APIs).

Two transports: a lean HTTP/1.1 client (`backends.http_client`; default, because client CPU is
the throughput bottleneck) and the official `openai` SDK, used when configured and for any answer
the lean client does not handle (redirects, compressed bodies).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from backends.base import LLM
from backends.config import LLMConfig
from backends.errors import BackendError, kind_for_status, parse_retry_after
from backends.http_client import HTTPClient, Unsupported
from backends.types import ChatRequest, Completion, ToolCall, split_usage

log = logging.getLogger("trajforge.backends")

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


def parse_body(body: bytes) -> list[Completion]:
    """A chat-completions response body -> Completions; anything unreadable is a retryable `malformed`."""
    try:
        return parse_response(orjson.loads(body))
    except (orjson.JSONDecodeError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise BackendError("malformed", f"unparseable response body ({type(exc).__name__})") from None


class _Server:
    """One endpoint's transport: the lean HTTP client, or the SDK once asked for or needed."""

    def __init__(self, base_url: str, key: str | None, transport: str):
        self.base_url = base_url
        self.key = key
        self.sdk: Any = None
        self.http: HTTPClient | None = None
        self.use_sdk = not (transport == "http" and base_url.startswith(("http://", "https://")))
        if not self.use_sdk:
            headers = {"Content-Type": "application/json"}
            if key:
                headers["Authorization"] = f"Bearer {key}"
            self.http = HTTPClient(base_url + "/chat/completions", headers)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
        if self.sdk is not None:
            await self.sdk.close()
            self.sdk = None


class OpenAILLM(LLM):
    backend_name = "openai"

    def __init__(self, config: LLMConfig):
        super().__init__(config)
        self._servers = [
            _Server((ep.base_url or "https://api.openai.com/v1").rstrip("/"), ep.api_key(config.api_key_env),
                    config.transport)
            for ep in config.endpoint_list()
        ]
        if any(server.use_sdk for server in self._servers):
            # Import (slow) now, not inside the first request's timeout window; the SDK loads its
            # chat resources lazily, on first use.
            import openai.resources.chat  # noqa: F401

    # ---- lean HTTP transport ------------------------------------------------------------------

    async def _complete(self, request: ChatRequest) -> list[Completion]:
        return await self._complete_at(0, request)

    async def _complete_at(self, endpoint: int, request: ChatRequest) -> list[Completion]:
        server = self._servers[endpoint]
        if server.use_sdk or server.http is None:
            return await self._complete_sdk(server, request)
        body = orjson.dumps(build_payload(self.config.model, request))
        try:
            resp = await server.http.post(body)
        except Unsupported as exc:
            log.info("%s from %s: using the openai SDK transport from now on", exc, self.redact(server.base_url))
            server.use_sdk = True
            return await self._complete_sdk(server, request)
        except OSError as exc:  # refused, reset or cut-off connections; the request may be resent
            raise BackendError("connection", self.redact(f"{type(exc).__name__}: {exc}")) from None
        if resp.status != 200:
            raise BackendError(
                kind_for_status(resp.status),
                self.redact(f"HTTP {resp.status}: {resp.body[:500].decode('utf-8', 'replace')}"),
                status=resp.status,
                retry_after=parse_retry_after(resp.headers.get("retry-after")),
            )
        return parse_body(resp.body)

    # ---- openai SDK transport -----------------------------------------------------------------

    def _get_sdk(self, server: _Server) -> Any:
        if server.sdk is None:
            import openai

            server.sdk = openai.AsyncOpenAI(
                base_url=server.base_url,
                api_key=server.key or "EMPTY",
                max_retries=0,  # retries belong to the shared layer, which also adapts concurrency
                timeout=self.config.request_timeout_s,
                http_client=openai.DefaultAioHttpClient(),
            )
        return server.sdk

    async def _complete_sdk(self, server: _Server, request: ChatRequest) -> list[Completion]:
        import openai

        payload = build_payload(self.config.model, request)
        extra = {k: payload.pop(k) for k in list(payload) if k not in _SDK_PARAMS and k not in
                 ("model", "messages", "n", "tools", "tool_choice", "response_format")}
        try:
            raw = await self._get_sdk(server).chat.completions.with_raw_response.create(**payload, extra_body=extra or None)
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
        # Parse the raw body ourselves: same code path as the lean transport, and malformed
        # bodies surface as retryable errors instead of SDK validation exceptions.
        return parse_body(raw.content)

    async def _close(self) -> None:
        for server in self._servers:
            await server.close()
