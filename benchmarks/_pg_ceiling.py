"""The PostgreSQL ceiling: the least a group-committing asyncpg writer can do to store
the rows corral's PostgreSQL store writes for an acceptance.

The rows and the statement are those of `corral.persistence._pg_txn` (`PgTxn.flush`):
per signal a journal row and a dedupe row (the same arrays), a runs row when the entity
starts, one entities upsert per entity per batch, and the batch's shard ticks (the
journal's `tick` numbers a shard's entries in commit order; the ceiling counts them in
memory). All of it goes in one `unnest` statement, in one transaction
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

from corral.persistence._pg_schema import ensure_schema

Item = tuple[tuple[Any, ...], tuple[Any, ...], "tuple[Any, ...] | None", tuple[Any, ...]]

_WRITE = """
WITH r AS (
    INSERT INTO runs (etype, key, run_id, status, start_input, started_at, first_seq)
    SELECT etype, key, run_id, 'running', start_input, started_at, first_seq
    FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::float8[],
                $6::bigint[]) AS t(etype, key, run_id, start_input, started_at, first_seq)
), j AS (
    INSERT INTO journal (etype, key, seq, run_id, shard, tick, kind, name, message_id,
                         payload, sender, accepted_at)
    SELECT * FROM unnest($7::text[], $8::text[], $9::bigint[], $10::bigint[], $11::int[],
                         $12::bigint[], $13::text[], $14::text[], $15::text[], $16::text[],
                         $17::text[], $18::float8[])
), d AS (
    INSERT INTO dedupe (etype, key, message_id, seq, run_id, payload_hash, sender,
                        accepted_at)
    SELECT * FROM unnest($7::text[], $8::text[], $15::text[], $9::bigint[], $10::bigint[],
                         $19::bytea[], $17::text[], $18::float8[])
), e AS (
    INSERT INTO entities (etype, key, shard, run_id, status, next_seq)
    SELECT * FROM unnest($20::text[], $21::text[], $22::int[], $23::bigint[], $24::text[],
                         $25::bigint[])
    ON CONFLICT (etype, key) DO UPDATE SET run_id = excluded.run_id,
        status = excluded.status, next_seq = excluded.next_seq
)
UPDATE shard_ticks s SET tick = u.tick
FROM unnest($26::int[], $27::bigint[]) AS u(shard, tick) WHERE s.shard = u.shard
"""


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
                    await conn.execute(_WRITE, *args)
            except Exception as err:  # e.g. the schema changed under this statement
                batch.future.set_exception(RuntimeError(f"ceiling writer failed: {err!r}"))
            else:
                self.commits += 1
                self.ops_committed += len(batch.items)
                batch.future.set_result(None)

    def _arguments(self, items: list[Item]) -> list[list[Any]]:
        """The statement's 27 column arrays: runs, journal, hashes, entities, ticks."""
        ticks, dirty = self._ticks, set()
        journal = []
        for j, _, _, _ in items:  # (etype, key, seq, run_id, shard, kind, ..., accepted_at)
            shard = j[4]
            ticks[shard] += 1
            dirty.add(shard)
            journal.append((*j[:5], ticks[shard], *j[5:]))
        runs = [i[2] for i in items if i[2] is not None]
        latest = {(i[3][0], i[3][1]): i[3] for i in items}  # one upsert per entity
        shards = sorted(dirty)
        return [*_columns(runs, 6), *_columns(journal, 12), [i[1][5] for i in items],
                *_columns(list(latest.values()), 6), shards, [ticks[s] for s in shards]]


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    return [list(col) for col in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]
