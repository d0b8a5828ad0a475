"""Release 1 of the entity `benchmarks/ray_roll.py` rolls (imported by the shard actors)."""

from __future__ import annotations

from pydantic import BaseModel

import corral


class Start(BaseModel):
    tenant: str


class Item(BaseModel):
    id: str


class Tally(corral.Entity):
    def __init__(self, init: Start) -> None:
        self.items: list[str] = []

    @corral.signal
    def add(self, item: Item) -> None:
        self.items.append(item.id)

    @corral.query
    def applied(self) -> list[str]:
        return self.items
