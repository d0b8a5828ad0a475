"""An incompatible release of `ray_workers.Counter` (`tests/ray/test_ray_roll.py`): the
signal `add` takes a payload whose `id` is a number, not a string, so a roll to it is
refused, and so is a client of it."""

from __future__ import annotations

import os

from pydantic import BaseModel

import corral
from ray_workers import Item, Seen, Start


class NumberedItem(BaseModel):
    id: int


class Counter(corral.Entity):
    def __init__(self, init: Start) -> None:
        self.items: list[str] = []

    @corral.signal
    def add(self, item: NumberedItem) -> None:
        self.items.append(str(item.id))

    @corral.update
    def add_and_count(self, item: Item) -> int:
        self.items.append(item.id)
        return len(self.items)

    @corral.query
    def seen(self) -> Seen:
        return Seen(items=self.items, pid=os.getpid(), starts=0)


ENTITIES = [Counter]
