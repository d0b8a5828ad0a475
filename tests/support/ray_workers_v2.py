"""A later version of `ray_workers.Counter`: the same entity type name with one more
handler. The Ray tests deploy it over actors started with the first version."""

from __future__ import annotations

from pydantic import BaseModel

import corral
from ray_workers import Item, Seen, Start


class Counter(corral.Entity):
    def __init__(self, init: Start) -> None:
        self.items: list[str] = []

    @corral.signal
    def add(self, item: Item) -> None:
        self.items.append(item.id)

    @corral.update
    def add_and_count(self, item: Item) -> int:
        self.items.append(item.id)
        return len(self.items)

    @corral.query
    def seen(self) -> Seen:
        return Seen(items=self.items, pid=0, starts=0)

    @corral.query
    def how_many(self) -> int:  # new in this version
        return len(self.items)


class Entry(BaseModel):
    amount: int
    memo: str = ""  # new in this version: optional


class Ledger(corral.Entity):
    snapshots = corral.SnapshotPolicy(every=2, keep=1)
    entries: list[Entry]

    def __init__(self, init: Start) -> None:
        self.entries = []
        self.currency = "EUR"  # new in this version

    @corral.signal
    def book(self, entry: Entry) -> None:
        self.entries.append(entry)

    @corral.query
    def lines(self) -> list[str]:
        return [f"{e.amount} {self.currency} {e.memo}".strip() for e in self.entries]
