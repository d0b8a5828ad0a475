"""Store ops as the runtime builds them, for tests that call a `Store` directly.

A plain module, like `procs`: `tests/persistence/test_store_contract.py` (every engine)
and `tests/persistence/test_postgres_store.py` (PostgreSQL's own) build acceptances and
take fences through these, on whichever store they hold.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator

import corral
from corral.persistence import Acceptance, EntryKind, Fence, Store, open_store, payload_hash

__all__ = ["ALLOW", "acc", "fence_for", "opened", "tail_all"]

ALLOW = corral.IdReusePolicy.ALLOW_DUPLICATE
_CLOCK = itertools.count(1)


def acc(key: str, mid: str, *, shard: int = 1, payload: str = '{"v":1}', name: str = "note",
        sender: str | None = None, start: str | None = "{}",
        kind: EntryKind = EntryKind.SIGNAL, reuse: corral.IdReusePolicy = ALLOW,
        etype: str = "E", max_backlog: int | None = None, overflow: str = "refuse",
        applied: int = 0) -> Acceptance:
    """An acceptance as the client builds it (accepted_at: a deterministic clock)."""
    return Acceptance(etype, key, shard, kind, name, mid, payload, payload_hash(name, payload),
                      sender, start, reuse, float(next(_CLOCK)), False, max_backlog,
                      overflow, applied)


async def fence_for(store: Store, shard: int, owner: str = "host") -> Fence:
    """Lease `shard` to `owner` on `store` (for 60 s): the fence its writes carry."""
    epochs = await store.acquire_leases(owner, [shard], 60.0)
    return Fence(shard, owner, epochs[shard])


@contextlib.asynccontextmanager
async def opened(location: str, shards: int) -> AsyncIterator[Store]:
    """The store at `location` (a SQLite file or a `postgresql://` URL), closed after."""
    store = await open_store(location, shards=shards)
    try:
        yield store
    finally:
        await store.close()


async def tail_all(store: Store, pos: int, shards: frozenset[int]) -> tuple[int, list[str]]:
    """The keys of every entry a host's tail reads from `pos` (small pages, until the
    position stops moving), and the position it ends at."""
    keys: list[str] = []
    before = -1
    while pos != before:
        before = pos
        pos, page = await store.journal_tail(pos, shards, limit=3)
        keys += [e.key for e in page]
    return pos, keys
