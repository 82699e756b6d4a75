"""Adaptive (AIMD) bound on in-flight requests, plus the retry backoff schedule."""

from __future__ import annotations

import asyncio
import random
from collections import deque


class AdaptiveLimiter:
    """A semaphore whose size halves on overload and grows by one after a run of successes.

    Each acquire returns the current epoch; an overload signal only halves the limit if it comes
    from a request admitted in the current epoch, so one burst of 429s (all caused by the same
    over-commitment) halves once instead of collapsing the limit to the minimum.
    """

    def __init__(self, initial: int, minimum: int, maximum: int, increase_after: int = 16):
        self.limit = max(minimum, min(initial, maximum))
        self.minimum = minimum
        self.maximum = maximum
        self.increase_after = increase_after
        self.in_flight = 0
        self.epoch = 0
        self.decreases = 0
        self.lowest = self.limit
        self._streak = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> int:
        if self.in_flight < self.limit and not self._waiters:
            self.in_flight += 1
            return self.epoch
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # a slot was handed to us just as we were cancelled
            else:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            raise
        return self.epoch

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self.in_flight += 1
                fut.set_result(None)

    def on_success(self) -> None:
        self._streak += 1
        if self._streak >= self.increase_after and self.limit < self.maximum:
            self.limit += 1
            self._streak = 0
            self._wake()

    def on_overload(self, epoch: int) -> None:
        self._streak = 0
        if epoch != self.epoch:
            return
        self.epoch += 1
        new = max(self.minimum, self.limit // 2)
        if new < self.limit:
            self.limit = new
            self.decreases += 1
            self.lowest = min(self.lowest, new)


def backoff_delay(attempt: int, base: float, cap: float, retry_after: float | None, rng: random.Random) -> float:
    """Exponential backoff with full jitter; a server's Retry-After is a floor, never shortened."""
    delay = rng.uniform(0.0, min(cap, base * (2**attempt)))
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay
