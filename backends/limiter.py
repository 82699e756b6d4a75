"""Adaptive (AIMD) bound on one server's in-flight requests, plus the retry backoff schedule."""

from __future__ import annotations

import random


class AdaptiveLimiter:
    """A concurrency limit that halves on overload and grows by one after a run of successes.

    It only counts: waiting for a free slot is the balancer's job (`backends.balancer`), which
    asks `free` before it `take`s. Each take returns the current epoch; an overload signal only
    halves the limit if it comes from a request admitted in the current epoch, so one burst of
    429s (all caused by the same over-commitment) halves once instead of collapsing the limit
    to the minimum.
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

    @property
    def free(self) -> int:
        return self.limit - self.in_flight

    def take(self) -> int:
        self.in_flight += 1
        return self.epoch

    def release(self) -> None:
        self.in_flight -= 1

    def on_success(self) -> bool:
        """Count a success; True when the limit grew (a waiter may now get a slot)."""
        self._streak += 1
        if self._streak >= self.increase_after and self.limit < self.maximum:
            self.limit += 1
            self._streak = 0
            return True
        return False

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
