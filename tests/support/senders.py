"""`Senders`: a stream of messages from one task per entity, for tests that check every
acknowledged message was applied once while shards move (test_handoff, test_newest)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Senders"]

R = TypeVar("R")


class Senders(Generic[R]):
    """One task per ref, each awaiting `send(ref, n)` for n = 0, 1, 2, ... with `pause`
    seconds between (one sender per key: its acceptance order is its send order),
    until `stop()`."""

    def __init__(self, refs: Sequence[R], send: Callable[[R, int], Awaitable[None]], *,
                 pause: float) -> None:
        self._send = send
        self._pause = pause
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._run(ref)) for ref in refs]

    async def _run(self, ref: R) -> None:
        n = 0
        while not self._stop.is_set():
            await self._send(ref, n)
            n += 1
            await asyncio.sleep(self._pause)

    async def stop(self) -> None:
        """Stop sending; return once every send under way is acknowledged (or raised)."""
        self._stop.set()
        await asyncio.gather(*self._tasks)
