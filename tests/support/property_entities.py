"""Entity types for the property-based tests (`test_properties.py`).

`Box` records the `mid` field of every payload it applies, so a test can check that
each accepted message was applied exactly once. `Ledger` keeps a running total that
its `run()` carries through continue-as-new every `RollIn.every` applied messages and
passivates when idle, so a plain integer is a complete model of its state.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import corral

__all__ = ["Amount", "Box", "BoxStart", "Count", "Item", "Ledger", "Node", "RollIn", "Total"]


class Node(BaseModel):
    """A recursive model, so a payload can be nested as deeply as a test likes."""

    child: Node | None = None
    label: str = ""


class Item(BaseModel):
    """A `Box` payload: `mid` names it; the other fields give values somewhere to go."""

    mid: str
    value: Any = None
    text: str = ""
    n: int = 0
    x: float = 0.0
    node: Node | None = None


class BoxStart(BaseModel):
    tenant: str
    extra: Any = None


class Count(BaseModel):
    applied: int


class Box(corral.Entity):
    """Applies `Item`s by signal or update; never snapshots, so its journal only grows."""

    snapshots = corral.SnapshotPolicy(every=None)

    def __init__(self, init: BoxStart) -> None:
        self.mids: list[str] = []

    @corral.signal
    def put(self, item: Item) -> None:
        self.mids.append(item.mid)

    @corral.update
    def put_and_count(self, item: Item) -> Count:
        self.mids.append(item.mid)
        return Count(applied=len(self.mids))

    @corral.query
    def applied(self) -> list[str]:
        return list(self.mids)


class Amount(BaseModel):
    n: int


class Total(BaseModel):
    total: int


class RollIn(BaseModel):
    """A `Ledger` run's start input: the total so far and how often to continue as new."""

    total: int = 0
    every: int = 3


class Ledger(corral.Entity):
    """A running total; continues as new every `every` applied messages; passivates fast."""

    idle_timeout = 0.05
    snapshots = corral.SnapshotPolicy(every=2, keep=1)

    def __init__(self, init: RollIn) -> None:
        self.total = init.total
        self.every = init.every
        self.since = 0

    @corral.signal
    def add(self, amount: Amount) -> None:
        self.total += amount.n
        self.since += 1

    @corral.update
    def add_and_get(self, amount: Amount) -> Total:
        self.total += amount.n
        self.since += 1
        return Total(total=self.total)

    @corral.query
    def current(self) -> Total:
        return Total(total=self.total)

    async def run(self) -> None:
        await self.wait_for(lambda: self.since >= self.every)
        self.continue_as_new(RollIn(total=self.total, every=self.every))
