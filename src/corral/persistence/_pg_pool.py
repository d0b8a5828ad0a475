"""`SharedPool`: a `PostgresStore`'s connections, shared by its writer and its reads.

An idle host's loops (lease renewal, the journal tail, its progress and registry
rounds) each run a statement now and then, and sometimes two or three at once: with a
plain pool each such overlap opened one more connection, kept while it was used again
within the pool's idle lifetime (an idle host held three or more). Here a caller that
finds every open connection busy waits its turn (first come, first served) for one to
come back, and has the pool open another only after waiting `PATIENCE`: idle
statements take a millisecond, so an idle host keeps one pooled connection, while
under load the pool grows as before, each new connection one `PATIENCE` later. The
pool closes what a burst opened once it goes unused (`IDLE_LIFETIME`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any

import asyncpg  # type: ignore[import-untyped, import-not-found, unused-ignore]

from corral._deadline import Expired, within

from ._housekeeping import in_housekeeping

__all__ = ["HOUSEKEEPING_PATIENCE", "IDLE_LIFETIME", "PATIENCE", "SharedPool"]

IDLE_LIFETIME = 10.0
"""Seconds a pooled connection stays open unused (the pool keeps its first one)."""

PATIENCE = 0.05
"""Seconds a caller waits for a busy connection before the pool opens another."""

HOUSEKEEPING_PATIENCE = 1.0
"""The same for a host's housekeeping (`_housekeeping`): an idle host's statements never
open a second pooled connection, while a lease renewal (every third of a lease term)
still waits far less than its term."""


class SharedPool:
    """Hands out the connections of an asyncpg `pool`, growing it only when needed."""

    def __init__(self, pool: Any, *, timeout: float) -> None:
        self._pool = pool
        self._timeout = timeout
        self._out = 0  # connections handed out and not given back
        self._turns: collections.deque[asyncio.Future[None]] = collections.deque()
        self._promised = 0  # connections given back to a waiter that has not taken it

    async def acquire(self) -> Any:
        """A connection: an idle open one, else the first to come back within
        `PATIENCE` (callers served in order), else a new one.

        In housekeeping, the first to come back within `HOUSEKEEPING_PATIENCE` even if
        another is idle: the host's rounds then keep to one connection, and one a
        burst opened goes unused and closes (two idle ones, each taken by the round
        that overlapped another, both stayed open for good)."""
        patient = in_housekeeping()
        if self._out and (patient or self._turns
                          or self._pool.get_idle_size() <= self._promised):
            turn = asyncio.get_running_loop().create_future()
            self._turns.append(turn)
            try:
                # `within`, not `asyncio.wait_for`: before Python 3.12 that lost a
                # cancellation coming as the turn came (a host's close then hung).
                with contextlib.suppress(Expired):
                    await within(asyncio.shield(turn),
                                 HOUSEKEEPING_PATIENCE if patient else PATIENCE)
            finally:
                if turn.done():
                    self._promised -= 1  # its connection is taken now, below
                else:
                    turn.cancel()
                    self._turns.remove(turn)
        self._out += 1
        try:
            return await self._pool.acquire(timeout=self._timeout)
        except BaseException:
            self._given_back()
            raise

    async def release(self, conn: Any) -> None:
        """Give `conn` back (reset); one that cannot be reset is terminated, and the
        reason raised (it is given back either way: never `terminate` it after)."""
        try:
            await self._pool.release(conn, timeout=self._timeout)
        except BaseException:
            with contextlib.suppress(asyncpg.InterfaceError):
                conn.terminate()
            raise
        finally:
            self._given_back()

    def terminate(self, conn: Any) -> None:
        """End `conn` (lost, or not reusable); the pool reconnects its slot when next
        needed."""
        try:
            with contextlib.suppress(asyncpg.InterfaceError):  # released already
                conn.terminate()
        finally:
            self._given_back()

    def _given_back(self) -> None:
        self._out -= 1
        if self._turns:  # the next caller in line takes it
            self._promised += 1
            self._turns.popleft().set_result(None)
