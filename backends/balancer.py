"""Which server a request goes to: the one with the most free capacity, among those alive.

Every server of a model (an `endpoints:` entry, or the one `base_url`) has its own adaptive
limit (`AdaptiveLimiter`): a 429 from one halves that server's share only. A request waits
(first come, first served) until some server has a free slot, then goes to the live server that
is least loaded relative to its limit and weight (least outstanding requests). With several
servers, one that fails `failures` times in a row (connection refused or cut, timeout, 5xx) is
taken out; after `probe_s` one request is let through as a probe: an answer puts the server
back, another failure doubles the wait (up to `probe_max_s`). A single server is never taken
out: there is nowhere else to send its requests, so the caller's retries decide.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass

from backends.errors import OVERLOAD, BackendError
from backends.limiter import AdaptiveLimiter

log = logging.getLogger("trajforge.backends")

LIVE, OUT, PROBING = "live", "out", "probing"
# Failures that say the server, not the request, is in trouble.
ENDPOINT_FAILURES = frozenset({"connection", "timeout", "server"})


@dataclass(slots=True)
class EndpointStats:
    calls: int = 0  # raw calls sent to it
    ok: int = 0
    failed: int = 0
    failed_over: int = 0  # failed calls resent at once to another endpoint (not counted as retries)
    taken_out: int = 0
    probes: int = 0
    state: str = LIVE


class EndpointState:
    """One server: its limiter, its health and its counts."""

    __slots__ = ("index", "name", "weight", "limiter", "stats", "failures", "retry_at", "cooldown")

    def __init__(self, index: int, name: str, weight: float, limiter: AdaptiveLimiter, probe_s: float):
        self.index = index
        self.name = name
        self.weight = weight
        self.limiter = limiter
        self.stats = EndpointStats()
        self.failures = 0  # consecutive endpoint failures
        self.retry_at = 0.0  # when a server taken out may be probed
        self.cooldown = probe_s

    @property
    def state(self) -> str:
        return self.stats.state

    @state.setter
    def state(self, value: str) -> None:
        self.stats.state = value


Lease = tuple[EndpointState, int]  # the endpoint a call holds a slot of, and its limiter's epoch


class Balancer:
    def __init__(self, endpoints: list[EndpointState], *, failures: int = 3, probe_s: float = 5.0,
                 probe_max_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.endpoints = endpoints
        self.health = len(endpoints) > 1
        self.failures = failures
        self.probe_s = probe_s
        self.probe_max_s = probe_max_s
        self._clock = clock
        self._waiters: deque[tuple[asyncio.Future[Lease], Collection[int]]] = deque()

    # ---- slots --------------------------------------------------------------------------------

    async def acquire(self, exclude: Collection[int] = ()) -> Lease:
        """A slot on the best endpoint not in `exclude`; BackendError("connection") when none is live."""
        if not self._waiters:
            ep = self._pick(exclude)
            if ep is not None:
                return ep, self._take(ep)
        if not self._can_wait(exclude):
            raise self._none_live()
        fut: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        entry = (fut, exclude)
        self._waiters.append(entry)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.released(fut.result()[0])  # a slot was handed to us just as we were cancelled
            else:
                try:
                    self._waiters.remove(entry)
                except ValueError:
                    pass
            raise

    def succeeded(self, ep: EndpointState) -> None:
        ep.limiter.release()
        ep.stats.ok += 1
        ep.failures = 0
        if ep.state == PROBING:
            self._back_in(ep)
        ep.limiter.on_success()
        self._wake()

    def failed(self, ep: EndpointState, epoch: int, kind: str) -> None:
        ep.limiter.release()
        ep.stats.failed += 1
        if kind in OVERLOAD:
            ep.limiter.on_overload(epoch)
        if self.health:
            if kind not in ENDPOINT_FAILURES:
                if ep.state == PROBING:  # it answered (429, a bad body): it is up
                    self._back_in(ep)
            elif ep.state == PROBING:
                ep.cooldown = min(ep.cooldown * 2, self.probe_max_s)
                self._take_out(ep, f"probe failed ({kind}); next try in {ep.cooldown:g}s")
            elif ep.state == LIVE:
                ep.failures += 1
                if ep.failures >= self.failures:
                    ep.stats.taken_out += 1
                    self._take_out(ep, f"{ep.failures} failures in a row (last: {kind}); probing in {ep.cooldown:g}s")
        self._wake()

    def released(self, ep: EndpointState) -> None:
        """A call that ended without an outcome (cancelled): its slot only."""
        ep.limiter.release()
        if ep.state == PROBING:
            ep.state, ep.retry_at = OUT, self._clock()  # the probe is still due
        self._wake()

    def can_fail_over(self, kind: str, tried: Collection[int]) -> bool:
        """Whether a call that failed with `kind` should go at once to another endpoint not in `tried`."""
        if not self.health or kind not in ENDPOINT_FAILURES:
            return False
        now = self._clock()
        return any(ep.index not in tried and (ep.state == LIVE or (ep.state == OUT and now >= ep.retry_at))
                   for ep in self.endpoints)

    # ---- inside -------------------------------------------------------------------------------

    def _pick(self, exclude: Collection[int]) -> EndpointState | None:
        best, best_load = None, 0.0
        for ep in self.endpoints:
            if exclude and ep.index in exclude:
                continue
            if ep.state != LIVE:
                if ep.state == OUT and self._clock() >= ep.retry_at:
                    return ep  # a due probe goes first: it is how a server comes back
                continue
            lim = ep.limiter
            if lim.in_flight >= lim.limit:
                continue
            load = lim.in_flight / (ep.weight * lim.limit)
            if best is None or load < best_load:
                best, best_load = ep, load
        return best

    def _take(self, ep: EndpointState) -> int:
        if ep.state == OUT:
            ep.state = PROBING
            ep.stats.probes += 1
        ep.stats.calls += 1
        return ep.limiter.take()

    def _can_wait(self, exclude: Collection[int]) -> bool:
        """Some endpoint the caller may use will free a slot (or report its probe) eventually."""
        return any(ep.state != OUT for ep in self.endpoints if not (exclude and ep.index in exclude))

    def _none_live(self) -> BackendError:
        now = self._clock()
        soonest = min((ep.retry_at for ep in self.endpoints if ep.state == OUT), default=now)
        out = sum(ep.state == OUT for ep in self.endpoints)
        return BackendError("connection", f"no endpoint left to try ({out} of {len(self.endpoints)} taken out); "
                            f"next probe in {max(0.0, soonest - now):.1f}s")

    def _take_out(self, ep: EndpointState, why: str) -> None:
        ep.state, ep.retry_at = OUT, self._clock() + ep.cooldown
        log.warning("endpoint %s taken out: %s", ep.name, why)

    def _back_in(self, ep: EndpointState) -> None:
        ep.state, ep.failures, ep.cooldown = LIVE, 0, self.probe_s
        log.warning("endpoint %s is back", ep.name)

    def _wake(self) -> None:
        waiters = self._waiters
        i = 0
        while i < len(waiters):
            fut, exclude = waiters[i]
            if fut.done():
                del waiters[i]
                continue
            ep = self._pick(exclude)
            if ep is not None:
                del waiters[i]
                fut.set_result((ep, self._take(ep)))
                continue
            if not self._can_wait(exclude):
                del waiters[i]
                fut.set_exception(self._none_live())
                continue
            if not exclude:
                return  # no slot for a waiter that may use any endpoint: none for those behind it
            i += 1
