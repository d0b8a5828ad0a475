"""Entities of the backpressure tests, importable by Ray's shard actors by name
(`tests/support` is on their PYTHONPATH, as for `ray_workers`, whose models they use;
the batch tests use `ray_workers.Counter` and `Tally`)."""

from __future__ import annotations

import asyncio
import os

import corral
from ray_workers import Item, Seen

__all__ = ["BOUND", "Bounded", "Brief", "Overflowing"]

BOUND = 20


class Bounded(corral.Entity):
    """A hot entity slower to apply than to accept: at most `BOUND` signals behind.
    Records what it applied, in order (applied-once is checked on this list)."""

    max_backlog = BOUND

    def __init__(self) -> None:
        self.items: list[str] = []

    @corral.signal
    async def add(self, item: Item) -> None:
        await asyncio.sleep(0.002)  # a slow handler: acceptance outruns it
        self.items.append(item.id)

    @corral.query
    def seen(self) -> Seen:
        return Seen(items=self.items, pid=os.getpid(), starts=0)


class Overflowing(Bounded):
    """`Bounded`, keeping what overflows as dead letters instead of refusing it."""

    overflow = "dead_letter"



class Brief(corral.Entity):
    """Closed by its first signal; its closed runs kept 0.2 s (retention on Ray)."""

    retention = corral.Retention(closed_for=0.2)
    done = corral.signal(Item)

    async def run(self) -> None:
        async for _ in self.mailbox:
            return
