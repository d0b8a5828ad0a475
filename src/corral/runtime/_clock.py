"""The host's sense of time: the system clock, or a virtual one for tests.

Everything that decides *when* something happens for an entity reads time here:
durable timers and `wait_for(timeout=...)` deadlines, idle time before passivation,
acceptance times (the dedupe window's age) and `Entity.now()`. Leases and store
housekeeping stay on real time: they are about processes being alive, not entities.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Any, Protocol

from corral._deadline import Expired, within

__all__ = ["Clock", "SystemClock", "VirtualClock"]


class Clock(Protocol):
    """What the host asks of a clock."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch (what durable timers are stored in)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (idle times, in-memory deadlines)."""
        ...

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        """Wait for `event` at most `timeout` seconds of this clock; whether it was set."""
        ...


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        try:  # never loses a cancellation: the host stopping an entity awaits its run()
            await within(event.wait(), timeout)
        except Expired:
            return False
        return True


class VirtualClock:
    """A clock that moves only when told to (`corral.testing` drives it).

    Waits with a timeout park on a heap of virtual deadlines; `fire_due` resolves those
    due by the current virtual time, earliest first.
    """

    def __init__(self, start: float | None = None) -> None:
        self._start = time.time() if start is None else start
        self._elapsed = 0.0
        self._deadlines: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self._start + self._elapsed

    def monotonic(self) -> float:
        return self._elapsed

    def set_time(self, wall: float) -> None:
        """Move to the wall time `wall` (never backwards)."""
        self._elapsed = max(self._elapsed, wall - self._start)

    def next_deadline(self) -> float | None:
        """The wall time of the earliest pending in-memory deadline, if any."""
        while self._deadlines and self._deadlines[0][2].done():
            heapq.heappop(self._deadlines)
        return self._start + self._deadlines[0][0] if self._deadlines else None

    def fire_due(self) -> int:
        """Resolve every deadline due by now; how many fired."""
        fired = 0
        while self._deadlines and self._deadlines[0][0] <= self._elapsed:
            _, _, due = heapq.heappop(self._deadlines)
            if not due.done():
                due.set_result(None)
                fired += 1
        return fired

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        if timeout is None:
            await event.wait()
            return True
        if timeout <= 0:
            return event.is_set()
        due: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._deadlines, (self._elapsed + timeout, next(self._order), due))
        waiter: asyncio.Future[Any] = asyncio.ensure_future(event.wait())
        either: set[asyncio.Future[Any]] = {waiter, due}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            return waiter.done() and not waiter.cancelled()
        finally:
            waiter.cancel()
            due.cancel()
