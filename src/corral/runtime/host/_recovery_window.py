"""`RecoveryWindow`: how many activations a host's shard recoveries load at once.

A host taking shards (a restart, a takeover, a hand-off) activates their running
entities in the background (`Shard.recover`). Each activation is a few store round trips
(its run, `mark_activated`, its snapshot, its journal), all queued through one SQLite
reader thread or a small PostgreSQL pool: activating ten thousand at once put a message
arriving meanwhile, or an entity with a backlog, behind forty thousand of them (5 s).
The window admits a few at a time, host-wide, the urgent ones (`_reads.URGENT`) before
the rest; what a message, a due timer or a query activates on demand never waits here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

__all__ = ["RECOVERY_WINDOW", "RecoveryWindow"]

RECOVERY_WINDOW = 16
"""Activations a host's recoveries load at once, all its shards together: enough to
keep the store's reader and its group commit busy, few enough that what arrives now is
served after at most this many activations."""


class RecoveryWindow:
    """A bounded number of slots, given to urgent waiters before the others, each kind
    in the order it asked.

    Example:
        async with window.slot(urgent=True):
            ...  # activate, and wait until it loaded
    """

    def __init__(self, size: int | None = None) -> None:
        self.size = RECOVERY_WINDOW if size is None else size
        self._free = self.size
        # Waiters for a slot, urgent first; a slot freed goes to the first one not gone.
        self._waiting: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (
            deque(), deque())

    @contextlib.asynccontextmanager
    async def slot(self, *, urgent: bool) -> AsyncIterator[None]:
        """Hold one slot for the body (waiting for one if none is free)."""
        if self._free > 0 and not any(self._waiting):
            self._free -= 1
        else:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting[0 if urgent else 1].append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():  # given a slot as it was cancelled
                    self._release()
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        for waiting in self._waiting:
            while waiting:
                fut = waiting.popleft()
                if not fut.done():
                    fut.set_result(None)  # the slot passes on: `_free` stays as it is
                    return
        self._free += 1
