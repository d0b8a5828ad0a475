"""Releases of `ray_workers.Counter` that the rolling-deploy tests roll over actors
started with it (`tests/ray/test_ray_roll.py`): the shard actors import this module by
name, as an application ships its release.

`Counter` (release 2) adds a signal `tag` that release 1 lacks: an entry of it is
applied only by release 2. `ray_roll_bad.Counter` is an incompatible release.
"""

from __future__ import annotations

import asyncio
import os

import corral
from ray_workers import Item, Seen, Start


class Counter(corral.Entity):
    """Release 2: what release 1 has, and `tag` (its entries are marked `tag:<id>`)."""

    def __init__(self, init: Start) -> None:
        self.tenant = init.tenant
        self.items: list[str] = []

    @corral.signal
    def add(self, item: Item) -> None:
        self.items.append(item.id)

    @corral.signal
    def tag(self, item: Item) -> None:  # new in release 2
        self.items.append(f"tag:{item.id}")

    @corral.update
    def add_and_count(self, item: Item) -> int:
        self.items.append(item.id)
        return len(self.items)

    @corral.query
    def seen(self) -> Seen:
        return Seen(items=self.items, pid=os.getpid(), starts=0)


ENTITIES = [Counter]
"""Release 2 as `--app ray_roll_entities:ENTITIES` (`corral deploy roll`)."""


def task_stream(store: str, namespace: str, shards: int, keys: list[str], who: str,
                count: int) -> list[list[str]]:
    """A Ray task of release 1 sending `count` signals round-robin to `keys` (running
    entities); its acks [key, item]. Its errors are raised (the test sees none)."""
    from ray_workers import Counter as Release1

    async def send() -> list[list[str]]:
        acked: list[list[str]] = []
        async with corral.open_runtime(store, entities=[Release1], backend="ray",  # a client
                                       namespace=namespace, shards=shards) as rt:
            for n in range(count):
                key, mid = keys[n % len(keys)], f"{who}-{n}"
                await rt.ref(Release1, key).signal(Release1.add, Item(id=mid), message_id=mid)
                acked.append([key, mid])
        return acked
    return asyncio.run(send())
