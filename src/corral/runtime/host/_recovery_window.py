"""`RecoveryWindow`: how many activations a host's shard recoveries load at once.

A host taking shards (a restart, a takeover, a hand-off) activates their running
entities in the background (`_shard.recover`). Each activation is a few store round trips
(its run, `mark_activated`, its snapshot, its journal), all queued through one SQLite
reader thread or a small PostgreSQL pool: activating ten thousand at once put a message
arriving meanwhile, or an entity with a backlog, behind forty thousand of them (5 s).
The window admits a few at a time, host-wide, the urgent ones (`_reads.URGENT`) before
the rest; what a message, a due timer or a query activates on demand never waits here.

The rest wait for the urgent ones of every shard the host is taking, not only for a
slot: a shard holds them back (`hold_back`) from its recovery read until its urgent
entities loaded. Otherwise the shard read first filled the window with idle entities,
whose reads queued on the store ahead of another shard's backlog (on PostgreSQL its
first message waited ~10-40 ms more for them).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable

__all__ = ["RECOVERY_WINDOW", "RecoveryWindow"]

RECOVERY_WINDOW = 16
"""Activations a host's recoveries load at once, all its shards together: enough to
keep the store's reader and its group commit busy, few enough that what arrives now is
served after at most this many activations."""


class RecoveryWindow:
    """A bounded number of slots, given to urgent waiters before the others, each kind
    in the order it asked; the others get none while a shard holds them back.

    Example:
        release = window.hold_back()  # a shard reads which of its entities are urgent
        async with window.slot(urgent=True):
            ...  # activate, and wait until it loaded
        release()  # its urgent ones loaded: the rest may go
    """

    def __init__(self, size: int | None = None) -> None:
        self.size = RECOVERY_WINDOW if size is None else size
        self._free = self.size
        self._holds = 0  # shards whose urgent entities are not all loaded yet
        self._calm: list[asyncio.Future[None]] = []  # `wait_urgent_loaded` callers
        # Waiters for a slot, urgent first; a slot freed goes to the first one not gone.
        self._waiting: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (
            deque(), deque())

    def hold_back(self) -> Callable[[], None]:
        """Hold back the non-urgent slots (and `wait_urgent_loaded`) until the returned
        function is called (once: calls after the first do nothing)."""
        self._holds += 1
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._holds -= 1
                self._grant()
        return release

    async def wait_urgent_loaded(self) -> None:
        """Return once no shard holds the rest back (at once if none does)."""
        if self._holds:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._calm.append(fut)
            await fut

    @contextlib.asynccontextmanager
    async def slot(self, *, urgent: bool) -> AsyncIterator[None]:
        """Hold one slot for the body (waiting for one if none is given now)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[0 if urgent else 1].append(fut)
        self._grant()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # given a slot as it was cancelled
                self._free += 1
                self._grant()
            raise
        try:
            yield
        finally:
            self._free += 1
            self._grant()

    def _grant(self) -> None:
        """Give the free slots to the waiters that may have one now."""
        urgent, other = self._waiting
        if self._calm and not self._holds:
            for fut in self._calm:
                if not fut.done():
                    fut.set_result(None)
            self._calm.clear()
        while self._free > 0:
            if urgent:
                fut = urgent.popleft()
            elif other and not self._holds:
                fut = other.popleft()
            else:
                return
            if not fut.done():  # else it was cancelled while it waited
                self._free -= 1
                fut.set_result(None)
