"""The `LLM` interface and the shared wrapper (cache, endpoints and adaptive concurrency, retries, ledger).

Implementations only provide `_complete(request)`: one raw call returning `request.n` samples
(`_complete_at(endpoint, request)` for backends that serve several endpoints).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import re
import time
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any, Awaitable, Callable, ClassVar, TypeVar

import orjson
from pydantic import BaseModel

from backends.balancer import Balancer, EndpointState
from backends.cache import ResponseCache, request_digest, sample_key
from backends.config import LLMConfig
from backends.errors import REFUSED, BackendError, CapabilityError, EngineCrashed, LLMRequestError
from backends.jsonrepair import extract_json
from backends.ledger import FailureLedger
from backends.limiter import AdaptiveLimiter, backoff_delay
from backends.redact import Redactor, endpoint_name
from backends.scoring import ScoringUnsupported, TokenLogprob, decode, encode
from backends.stats import Stats
from backends.types import ChatRequest, Completion, Usage
from schemas.models import Tokens
from schemas.models import Usage as StepUsage

log = logging.getLogger("trajforge.backends")

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def template_hash(template: str) -> str:
    """A chat template's identity in records (`Tokens.chat_template`): the first 16 hex digits of its sha256."""
    return hashlib.sha256(template.encode()).hexdigest()[:16]


class LLM(ABC):
    backend_name: ClassVar[str] = "abstract"
    # Engines that run one generation at a time cap the limiter, so queued requests do not burn
    # their timeout waiting for a lock.
    max_parallel: ClassVar[int | None] = None
    # Engines in this process (no bill): their cost is 0 unless the config prices them.
    local: ClassVar[bool] = False

    def __init__(self, config: LLMConfig):
        self.config = config
        self.stats = Stats(local=self.local)
        if config.price is not None:
            self.stats.price = (config.price.prompt_per_million, config.price.completion_per_million)
        self.redact = Redactor(config.api_keys())
        self.ledger = FailureLedger(config.ledger_path, self.redact)
        self.cache = ResponseCache(config.cache_path) if config.cache_path else None
        self.balancer = self._balancer(config)
        if len(self.balancer.endpoints) > 1:
            self.stats.endpoints = {ep.name: ep.stats for ep in self.balancer.endpoints}
        self._defaults = config.sampling_params()
        self._inflight: dict[str, asyncio.Future[Completion]] = {}
        self._rng = random.Random()
        # Flipped once a server rejects json_schema response formats; remembered per client.
        self.json_schema_supported = True

    # ---- what implementations provide -------------------------------------------------------

    @abstractmethod
    async def _complete(self, request: ChatRequest) -> list[Completion]:
        """One raw call. Raise BackendError for classified failures."""

    async def _complete_at(self, endpoint: int, request: ChatRequest) -> list[Completion]:
        """One raw call to `config.endpoint_list()[endpoint]`; backends with one server ignore the index."""
        return await self._complete(request)

    async def _close(self) -> None:
        """Release transport/engine resources."""

    async def _prompt_logprobs(self, request: ChatRequest) -> list[TokenLogprob]:
        """One raw scoring call: the logprob of every prompt token. Backends that can score override it."""
        raise ScoringUnsupported(f"the {self.backend_name} backend cannot score prompts (no prompt logprobs)")

    async def _prompt_logprobs_at(self, endpoint: int, request: ChatRequest) -> list[TokenLogprob]:
        """`_prompt_logprobs` at one endpoint, as `_complete_at` is `_complete`."""
        return await self._prompt_logprobs(request)

    # ---- public API ---------------------------------------------------------------------------

    async def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
        n: int = 1,
        **params: Any,
    ) -> list[Completion]:
        """n completions for `messages`. Raises LLMRequestError once given up (after ledgering)."""
        request = self._build(messages, tools, tool_choice, n, params, None)
        try:
            return await self._run(request)
        except BackendError as err:
            raise self._give_up(request, err.kind, str(err), getattr(err, "attempts", 1)) from None

    async def structured(self, messages: list[dict[str, Any]], schema: type[M], **params: Any) -> M | None:
        """A validated `schema` instance, or None (ledgered) after `structured_attempts` bad answers."""
        name = re.sub(r"[^A-Za-z0-9_-]", "_", schema.__name__)[:64] or "answer"
        json_schema = schema.model_json_schema()
        msgs = list(messages)
        problem = "no answer"
        request: ChatRequest | None = None
        for _ in range(self.config.structured_attempts):
            try:
                request, completion = await self._structured_call(msgs, name, json_schema, params)
            except BackendError as err:
                self._give_up(err.request, err.kind, str(err), getattr(err, "attempts", 1))  # type: ignore[attr-defined]
                return None
            try:
                return schema.model_validate(extract_json(completion.text))
            except ValueError as exc:  # pydantic's ValidationError is a ValueError too
                problem = str(exc)[:1000]
                # The error goes back to the model: a retry with the same prompt would hit the cache.
                msgs = msgs + [
                    {"role": "assistant", "content": completion.text},
                    {
                        "role": "user",
                        "content": f"That answer was invalid: {problem}\n"
                        "Reply with only a JSON object that matches the schema.",
                    },
                ]
        assert request is not None
        self._give_up(request, "invalid_structured_output", problem, self.config.structured_attempts)
        return None

    async def prompt_logprobs(self, messages: list[dict[str, Any]]) -> list[TokenLogprob]:
        """The model's log-probability of every token of `messages` (teacher forcing; nothing generated).

        Cached like any call (a re-run asks nothing twice). Raises `ScoringUnsupported` when the
        backend or its server cannot score, `LLMRequestError` when the call is given up.
        """
        request = self._build(messages, None, None, 1, {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1}, None)
        key = self.request_key(request)
        self.stats.requests += 1
        hit = self.cache.get(key) if self.cache is not None else None
        if hit is not None:
            self.stats.cache_hits += 1
            return decode(hit.text)
        try:
            tokens = await self._with_retries(lambda endpoint: self._prompt_logprobs_at(endpoint, request))
        except BackendError as err:
            raise self._give_up(request, err.kind, str(err), getattr(err, "attempts", 1)) from None
        self.stats.prompt_tokens += len(tokens)
        if self.cache is not None:  # the score rides in a completion's text: one cache for every call
            await self.cache.commit([(key, Completion(encode(tokens), finish_reason="prompt_logprobs"))])
        return tokens

    @property
    def model_name(self) -> str:
        """`backend:model`, as records' provenance names the model."""
        return f"{self.backend_name}:{self.config.model}"

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        """What these tokens cost: priced by `llm.price`, 0.0 on a local engine, else None (unknown)."""
        price = self.config.price
        if price is not None:
            return (prompt_tokens * price.prompt_per_million + completion_tokens * price.completion_per_million) / 1e6
        return 0.0 if self.local else None

    def step_usage(self, completion: Completion) -> StepUsage:
        """The usage a step made from `completion` records (a cached answer cost nothing this time)."""
        u = completion.usage
        tokens = self.step_tokens(completion)
        if completion.cached:
            return StepUsage(model=self.model_name, prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                             latency_s=0.0, retries=0, cost_usd=0.0, cached=True, tokens=tokens)
        return StepUsage(model=self.model_name, prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                         latency_s=round(completion.latency_s, 6), retries=completion.retries,
                         cost_usd=self.cost_usd(u.prompt_tokens, u.completion_tokens), tokens=tokens)

    def step_tokens(self, completion: Completion) -> Tokens | None:
        """The token truth a step records of `completion`: its backend's ids, None when it gave none or
        `llm.token_ids` is off."""
        t = completion.tokens
        if t is None or self.config.token_ids == "off":
            return None
        tokenizer, template = self.token_source()
        return Tokens(prompt_ids=t.prompt_ids, completion_ids=t.completion_ids, logprobs=t.logprobs,
                      tokenizer=tokenizer, chat_template=template)

    def token_source(self) -> tuple[str | None, str | None]:
        """(the tokenizer's name, the sha256 of the chat template that rendered prompts) behind recorded ids.
        A server applies its own template, unseen here: by default the served model names both."""
        return self.config.model, None

    def print_summary(self, console: Any = None) -> None:
        self.stats.print_summary(f"LLM usage ({self.backend_name}:{self.config.model})", console)

    async def aclose(self) -> None:
        await self._close()
        if self.cache is not None:
            self.cache.close()

    async def __aenter__(self) -> LLM:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def limiter(self) -> AdaptiveLimiter:
        """The adaptive limit of the first (usually the only) endpoint."""
        return self.balancer.endpoints[0].limiter

    # ---- wrapper layer ------------------------------------------------------------------------

    def _balancer(self, config: LLMConfig) -> Balancer:
        states = []
        for i, ep in enumerate(config.endpoint_list()):
            cap = ep.max_concurrency or config.max_concurrency
            top = min(cap, self.max_parallel or cap)
            limiter = AdaptiveLimiter(top, min(config.min_concurrency, top), top, config.concurrency_increase_after)
            name = self.redact(endpoint_name(ep.base_url)) if ep.base_url else self.backend_name
            states.append(EndpointState(i, name, ep.weight, limiter, config.endpoint_probe_s))
        return Balancer(states, failures=config.endpoint_failures, probe_s=config.endpoint_probe_s,
                        probe_max_s=config.endpoint_probe_max_s)

    def _build(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tool_choice: Any,
        n: int,
        params: dict[str, Any],
        response_format: dict[str, Any] | None,
    ) -> ChatRequest:
        merged = {**self._defaults, **{k: v for k, v in params.items() if v is not None}} if params else self._defaults
        return ChatRequest(list(messages), merged, tools, tool_choice, response_format, n)

    def _digest(self, request: ChatRequest) -> Any:
        return request_digest(
            backend=self.backend_name,
            model=self.config.model,
            messages=request.messages,
            params=request.params,
            tools=request.tools,
            tool_choice=request.tool_choice,
            response_format=request.response_format,
        )

    def request_key(self, request: ChatRequest, index: int = 0) -> str:
        return sample_key(self._digest(request), index)

    async def _structured_call(
        self, msgs: list[dict[str, Any]], name: str, json_schema: dict[str, Any], params: dict[str, Any]
    ) -> tuple[ChatRequest, Completion]:
        if self.json_schema_supported:
            rf = {"type": "json_schema", "json_schema": {"name": name, "schema": json_schema, "strict": True}}
            request = self._build(msgs, None, None, 1, params, rf)
            try:
                return request, (await self._run(request))[0]
            except BackendError as err:
                if err.status not in (400, 422):
                    err.request = request  # type: ignore[attr-defined]  # ledger key of what failed
                    raise
                log.info("server rejected json_schema response_format; falling back to json_object")
                self.json_schema_supported = False
        request = self._build(msgs, None, None, 1, params, {"type": "json_object", "schema": json_schema})
        try:
            return request, (await self._run(request))[0]
        except BackendError as err:
            err.request = request  # type: ignore[attr-defined]
            raise

    async def _run(self, request: ChatRequest) -> list[Completion]:
        """Serve from cache, join identical in-flight calls, and make one raw call for the rest."""
        self.stats.requests += request.n
        digest = self._digest(request)
        keys = [sample_key(digest, i) for i in range(request.n)]
        results: list[Completion | None] = [None] * request.n
        mine: list[int] = []
        shared: list[tuple[int, asyncio.Future[Completion]]] = []
        for i, key in enumerate(keys):
            hit = self.cache.get(key) if self.cache is not None else None
            if hit is not None:
                self.stats.cache_hits += 1
                self._count_unusable([hit])
                results[i] = hit
            elif (fut := self._inflight.get(key)) is not None:
                shared.append((i, fut))
            else:
                mine.append(i)

        if mine:
            loop = asyncio.get_running_loop()
            futs = [loop.create_future() for _ in mine]
            for i, fut in zip(mine, futs):
                self._inflight[keys[i]] = fut
            try:
                sub = request if len(mine) == request.n else replace(request, n=len(mine))
                completions = await self._call_with_retries(sub)
                if self.cache is not None:  # committed before anyone sees the result
                    await self.cache.commit(zip([keys[i] for i in mine], completions))
                for i, fut, comp in zip(mine, futs, completions):
                    results[i] = comp
                    if not fut.done():
                        fut.set_result(comp)
            except BaseException as exc:
                for fut in futs:
                    if not fut.done():
                        if isinstance(exc, Exception):
                            fut.set_exception(exc)
                            fut.exception()  # mark retrieved: there may be no other waiter
                        else:
                            fut.cancel()
                raise
            finally:
                for i in mine:
                    self._inflight.pop(keys[i], None)

        for i, fut in shared:
            # shield: one waiter being cancelled must not cancel the call others rely on.
            results[i] = await asyncio.shield(fut)
            self.stats.cache_hits += 1
        return results  # type: ignore[return-value]

    async def _call_with_retries(self, request: ChatRequest) -> list[Completion]:
        """The call's answers; sample 0 also carries the tokens, seconds and number of the attempts before."""
        spent = {"prompt": 0, "completion": 0, "seconds": 0.0, "attempts": 0}

        def count(answers: list[Completion]) -> None:
            for c in answers:  # every answer returned was paid for, kept or not
                spent["prompt"] += c.usage.prompt_tokens
                spent["completion"] += c.usage.completion_tokens

        async def call(endpoint: int) -> list[Completion]:
            spent["attempts"] += 1
            started = time.perf_counter()
            try:
                completions = await self._complete_at(endpoint, request)
            except BackendError as err:
                count(getattr(err, "completions", None) or [])
                raise
            finally:
                spent["seconds"] += time.perf_counter() - started
            count(completions)
            return self._validate(request, completions)

        try:
            completions = await self._with_retries(call)
        finally:
            self.stats.prompt_tokens += spent["prompt"]
            self.stats.completion_tokens += spent["completion"]
            self.stats.latency_s += spent["seconds"]
        self._count_unusable(completions)
        kept_prompt = sum(c.usage.prompt_tokens for c in completions)
        kept_completion = sum(c.usage.completion_tokens for c in completions)
        first = completions[0]
        usage = Usage(first.usage.prompt_tokens + spent["prompt"] - kept_prompt,
                      first.usage.completion_tokens + spent["completion"] - kept_completion)
        first = replace(first, usage=usage, latency_s=spent["seconds"], retries=spent["attempts"] - 1)
        return [first, *completions[1:]]

    def _count_unusable(self, completions: list[Completion]) -> None:
        for c in completions:
            if c.unusable is not None or c.finish_reason == "length":
                if c.finish_reason == "length":
                    self.stats.truncated += 1
                else:
                    self.stats.unusable += 1

    async def _with_retries(self, call: Callable[[int], Awaitable[T]]) -> T:
        """`call(endpoint)` in a slot of an endpoint and under the timeout, until one answers.

        A call that fails because its endpoint is down goes at once to another endpoint that has not
        failed it (not a retry: the request did nothing wrong); once every endpoint has, the failure
        counts as an attempt, retried with backoff while it is retryable.
        """
        cfg = self.config
        attempt = 0
        tried: set[int] = set()  # endpoints that failed this request since its last counted attempt
        while True:
            try:
                ep, epoch = await self.balancer.acquire(tried)
            except BackendError as exc:  # no endpoint is live: a failed attempt like any other
                err = exc
            else:
                self.stats.calls += 1
                try:
                    async with asyncio.timeout(cfg.request_timeout_s):
                        value = await call(ep.index)
                except (CapabilityError, EngineCrashed):
                    self.balancer.released(ep)
                    raise
                except Exception as exc:
                    err = self._classify(exc)
                    self.balancer.failed(ep, epoch, err.kind)
                    if self.balancer.can_fail_over(err.kind, tried | {ep.index}):
                        tried.add(ep.index)
                        ep.stats.failed_over += 1
                        self.stats.failovers += 1
                        log.debug("%s failed on %s; resent to another endpoint", err.kind, ep.name)
                        continue
                except BaseException:
                    self.balancer.released(ep)
                    raise
                else:
                    self.balancer.succeeded(ep)
                    return value
            tried.clear()
            if not err.retryable or attempt >= cfg.max_retries:
                answers = getattr(err, "completions", None)
                if answers is not None:
                    # The model answered, unusably (cut short, an unparseable or refused tool call), and
                    # asking again did not help: handed back marked `unusable` (and finish_reason=length
                    # when cut), for the caller to record as a failed answer, never as a whole one.
                    log.warning("answer still unusable after %d attempt(s) (%s): returned as such", attempt + 1, err)
                    return answers  # type: ignore[no-any-return]
                err.attempts = attempt + 1  # type: ignore[attr-defined]
                raise err from None
            delay = backoff_delay(attempt, cfg.backoff_base_s, cfg.backoff_max_s, err.retry_after, self._rng)
            attempt += 1
            self.stats.retries += 1
            log.debug("retry %d after %s (%s); sleeping %.3fs", attempt, err.kind, err, delay)
            await asyncio.sleep(delay)  # outside any slot: waiting must not hold capacity

    def _classify(self, exc: Exception) -> BackendError:
        if isinstance(exc, BackendError):
            return exc
        if isinstance(exc, TimeoutError):
            return BackendError("timeout", f"no answer within {self.config.request_timeout_s}s")
        if isinstance(exc, (ConnectionError, OSError)):
            return BackendError("connection", self.redact(f"{type(exc).__name__}: {exc}"))
        return BackendError("unknown", self.redact(f"{type(exc).__name__}: {exc}"))

    @staticmethod
    def _validate(request: ChatRequest, completions: list[Completion]) -> list[Completion]:
        """The answers, or an error that has them retried instead of cached: broken in transit, or
        unusable (cut short, an unparseable tool call, one the backend marked). Unusable answers
        travel with the error, marked: once the retries are spent they are returned as such (the
        usable samples of the call unmarked), so callers can tell them from whole answers."""
        if len(completions) != request.n:
            raise BackendError("malformed", f"expected {request.n} choices, got {len(completions)}")
        marked, problem = [], None
        for c in completions:
            why = c.unusable
            if c.finish_reason == "length":
                why = "answer cut off at the token limit (finish_reason=length)"
            for call in c.tool_calls if why is None else ():
                try:
                    orjson.loads(call.arguments)
                except orjson.JSONDecodeError:
                    why = f"tool call {call.name!r} has invalid JSON arguments"
                    break
            if why is not None:
                c = replace(c, unusable=why)
                problem = problem or (_unusable_kind(c), why)
            marked.append(c)
        if problem is not None:
            err = BackendError(*problem)
            err.completions = marked  # type: ignore[attr-defined]
            raise err
        return completions

    def _give_up(self, request: ChatRequest, kind: str, message: str, attempts: int) -> LLMRequestError:
        key = self.request_key(request)
        message = self.redact(message)
        self.stats.failures += 1
        self.ledger.record(key, kind, message, attempts, backend=self.backend_name, model=self.config.model)
        log.warning("LLM request %s given up: %s: %s", key[:12], kind, message)
        return LLMRequestError(key, kind, message, attempts)


def _unusable_kind(completion: Completion) -> str:
    """The error kind an unusable answer is retried under."""
    if completion.finish_reason == "length":
        return "truncated"
    return "refused" if (completion.unusable or "").startswith(REFUSED) else "malformed"
