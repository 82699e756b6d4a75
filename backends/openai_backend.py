"""OpenAI-compatible HTTP backend (vLLM serve, llama.cpp server, hosted APIs).

Two transports: a lean HTTP/1.1 client (`backends.http_client`; default, because client CPU is
the throughput bottleneck) and the official `openai` SDK, used when configured and for any answer
the lean client does not handle (redirects, compressed bodies).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from backends.base import LLM
from backends.config import LLMConfig
from backends.errors import REFUSED, BackendError, kind_for_status, parse_retry_after
from backends.http_client import HTTPClient, Unsupported
from backends.scoring import ScoringUnsupported, TokenLogprob, parse_prompt_logprobs
from backends.types import ChatRequest, Completion, TokenIds, ToolCall, Usage, split_usage

log = logging.getLogger("trajforge.backends")

# Parameters the SDK accepts as keyword arguments; anything else must travel in extra_body.
_SDK_PARAMS = frozenset(
    {"temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "stop", "presence_penalty",
     "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "user", "parallel_tool_calls"}
)


def build_payload(model: str, request: ChatRequest, token_ids: bool = False) -> dict[str, Any]:
    """The request body; `token_ids` asks vLLM's extensions for the prompt and completion ids and the
    completion's logprobs (outside `request.params`: the cache key stays that of the answer)."""
    payload: dict[str, Any] = {"model": model, "messages": request.messages, **request.params}
    if token_ids:
        payload["return_token_ids"] = True
        payload.setdefault("logprobs", True)
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
    prompt_ids = body.get("prompt_token_ids")
    usage = body.get("usage") or {}
    usages = split_usage(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0, len(choices))
    out = []
    for choice, u in zip(choices, usages):
        msg = choice["message"]
        calls = [
            ToolCall(tc.get("id") or "", tc["function"]["name"], tc["function"].get("arguments") or "{}")
            for tc in msg.get("tool_calls") or ()
        ]
        content, refusal = msg.get("content") or "", msg.get("refusal")
        # A model's refusal (OpenAI's `refusal` field) is no answer to train on: marked, asked again.
        unusable = f"{REFUSED}: {refusal}" if refusal and not content and not calls else None
        out.append(Completion(content or refusal or "", calls, choice.get("finish_reason"), u, unusable=unusable,
                              tokens=_token_ids(prompt_ids, choice)))
    return out


def _token_ids(prompt_ids: Any, choice: dict[str, Any]) -> TokenIds | None:
    """vLLM's token truth of a choice: the response's `prompt_token_ids`, the choice's `token_ids`, and the
    logprob of each from `logprobs.content` (dropped unless there is one per id); None without ids."""
    ids = choice.get("token_ids")
    if prompt_ids is None or ids is None:
        return None
    content = (choice.get("logprobs") or {}).get("content")
    logprobs = [float(e["logprob"]) for e in content] if isinstance(content, list) and len(content) == len(ids) \
        else None
    return TokenIds([int(i) for i in prompt_ids], [int(i) for i in ids], logprobs)


def refused_tool_call(status: int, body: Any) -> BackendError | None:
    """The error for a 400 that refuses the model's own tool call (code `tool_use_failed`, as Groq and
    others answer when the generated call does not parse), else None. It is an unusable answer, not a
    bad request: retried like one, and carrying the refused generation as the answer's text."""
    if status != 400:
        return None
    if isinstance(body, (bytes, str)):
        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
    error = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(error, dict) or error.get("code") != "tool_use_failed":
        return None
    err = BackendError("refused", f"{REFUSED} tool call: {str(error.get('message') or 'tool_use_failed')[:300]}",
                       status=status)
    err.failed_generation = str(error.get("failed_generation") or "")  # type: ignore[attr-defined]
    return err


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
        # Whether requests ask for token ids (vLLM's `return_token_ids`); None until `asks_token_ids` knows.
        self.token_ids: bool | None = None
        self.probing = asyncio.Lock()
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

    async def _complete(self, request: ChatRequest) -> list[Completion]:
        return await self._complete_at(0, request)

    async def _complete_at(self, endpoint: int, request: ChatRequest) -> list[Completion]:
        server = self._servers[endpoint]
        payload = build_payload(self.config.model, request, await self._asks_token_ids(server))
        try:
            body = await self._send(server, payload)
        except BackendError as err:
            if err.kind == "refused":  # the refused generation is the answer, marked unusable
                answer = Completion(getattr(err, "failed_generation", ""), [], None, Usage(), unusable=str(err))
                err.completions = [answer] * request.n  # type: ignore[attr-defined]
            raise
        return parse_body(body)

    async def _asks_token_ids(self, server: _Server) -> bool:
        """Whether requests to `server` ask for token ids: `llm.token_ids` on/off, or under "auto" whether the
        server says it is vLLM (its /models `owned_by`), asked once it answers: a hosted API may refuse unknown
        fields. The question takes at most half the request's timeout; an unreachable server is asked again."""
        if server.token_ids is None:
            mode = self.config.token_ids
            if mode != "auto":
                server.token_ids = mode == "on"
            else:
                async with server.probing:
                    if server.token_ids is None:
                        known = await asyncio.to_thread(serves_token_ids, server.base_url, server.key,
                                                        min(10.0, self.config.request_timeout_s / 2))
                        if known is None:
                            return False
                        server.token_ids = known
                        log.info("%s %s token ids", self.redact(server.base_url),
                                 "is a vLLM server: asked for" if known else "does not say it is vLLM: no")
        return server.token_ids

    async def _prompt_logprobs(self, request: ChatRequest) -> list[TokenLogprob]:
        return await self._prompt_logprobs_at(0, request)

    async def _prompt_logprobs_at(self, endpoint: int, request: ChatRequest) -> list[TokenLogprob]:
        """vLLM's `prompt_logprobs` (the request's params carry it); other servers ignore or refuse it."""
        server = self._servers[endpoint]
        try:
            body = await self._send(server, build_payload(self.config.model, request))
        except BackendError as err:
            if err.status in (400, 422):  # hosted APIs refuse unknown parameters
                raise ScoringUnsupported(f"{self.redact(server.base_url)} refused prompt_logprobs: {err}") from None
            raise
        try:
            entries = orjson.loads(body).get("prompt_logprobs")
        except (orjson.JSONDecodeError, AttributeError):
            raise BackendError("malformed", "unparseable response body") from None
        if entries is None:
            raise ScoringUnsupported(f"{self.redact(server.base_url)} returned no prompt_logprobs: the server does "
                                     "not support vLLM's prompt_logprobs parameter")
        return parse_prompt_logprobs(entries)

    # ---- lean HTTP transport ------------------------------------------------------------------

    async def _send(self, server: _Server, payload: dict[str, Any]) -> bytes:
        """POST one chat-completions payload to `server`; the response body of a 200 answer."""
        if server.use_sdk or server.http is None:
            return await self._send_sdk(server, payload)
        body = orjson.dumps(payload)
        try:
            resp = await server.http.post(body)
        except Unsupported as exc:
            log.info("%s from %s: using the openai SDK transport from now on", exc, self.redact(server.base_url))
            server.use_sdk = True
            return await self._send_sdk(server, payload)
        except OSError as exc:  # refused, reset or cut-off connections; the request may be resent
            raise BackendError("connection", self.redact(f"{type(exc).__name__}: {exc}")) from None
        if resp.status != 200:
            if (refused := refused_tool_call(resp.status, resp.body)) is not None:
                raise refused
            raise BackendError(
                kind_for_status(resp.status),
                self.redact(f"HTTP {resp.status}: {resp.body[:500].decode('utf-8', 'replace')}"),
                status=resp.status,
                retry_after=parse_retry_after(resp.headers.get("retry-after")),
            )
        return resp.body

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

    async def _send_sdk(self, server: _Server, payload: dict[str, Any]) -> bytes:
        import openai

        payload = dict(payload)
        extra = {k: payload.pop(k) for k in list(payload) if k not in _SDK_PARAMS and k not in
                 ("model", "messages", "n", "tools", "tool_choice", "response_format")}
        try:
            raw = await self._get_sdk(server).chat.completions.with_raw_response.create(**payload, extra_body=extra or None)
        except openai.APIStatusError as exc:
            if (refused := refused_tool_call(exc.status_code, exc.body)) is not None:
                raise refused from None
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
        # The raw body is parsed by the caller: same code path as the lean transport, and malformed
        # bodies surface as retryable errors instead of SDK validation exceptions.
        return raw.content

    async def _close(self) -> None:
        for server in self._servers:
            await server.close()


def serves_token_ids(base: str, key: str | None, timeout_s: float = 10.0) -> bool | None:
    """Whether the server at `base` lists a model `owned_by` vLLM on `GET /models` (vLLM answers
    `return_token_ids`); None when it cannot be reached (asked again later), False for any other answer."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(base + "/models", headers={"Authorization": f"Bearer {key}"} if key else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout_s) as resp:
            models = orjson.loads(resp.read()).get("data") or []
    except urllib.error.HTTPError:
        return False
    except OSError:  # refused, unknown host, timed out: the endpoint is down, not known to be something else
        return None
    except (ValueError, AttributeError):
        return False
    return any(isinstance(m, dict) and m.get("owned_by") == "vllm" for m in models)


def endpoint_problem(config: LLMConfig, timeout_s: float = 10.0) -> str | None:
    """Why the configured OpenAI-compatible endpoints cannot serve a job (None when one answers).

    One cheap `GET {base_url}/models` per endpoint before a job starts, so a wrong or unreachable
    URL is one line instead of every task failing: not an http(s) URL, no connection (refused,
    unknown host, timeout), or credentials refused (401/403). Any other answer, 404 included (some
    servers have no /models), counts as reachable. With several endpoints, one that answers is
    enough (the others are taken out and probed during the job); the line names them all. Keys go
    only in the Authorization header and are redacted from what is said.
    """
    from backends.redact import Redactor

    redact = Redactor(config.api_keys())
    problems = []
    for ep in config.endpoint_list():
        problem = _endpoint_problem((ep.base_url or "https://api.openai.com/v1").rstrip("/"),
                                    ep.api_key(config.api_key_env), ep.api_key_env or config.api_key_env,
                                    redact, timeout_s)
        if problem is None:
            return None
        problems.append(problem)
    return "; ".join(problems)


def _endpoint_problem(base: str, key: str | None, key_env: str | None, redact: Any, timeout_s: float) -> str | None:
    import urllib.error
    import urllib.parse
    import urllib.request

    url = urllib.parse.urlsplit(base)
    if url.scheme not in ("http", "https") or not url.hostname:
        return f"llm.base_url {redact(base)!r} is not an http(s) URL (e.g. http://localhost:8000/v1)"
    try:
        url.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        return f"llm.base_url {redact(base)!r} is malformed ({exc})"
    request = urllib.request.Request(base + "/models", headers={"Authorization": f"Bearer {key}"} if key else {})
    # No proxies from the environment: the job's own clients do not use them either.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout_s):
            return None
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return f"llm.base_url {redact(base)}: the server refused the credentials (HTTP {exc.code}; " \
                   f"check {key_env or 'the API key'})"
        return None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"llm.base_url {redact(base)}: cannot reach the server ({redact(str(reason))})"
