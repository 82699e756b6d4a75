"""A real OpenAI-compatible HTTP server with scripted answers, latency, capacity and faults.

Used in-process by tests (`with FakeServer(cfg) as srv: srv.base_url`) and as a standalone
process by the benchmark (`python -m backends.fake_server --port N`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

FAULT_KINDS = ("429", "500", "stall", "malformed", "truncated", "disconnect")
# Faults of the model's answer rather than of the server, drawn only when asked for by name:
# `garbage` answers a tool call whose arguments are not JSON (text requests get unparseable text),
# `refused` answers HTTP 400 `tool_use_failed` with the generation the server could not parse.
ANSWER_FAULTS = ("garbage", "refused")
ALL_FAULT_KINDS = FAULT_KINDS + ANSWER_FAULTS
GARBAGE_TEXT = "}{ <tool_call>{\"name\": "
REFUSED_MESSAGE = "Failed to call a function. Please adjust your prompt. See 'failed_generation' for more details."
# Header names that may carry credentials; never logged.
_SECRET_HEADER = re.compile(r"auth|key|cookie|token", re.IGNORECASE)


@dataclass(slots=True)
class ToolCallAnswer:
    name: str
    arguments: dict[str, Any] | str


class Samples(list):  # type: ignore[type-arg]
    """One answer per sample of an n-sample request (sample i gets item i mod len)."""


@dataclass(slots=True)
class Fault:
    """An answer that is a failure: one of FAULT_KINDS, or an HTTP status code as a string."""

    kind: str
    retry_after: float | None = None
    answer: Any = None  # what a "truncated" or "stall" fault answers (cut, or late)
    message: str | None = None  # error body text for HTTP faults


@dataclass
class Rule:
    """Answer requests whose last user message matches (substring or compiled regex), or ask `fn`.

    `answer` may be text, a dict/list (sent as JSON text), a ToolCallAnswer or a Fault; `fn`
    gets the request JSON and returns such an answer or None (no match). `times` limits how
    often the rule fires (e.g. only the first answer is invalid).
    """

    match: str | re.Pattern[str] | None = None
    answer: Any = None
    fn: Callable[[dict[str, Any]], Any] | None = None
    times: int | None = None
    used: int = 0

    def try_answer(self, body: dict[str, Any], last_user: str) -> Any:
        if self.times is not None and self.used >= self.times:
            return None
        if self.match is not None:
            hit = self.match.search(last_user) if isinstance(self.match, re.Pattern) else self.match in last_user
            if not hit:
                return None
        answer = self.fn(body) if self.fn is not None else self.answer
        if answer is not None:
            self.used += 1
        return answer


@dataclass
class FakeServerConfig:
    latency: float | tuple[float, float] = 0.0  # fixed seconds, or (low, high) uniform, seeded
    capacity: int | None = None  # concurrent requests beyond this get 429 + Retry-After
    retry_after: float = 1.0
    fault_rate: float = 0.0
    faults: tuple[str, ...] = FAULT_KINDS
    stall_s: float = 30.0  # a "stall" fault sleeps this long (choose > client timeout)
    seed: int = 0
    reject_json_schema: bool = False  # answer 400 to response_format json_schema
    rules: list[Rule] = field(default_factory=list)
    model: str = "fake-model"
    # What /models says owns the model: "vllm" (the default) tells clients it answers vLLM's extensions.
    owned_by: str = "vllm"
    keep_log: bool = True
    log_path: str | None = None
    # vLLM's `prompt_logprobs`: when a request asks for them, the answer carries one entry per prompt
    # token (whitespace-split contents between chat markers), each with this logprob: a number, or
    # fn(request JSON) -> number. None: the parameter is ignored, as servers other than vLLM do.
    prompt_logprob: float | Callable[[dict[str, Any]], float] | None = -1.0
    # vLLM's `return_token_ids` (and `logprobs`): scripted ids of word-and-space pieces (`_chat_pieces`: a prompt
    # renders each earlier answer as it was generated, so a conversation's prompts extend each other as a real
    # template's do), each piece's ids `tokenize(piece)` (default: one id, a hash), the i-th completion token's
    # logprob `completion_logprob(i)`. A real tokenizer's `tokenize` gives ids that decode to the text.
    tokenize: Callable[[str], list[int]] = field(default=lambda piece: [zlib.crc32(piece.encode()) % 49_152])
    completion_logprob: Callable[[int], float] = field(default=lambda i: -((i % 8) + 1) / 16)


def _last_user(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return m["content"]
    return ""


class FakeServer:
    def __init__(self, config: FakeServerConfig | None = None, **kwargs: Any):
        self.config = config or FakeServerConfig(**kwargs)
        self.log: list[dict[str, Any]] = []  # every request: body, outcome (no credentials)
        self.in_flight = 0
        self.max_in_flight = 0
        self._rng = random.Random(self.config.seed)
        self._log_file = open(self.config.log_path, "ab") if self.config.log_path else None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    # ---- app ----------------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        data = {"object": "list", "data": [{"id": self.config.model, "object": "model", "owned_by": self.config.owned_by}]}
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    def _record(self, entry: dict[str, Any]) -> None:
        # Memory log at arrival (tests can watch in-flight requests); file log once the outcome is known.
        if self.config.keep_log:
            self.log.append(entry)

    def _flush(self, entry: dict[str, Any]) -> None:
        if self._log_file is not None:
            self._log_file.write(orjson.dumps(entry) + b"\n")
            self._log_file.flush()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        cfg = self.config
        raw = await request.read()
        entry: dict[str, Any] = {
            "t": time.time(),
            "headers": {str(k): v for k, v in request.headers.items() if not _SECRET_HEADER.search(k)},
            # Whether credentials were sent, without recording them.
            "has_auth": "Authorization" in request.headers,
            "outcome": "pending",
        }
        try:
            body = orjson.loads(raw)
            messages = body["messages"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            entry["outcome"] = "400"
            self._record(entry)
            self._flush(entry)
            return _error(400, "invalid request body")
        entry["body"] = body
        self._record(entry)
        try:
            if cfg.capacity is not None and self.in_flight >= cfg.capacity:
                entry["outcome"] = "429-capacity"
                return _error(429, "over capacity", retry_after=cfg.retry_after)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                return await self._answer(request, body, messages, entry)
            finally:
                self.in_flight -= 1
        finally:
            self._flush(entry)

    async def _answer(
        self, request: web.Request, body: dict[str, Any], messages: list[dict[str, Any]], entry: dict[str, Any]
    ) -> web.StreamResponse:
        cfg = self.config
        rf = body.get("response_format") or {}
        if cfg.reject_json_schema and rf.get("type") == "json_schema":
            entry["outcome"] = "400-json_schema"
            return _error(400, "response_format json_schema is not supported")
        last_user = _last_user(messages)
        answer: Any = None
        for rule in cfg.rules:
            answer = rule.try_answer(body, last_user)
            if answer is not None:
                break
        fault: str | None = None
        retry_after = cfg.retry_after
        message: str | None = None
        if isinstance(answer, Fault):
            fault, message = answer.kind, answer.message
            retry_after = answer.retry_after if answer.retry_after is not None else retry_after
            answer = answer.answer
        elif cfg.fault_rate and self._rng.random() < cfg.fault_rate:
            fault = self._rng.choice(cfg.faults)
        latency = cfg.latency if not isinstance(cfg.latency, tuple) else self._rng.uniform(*cfg.latency)
        if latency > 0:
            await asyncio.sleep(latency)

        if fault == "429":
            entry["outcome"] = "429"
            return _error(429, message or "rate limited", retry_after=retry_after)
        if fault == "stall":
            entry["outcome"] = "stall"
            await asyncio.sleep(cfg.stall_s)
        elif fault == "disconnect":
            entry["outcome"] = "disconnect"
            assert request.transport is not None
            request.transport.abort()
            raise asyncio.CancelledError  # nothing more to send on a dead connection
        elif fault == "malformed":
            entry["outcome"] = "malformed"
            return web.Response(body=b'{"id": "chatcmpl-broken", "choices": [{"index": 0, "mess', content_type="application/json")
        elif fault == "refused":
            entry["outcome"] = "refused"
            tool = ((body.get("tools") or [{}])[0].get("function") or {}).get("name", "tool")
            return web.Response(status=400, content_type="application/json", body=orjson.dumps({"error": {
                "message": REFUSED_MESSAGE, "type": "invalid_request_error", "code": "tool_use_failed",
                "failed_generation": f"<function={tool}>{GARBAGE_TEXT}"}}))
        elif fault == "garbage":
            tools = body.get("tools") or []
            answer = ToolCallAnswer(tools[0]["function"]["name"], GARBAGE_TEXT) if tools else GARBAGE_TEXT
            entry["outcome"] = "garbage"
        elif fault is not None and fault.isdigit():
            entry["outcome"] = fault
            return _error(int(fault), message or f"injected HTTP {fault}", retry_after=retry_after if fault == "429" else None)

        n = int(body.get("n") or 1)
        truncated = fault == "truncated"
        per_sample = answer if isinstance(answer, Samples) and answer else [answer]
        choices = [_choice(i, per_sample[i % len(per_sample)], last_user, truncated) for i in range(n)]
        prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in messages)
        completion_tokens = sum(len((c["message"]["content"] or "").split()) + 1 for c in choices)
        payload = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", cfg.model),
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        if body.get("prompt_logprobs") is not None and cfg.prompt_logprob is not None:
            value = cfg.prompt_logprob(body) if callable(cfg.prompt_logprob) else cfg.prompt_logprob
            payload["prompt_logprobs"] = prompt_logprobs(messages, float(value))
        if body.get("return_token_ids"):
            payload["prompt_token_ids"] = entry["prompt_token_ids"] = [
                i for p in _chat_pieces(messages) for i in cfg.tokenize(p)]
            for c in choices:
                pieces = [*re.findall(r"\S+|\s+", _answer_text(c["message"])), "<|im_end|>"]
                c["token_ids"] = [i for p in pieces for i in cfg.tokenize(p)]
                if body.get("logprobs"):
                    c["logprobs"] = {"content": [{"token": str(t), "logprob": cfg.completion_logprob(i), "bytes": None,
                                                  "top_logprobs": []} for i, t in enumerate(c["token_ids"])]}
            entry["token_ids"] = [c["token_ids"] for c in choices]
        if entry["outcome"] == "pending":
            entry["outcome"] = "truncated" if truncated else "ok"
        entry["answers"] = [c["message"] for c in choices]  # what was answered, for checks against records
        return web.Response(body=orjson.dumps(payload), content_type="application/json")

    # ---- in-process lifecycle -----------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, host: str = "127.0.0.1", port: int = 0) -> FakeServer:
        """Serve from a background thread with its own event loop, so a test's loop stays free."""
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                self._runner, self.port = loop.run_until_complete(self._start_site(host, port))
            except BaseException as exc:  # surface bind errors to the caller
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-llm-server", daemon=True)
        self._thread.start()
        ready.wait()
        if errors:
            raise errors[0]
        return self

    async def _start_site(self, host: str, port: int) -> tuple[web.AppRunner, int]:
        # handler_cancellation: when a client times out and hangs up, its stalled handler ends.
        runner = web.AppRunner(self.make_app(), access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, host, port, backlog=1024)
        await site.start()
        bound = runner.addresses[0][1]
        return runner, bound

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- log helpers for assertions -----------------------------------------------------------

    def asked(self, outcome: str | None = None) -> list[str]:
        """Last user message of every logged request (optionally only those with `outcome`)."""
        return [
            _last_user(e["body"]["messages"])
            for e in list(self.log)
            if "body" in e and (outcome is None or e["outcome"] == outcome)
        ]


def _error(status: int, message: str, retry_after: float | None = None) -> web.Response:
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else None
    body = orjson.dumps({"error": {"message": message, "type": "fake_error", "code": status}})
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def _prompt_pieces(messages: list[dict[str, Any]]) -> list[str]:
    """The fake tokens of a ChatML-like rendering: `<|im_start|>role\n`, the content in word and space
    tokens, `<|im_end|>\n`."""
    pieces: list[str] = []
    for m in messages:
        pieces.append(f"<|im_start|>{m.get('role', 'user')}\n")
        pieces += re.findall(r"\S+|\s+", str(m.get("content") or ""))
        pieces.append("<|im_end|>\n")
    return pieces


def _chat_pieces(messages: list[dict[str, Any]]) -> list[str]:
    """The fake tokens of a prompt the model answers: per message `<|im_start|>role\n`, its text (an assistant
    message as `_answer_text` writes it), `<|im_end|>`, `\n`; then the generation prompt `<|im_start|>assistant\n`."""
    pieces: list[str] = []
    for m in messages:
        text = _answer_text(m) if m.get("role") == "assistant" else str(m.get("content") or "")
        pieces += [f"<|im_start|>{m.get('role', 'user')}\n", *re.findall(r"\S+|\s+", text), "<|im_end|>", "\n"]
    return [*pieces, "<|im_start|>assistant\n"]


def _answer_text(message: dict[str, Any]) -> str:
    """An answer as a model would have written it: its text, then each tool call in a `<tool_call>` block, its
    arguments written as a chat template's `tojson` writes them (a client may re-serialize them in the next
    request: the same rendering keeps the conversation's prompts extending each other)."""
    calls = [f"<tool_call>{json.dumps({'name': c['function']['name'], 'arguments': _arguments(c)})}</tool_call>"
             for c in message.get("tool_calls") or ()]
    return "\n".join([message.get("content") or "", *calls]).strip()


def _arguments(call: dict[str, Any]) -> Any:
    text = call["function"].get("arguments") or "{}"
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON (a garbage answer): as written


def prompt_logprobs(messages: list[dict[str, Any]], logprob: float) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM-shaped prompt logprobs of the fake tokens of `_prompt_pieces`; the first token has none, every other
    `logprob`."""
    return [None if i == 0 else {str(i): {"logprob": logprob, "rank": 1, "decoded_token": p}}
            for i, p in enumerate(_prompt_pieces(messages))]


def _choice(index: int, answer: Any, last_user: str, truncated: bool) -> dict[str, Any]:
    if isinstance(answer, ToolCallAnswer):
        args = answer.arguments if isinstance(answer.arguments, str) else orjson.dumps(answer.arguments).decode()
        if truncated:
            args = args[: len(args) // 2]
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"call_{index}_{uuid.uuid4().hex[:8]}", "type": "function",
                 "function": {"name": answer.name, "arguments": args}}
            ],
        }
        return {"index": index, "message": message, "finish_reason": "length" if truncated else "tool_calls"}
    if answer is None:
        text = f"echo[{index}]: {last_user}"
    elif isinstance(answer, (dict, list)):
        text = orjson.dumps(answer).decode()
    else:
        text = str(answer)
    if truncated:
        text = text[: len(text) // 2]
    return {
        "index": index,
        "message": {"role": "assistant", "content": text},
        "finish_reason": "length" if truncated else "stop",
    }


def serve_forever(
    host: str = "127.0.0.1",
    port: int = 8000,
    latency: float | tuple[float, float] = 0.0,
    capacity: int | None = None,
    fault_rate: float = 0.0,
    faults: tuple[str, ...] = FAULT_KINDS,
    seed: int = 0,
    retry_after: float = 1.0,
    stall_s: float = 30.0,
    reject_json_schema: bool = False,
    log_path: str | None = None,
) -> None:
    """Run a standalone fake server until interrupted (entry point for `trajforge fake-server`)."""
    server = FakeServer(
        FakeServerConfig(
            latency=latency, capacity=capacity, fault_rate=fault_rate, faults=tuple(faults), seed=seed,
            retry_after=retry_after, stall_s=stall_s, reject_json_schema=reject_json_schema,
            keep_log=False,  # a long-lived process must not grow without bound; use log_path
            log_path=log_path,
        )
    )

    async def main() -> None:
        runner, bound = await server._start_site(host, port)
        server.port = bound
        # The benchmark waits for this line to know the port (port 0 = pick a free one).
        print(f"fake-server listening on http://{host}:{bound}/v1", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        _run(main())
    except KeyboardInterrupt:
        pass


def _run(coro: Any) -> None:
    # uvloop, when installed, roughly halves the server's per-request CPU: a standalone server
    # sharing 2 cores with the client it measures should cost as little as possible.
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    uvloop.run(coro)


def spawn(*args: str, cwd: str | None = None) -> tuple[subprocess.Popen[str], str]:
    """`python -m backends.fake_server --port 0 ARGS` in its own process (client and server must not
    share one GIL); returns the process and its base URL once it listens. The caller stops it."""
    proc = subprocess.Popen([sys.executable, "-m", "backends.fake_server", "--port", "0", *args],
                            cwd=cwd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"fake server did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[1].strip()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Fake OpenAI-compatible server for tests and benchmarks.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--latency", type=float, default=0.0, help="seconds per request")
    p.add_argument("--latency-max", type=float, default=None, help="if set, latency is uniform in [latency, max]")
    p.add_argument("--capacity", type=int, default=None, help="concurrent requests before 429")
    p.add_argument("--fault-rate", type=float, default=0.0)
    p.add_argument("--faults", default=",".join(FAULT_KINDS), help="comma-separated subset of " + ",".join(ALL_FAULT_KINDS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--retry-after", type=float, default=1.0)
    p.add_argument("--stall-s", type=float, default=30.0)
    p.add_argument("--reject-json-schema", action="store_true")
    p.add_argument("--log-jsonl", default=None)
    a = p.parse_args(argv)
    latency: float | tuple[float, float] = (a.latency, a.latency_max) if a.latency_max is not None else a.latency
    serve_forever(
        a.host, a.port, latency, a.capacity, a.fault_rate, tuple(f for f in a.faults.split(",") if f), a.seed,
        a.retry_after, a.stall_s, a.reject_json_schema, a.log_jsonl,
    )


if __name__ == "__main__":
    main()
