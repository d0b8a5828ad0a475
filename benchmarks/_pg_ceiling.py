"""The PostgreSQL ceiling: the least a group-committing asyncpg writer can do to store
the rows corral's PostgreSQL store writes for an acceptance.

The rows and the statement are those of `corral.persistence._pg_txn` (`PgTxn.flush`,
whose statement it runs): per signal a journal row and a dedupe row (the same JSON
rows), a runs row when the entity starts, one entities upsert per entity per batch, and
the batch's shard ticks (the journal's `tick` numbers a shard's entries in commit order;
the ceiling counts them in memory). All of it goes in one statement, in one transaction
(`BEGIN`, the statement, `COMMIT`) on one connection, with the schema created by the
store's own `ensure_schema`. What corral does on top, and the ceiling does not: lock
the shard tick rows and the entity rows and read the dedupe window (two round trips per
batch), validate, route, deduplicate, hand entries to the host, and `NOTIFY` when the
accepting process does not host the shard (`host=False`).

Items are the SQLite ceiling's (`accept.py`): `(journal row without its tick, dedupe
row, runs row or None, entities row)`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import orjson

from corral.persistence._pg_schema import NOTIFY_CHANNEL, ensure_schema
from corral.persistence._pg_txn import _FLUSH

Item = tuple[tuple[Any, ...], tuple[Any, ...], "tuple[Any, ...] | None", tuple[Any, ...]]



class _Batch:
    __slots__ = ("future", "items")

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future
        self.items: list[Item] = []


class PgCeilingWriter:
    """Group commit on one asyncpg connection: everything queued while the previous
    batch committed goes into the next transaction; one shared future per batch."""

    def __init__(self, url: str, *, shards: int) -> None:
        self.url = url
        self.shards = shards
        self.commits = 0
        self.ops_committed = 0
        self._ticks = [0] * shards
        self._conn: Any = None
        self._batch: _Batch | None = None
        self._wakeup = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        self._conn = await asyncpg.connect(self.url)
        await ensure_schema(self._conn, self.shards, where=self.url)
        self._task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        self._closed = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        if self._conn is not None:
            await self._conn.close()

    async def write(self, item: Item) -> None:
        batch = self._batch
        if batch is None:
            batch = self._batch = _Batch(asyncio.get_running_loop().create_future())
            self._wakeup.set()
        batch.items.append(item)
        await batch.future

    async def _loop(self) -> None:
        conn = self._conn
        while not (self._closed and self._batch is None):
            await self._wakeup.wait()
            self._wakeup.clear()
            batch, self._batch = self._batch, None
            if batch is None:
                continue
            try:
                args = self._arguments(batch.items)
                async with conn.transaction():
                    await conn.execute(_FLUSH, *args)
            except Exception as err:  # e.g. the schema changed under this statement
                batch.future.set_exception(RuntimeError(f"ceiling writer failed: {err!r}"))
            else:
                self.commits += 1
                self.ops_committed += len(batch.items)
                batch.future.set_result(None)

    def _arguments(self, items: list[Item]) -> list[Any]:
        """The flush statement's parameters: runs, journal (with its hashes) and entities
        as JSON rows, the shard ticks, and no notification."""
        ticks, dirty = self._ticks, set()
        journal = []
        for j, d, _, _ in items:  # (etype, key, seq, run_id, shard, kind, ..., accepted_at)
            shard = j[4]
            ticks[shard] += 1
            dirty.add(shard)
            journal.append((*j[:5], ticks[shard], *j[5:], d[5].hex()))
        runs = [i[2] for i in items if i[2] is not None]
        latest = {(i[3][0], i[3][1]): i[3] for i in items}  # one upsert per entity
        shards = sorted(dirty)
        return [_json(runs), _json(journal), _json(list(latest.values())), shards,
                [ticks[s] for s in shards], NOTIFY_CHANNEL, ""]


def _json(rows: list[tuple[Any, ...]]) -> str:
    return orjson.dumps(rows).decode()
