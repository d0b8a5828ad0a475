"""Entities of the flow-control tests (backpressure, batches), importable by Ray's shard
actors by name (`tests/support` is on their PYTHONPATH, as in `ray_workers`)."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

import corral

__all__ = ["BOUND", "Bounded", "Item", "Ledger", "Open", "Overflowing", "Seen", "Tape"]

BOUND = 20


class Item(BaseModel):
    id: str


class Seen(BaseModel):
    items: list[str]


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
        return Seen(items=self.items)


class Overflowing(Bounded):
    """`Bounded`, keeping what overflows as dead letters instead of refusing it."""

    overflow = "dead_letter"


class Open(BaseModel):
    owner: str


class Ledger(corral.Entity):
    """Records every signal it applies, in order; started with an owner."""

    def __init__(self, init: Open) -> None:
        self.owner = init.owner
        self.items: list[str] = []

    @corral.signal
    def add(self, item: Item) -> None:
        self.items.append(item.id)

    @corral.query
    def seen(self) -> Seen:
        return Seen(items=self.items)


class Tape(corral.Entity):
    """Another type (no start input), for batches of mixed types."""

    def __init__(self) -> None:
        self.items: list[str] = []

    @corral.signal
    def add(self, item: Item) -> None:
        self.items.append(item.id)

    @corral.query
    def seen(self) -> Seen:
        return Seen(items=self.items)
