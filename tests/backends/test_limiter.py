"""AIMD concurrency: halves on overload (once per burst), grows back after successes; the
balancer's slots bound what is in flight."""

from __future__ import annotations

import asyncio
import random

from backends.balancer import Balancer, EndpointState
from backends.limiter import AdaptiveLimiter, backoff_delay


def _one_server(limit: int) -> Balancer:
    return Balancer([EndpointState(0, "only", 1.0, AdaptiveLimiter(limit, 1, limit), 1.0)])


def test_halves_once_per_epoch_and_respects_minimum():
    lim = AdaptiveLimiter(initial=16, minimum=2, maximum=16, increase_after=3)
    epochs = [lim.take() for _ in range(10)]
    for e in epochs:  # a burst of 429s from requests admitted together
        lim.on_overload(e)
        lim.release()
    assert lim.limit == 8 and lim.decreases == 1
    for _ in range(5):
        lim.on_overload(lim.epoch)
    assert lim.limit == 2 and lim.lowest == 2
    for _ in range(9):
        lim.on_success()
    assert lim.limit == 5
    for _ in range(100):
        lim.on_success()
    assert lim.limit == 16


def test_bounds_in_flight():
    async def go():
        bal = _one_server(3)
        lim = bal.endpoints[0].limiter
        peak = 0

        async def work():
            nonlocal peak
            ep, _ = await bal.acquire()
            peak = max(peak, lim.in_flight)
            await asyncio.sleep(0.001)
            bal.succeeded(ep)

        await asyncio.gather(*(work() for _ in range(50)))
        assert peak == 3 and lim.in_flight == 0

    asyncio.run(go())


def test_cancelled_waiter_does_not_leak_a_slot():
    async def go():
        bal = _one_server(1)
        ep, _ = await bal.acquire()
        waiter = asyncio.ensure_future(bal.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        bal.succeeded(ep)
        await asyncio.sleep(0)
        assert ep.limiter.in_flight == 0
        await asyncio.wait_for(bal.acquire(), 1)

    asyncio.run(go())


def test_backoff_full_jitter_and_retry_after_floor():
    rng = random.Random(0)
    delays = [backoff_delay(3, 0.1, 10, None, rng) for _ in range(200)]
    assert 0 <= min(delays) and max(delays) <= 0.8 and max(delays) > 0.5
    assert all(backoff_delay(10, 0.1, 2.0, None, rng) <= 2.0 for _ in range(50))
    assert all(backoff_delay(0, 0.1, 2.0, 1.5, rng) >= 1.5 for _ in range(50))


def test_shrinks_under_429_and_grows_back(fake_server, client):
    srv = fake_server(latency=0.02, capacity=4, retry_after=0.0)

    async def go():
        async with client(
            srv, max_concurrency=32, min_concurrency=1, concurrency_increase_after=4, max_retries=20,
        ) as llm:
            await asyncio.gather(*(llm.chat([{"role": "user", "content": f"a{i}"}]) for i in range(150)))
            shrunk, lowest = llm.limiter.limit, llm.limiter.lowest
            srv.config.capacity = None  # the server frees up: the limit should climb again
            await asyncio.gather(*(llm.chat([{"role": "user", "content": f"b{i}"}]) for i in range(300)))
            return shrunk, lowest, llm.limiter.limit, llm.stats

    shrunk, lowest, grown, stats = asyncio.run(go())
    assert lowest <= 8, f"limit never shrank below 8 (lowest {lowest})"
    assert stats.failures == 0 and stats.retries > 0
    assert grown > shrunk + 10
    assert grown == 32 or grown > 2 * lowest
