"""Release 2 of `_roll_release1.Tally`: one more signal (`tag`), compatible."""

from __future__ import annotations

from _roll_release1 import Item, Start

import corral


class Tally(corral.Entity):
    def __init__(self, init: Start) -> None:
        self.items: list[str] = []

    @corral.signal
    def add(self, item: Item) -> None:
        self.items.append(item.id)

    @corral.signal
    def tag(self, item: Item) -> None:  # new in release 2
        self.items.append(f"tag:{item.id}")

    @corral.query
    def applied(self) -> list[str]:
        return self.items
