"""Retries, backoff and Retry-After under every injected fault type."""

from __future__ import annotations

import asyncio
import time

import pytest

from backends import LLMRequestError
from backends.fake_server import Fault, Rule, ToolCallAnswer

def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


RETRYABLE_FAULTS = ["429", "500", "502", "503", "408", "409", "stall", "malformed", "disconnect"]


@pytest.mark.parametrize("transport", ["http", "openai"])
@pytest.mark.parametrize("kind", RETRYABLE_FAULTS)
def test_retryable_fault_is_retried_once(fake_server, client, kind, transport):
    srv = fake_server(rules=[Rule(answer=Fault(kind, retry_after=0.0), times=1)], stall_s=2.0, retry_after=0.0)

    async def run():
        # The timeout ends a stalled answer (stall_s 2.0) but must not end a sound one on a loaded machine.
        async with client(srv, request_timeout_s=1.0, transport=transport) as llm:
            out = await llm.chat(user("hello"))
            return out, llm.stats

    out, stats = asyncio.run(run())
    assert out[0].text == "echo[0]: hello"
    assert stats.retries == 1 and stats.calls == 2 and stats.failures == 0
    assert [e["outcome"] for e in srv.log] == [kind, "ok"]


@pytest.mark.parametrize("status", ["400", "401", "403", "404", "422"])
def test_client_errors_are_not_retried(fake_server, client, status, tmp_path):
    srv = fake_server(rules=[Rule(answer=Fault(status))])
    ledger = tmp_path / "ledger.jsonl"

    async def run():
        async with client(srv, ledger_path=str(ledger)) as llm:
            with pytest.raises(LLMRequestError) as info:
                await llm.chat(user("bad"))
            return info.value, llm.stats

    err, stats = asyncio.run(run())
    assert len(srv.log) == 1, "a 4xx other than 408/409/429 must not be repeated"
    assert err.kind == "client" and err.attempts == 1
    assert stats.failures == 1 and stats.retries == 0
    assert ledger.read_text().count("\n") == 1


def test_truncated_tool_call_is_retried(fake_server, client):
    call = ToolCallAnswer("get_weather", {"city": "Paris", "unit": "celsius"})
    srv = fake_server(rules=[Rule(answer=Fault("truncated", answer=call), times=1), Rule(answer=call)])
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]

    async def run():
        async with client(srv) as llm:
            return await llm.chat(user("weather?"), tools=tools)

    out = asyncio.run(run())
    assert out[0].tool_calls[0].name == "get_weather"
    assert out[0].tool_calls[0].arguments == '{"city":"Paris","unit":"celsius"}'
    assert [e["outcome"] for e in srv.log] == ["truncated", "ok"]


def test_retry_after_is_honored(fake_server, client):
    srv = fake_server(rules=[Rule(answer=Fault("429", retry_after=0.6), times=1)])

    async def run():
        async with client(srv, backoff_base_s=0.001, backoff_max_s=0.001) as llm:
            t0 = time.perf_counter()
            await llm.chat(user("x"))
            return time.perf_counter() - t0

    elapsed = asyncio.run(run())
    assert 0.6 <= elapsed < 2.0
    gap = srv.log[1]["t"] - srv.log[0]["t"]
    assert gap >= 0.55


def test_backoff_grows_exponentially(fake_server, client):
    """With full jitter each delay is <= base*2^attempt; max_retries bounds the attempts."""
    srv = fake_server(rules=[Rule(answer=Fault("500"))])

    async def run():
        async with client(srv, max_retries=4, backoff_base_s=0.05, backoff_max_s=10) as llm:
            t0 = time.perf_counter()
            with pytest.raises(LLMRequestError) as info:
                await llm.chat(user("x"))
            return time.perf_counter() - t0, info.value

    elapsed, err = asyncio.run(run())
    assert err.attempts == 5 and len(srv.log) == 5
    assert elapsed < 0.05 * (1 + 2 + 4 + 8) + 1.0


def test_timeout_then_give_up_into_ledger(fake_server, client, tmp_path):
    srv = fake_server(rules=[Rule(answer=Fault("stall"))], stall_s=3.0)
    ledger = tmp_path / "l.jsonl"

    async def run():
        async with client(srv, request_timeout_s=0.2, max_retries=1, ledger_path=str(ledger)) as llm:
            with pytest.raises(LLMRequestError) as info:
                await llm.chat(user("slow"))
            return info.value

    err = asyncio.run(run())
    assert err.kind == "timeout" and err.attempts == 2
    assert '"error_type":"timeout"' in ledger.read_text()
