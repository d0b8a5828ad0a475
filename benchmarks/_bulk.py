"""Fill an empty store fast with entities whose rows are exactly as corral writes them.

    store_url = await build(path_or_url, entities=1_000_000, running=1_000)
    async with corral.open_runtime(store_url, entities=ENTITY_TYPES[:3], host=False) as rt:
        ...

Measuring reads at a million entities must not mean a million acceptances (those would
measure writing, for an hour). `build` opens the store once with corral (so the schema
is the current one, migrations included) and closes it, then writes the rows itself in
one transaction: SQLite through `executemany` on its own `sqlite3` connection,
PostgreSQL through `COPY` (asyncpg's `copy_records_to_table`). Both take their rows
from one generator (`_rows`), so the two stores hold the same entities. Rows go in
primary-key order (type, then key), so each B-tree grows at its right edge. The
planner then sees the tables as it would in a live store: SQLite without statistics
(corral never runs `ANALYZE`, and `sqlite_stat1` would change plans, e.g. allow a
skip-scan), PostgreSQL after `VACUUM ANALYZE` (the steady state autovacuum reaches).

The rows are the ones a real runtime leaves behind (checked against a probe run with
the same entity class: `Bulk` below), per entity `i` of type `i % types`, key
`key-{i:08d}`, shard by corral's own hash (`Router.shard_of`), all of them run 1:

- closed (60% of the rest): run completed with a result; journal and dedupe rows of its
  two signals (`add`, `close`), a snapshot at seq 2, a progress row;
- passivated (the other 40%): running, `passivated_seq` 1, a snapshot at seq 1, its
  journal truncated (as passivation leaves it), one dedupe row;
- of all entities, one in 100 is passivated with a dead letter (`poison`, seq 2: so a
  page of 20 dead letters of one type is full from 10k entities on) and one in 1,000
  waits at its open signal wait `gate` (seq 2, `hold`);
- `running` entities (spread evenly over the keys) are running and not passivated, as a
  host killed mid-work leaves them: journal and dedupe of `add` (seq 1), a progress row
  at seq 1, no snapshot; one in 100 of them is suspended (a `crash` signal at seq 2, a
  `suspensions` row, its `run()` raises when activated).

How long it takes (2 cores shared with other work, load ~3-5; `scale.py` prints it at
each size and records it as item "build" in `benchmarks/results/scale.json`): SQLite
10k 0.3 s, 100k 3.2 s, 1M 39 s (6.4M rows); PostgreSQL (COPY, fsync on) 10k 0.5 s, 100k
4.7 s, 1M 41 s, `VACUUM ANALYZE` included.

The census's counters (`census_counts`: entities by status, dead letters, open waits,
suspended runs) would be left stale by a loader that bypasses the transactions that
keep them: `_recount` below recomputes them after a load (`_census.recount`).

A built store has no host: no live lease vouches for any shard, so its census counts
the backlog exactly, a seek per running entity (`_backlog`'s degraded mode). `hold`
writes what live holders of every shard would have written (leases and backlog
summaries equal to that exact count), so the census reads a running deployment's way.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, closing
from typing import Any

from pydantic import BaseModel

import corral
from corral.persistence import _backlog, _census, open_store
from corral.persistence._codec import payload_hash
from corral.persistence._txn import Fence, Txn

__all__ = ["APP", "ENTITY_TYPES", "HOLDER", "KEY_FORMAT", "SIZES_ENV", "build", "entity_types",
           "hold", "key_of", "kind_of", "progress_printer", "running_keys", "sizes",
           "transaction"]

KEY_FORMAT = "key-{:08d}"
SIZES_ENV = "CORRAL_SCALE_SIZES"  # `scale.py --sizes 10000,100000` sets it for every part
REPORT_EVERY = 100_000  # entities between two progress reports
RUNNING_SUSPENDED_EVERY = 100   # one in this many running entities is suspended
DEAD_EVERY, DEAD_AT = 100, 7     # passivated entity i with i % 100 == 7: a dead letter
WAIT_EVERY, WAIT_AT = 1000, 17   # ... == 17: an open signal wait
START_INPUT = '{"owner":"bulk"}'
ADD = '{"n":1}'


class Item(BaseModel):
    n: int = 0


class Start(BaseModel):
    owner: str = "bulk"


class Bulk(corral.Entity):
    """The shape of every built entity (its types are subclasses named per type)."""

    gate = corral.wait(Item)
    retry = corral.RetryPolicy(max_attempts=1)

    def __init__(self, init: Start) -> None:
        self.total = 0
        self.done = False
        self.gated = False
        self.boom = False

    @corral.signal
    def add(self, item: Item) -> None:
        self.total += item.n

    @corral.signal
    def close(self) -> None:
        self.done = True

    @corral.signal
    def poison(self, item: Item) -> None:
        raise ValueError("poison")

    @corral.signal
    def hold(self) -> None:
        self.gated = True

    @corral.signal
    def crash(self) -> None:
        self.boom = True

    async def run(self) -> Item:
        await self.wait_for(lambda: self.done or self.gated or self.boom)
        if self.boom:
            raise RuntimeError("boom")
        if self.gated:
            return await self.wait_for_signal(type(self).gate)
        return Item(n=self.total)


ENTITY_TYPES: tuple[type[corral.Entity], ...] = tuple(
    type(name, (Bulk,), {"__module__": __name__, "__qualname__": name})
    for name in ("Account", "Cart", "Order", "Session", "Ticket"))


def sizes(quick: bool) -> list[int]:
    """The store sizes (entities) a part measures: `--sizes` of `scale.py` (through
    `SIZES_ENV`), else 10k and 100k with `--quick`, else 10k, 100k and 1M."""
    given = os.environ.get(SIZES_ENV)
    if given:
        return [int(n) for n in given.split(",")]
    return [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000]


def progress_printer(label: str) -> Callable[[int, int], None]:
    """A `report` for `build` printing "label: built 300,000 / 1,000,000 entities"."""
    def report(done: int, total: int) -> None:
        print(f"  {label}: built {done:,} / {total:,} entities", flush=True)
    return report


APP = corral.App(entities=ENTITY_TYPES)  # `corral ls --app _bulk:APP` (benchmarks/ on the path)


def entity_types(types: int) -> list[type[corral.Entity]]:
    """The entity classes of a store built with `types` types (open the runtime with them)."""
    return list(ENTITY_TYPES[:types])


def key_of(i: int) -> str:
    return KEY_FORMAT.format(i)


def _running_stride(entities: int, running: int) -> int:
    return entities // running if running else 0


def kind_of(i: int, *, entities: int, running: int) -> str:
    """What entity `i` is: running, suspended, closed, passivated, dead or waiting."""
    stride = _running_stride(entities, running)
    if stride and i % stride == 0 and i // stride < running:
        return "suspended" if (i // stride) % RUNNING_SUSPENDED_EVERY == 1 else "running"
    if i % 10 < 6:
        return "closed"
    if i % DEAD_EVERY == DEAD_AT:
        return "dead"
    if i % WAIT_EVERY == WAIT_AT:
        return "waiting"
    return "passivated"


def running_keys(*, entities: int, running: int, types: int = 3) -> list[tuple[str, str]]:
    """(type name, key) of the running (not passivated) entities of a built store."""
    stride = _running_stride(entities, running)
    return [(ENTITY_TYPES[i % types].__name__, key_of(i))
            for i in range(0, stride * running, stride) if stride]


def _shard(etype: str, key: str, shards: int) -> int:
    digest = hashlib.blake2b(f"{etype}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards  # corral's Router.shard_of


def _state(*, done: bool = False, gated: bool = False, boom: bool = False) -> bytes:
    return (b'{"format":1,"state_version":1,"state":{"total":1,"done":%s,"gated":%s,'
            b'"boom":%s},"mailbox":[]}' % tuple(
                b"true" if v else b"false" for v in (done, gated, boom)))


_SECOND = {"closed": ("close", "null"), "dead": ("poison", '{"n":2}'),
           "waiting": ("hold", "null"), "suspended": ("crash", "null")}
_HASH = {name: payload_hash(name, payload) for name, payload in
         [("add", ADD), *_SECOND.values()]}
_TRACE = ('Traceback (most recent call last):\n  File "benchmarks/_bulk.py", line 1, in {}\n'
          '{}: {}\n')


def _rows(entities: int, running: int, types: int, shards: int, now: float,
          report: Callable[[int, int], None] | None
          ) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """(table, row) of every built entity, in primary-key order per table and type."""
    done = 0
    for t in range(types):
        etype = ENTITY_TYPES[t].__name__
        for i in range(t, entities, types):
            yield from _entity_rows(etype, i, kind_of(i, entities=entities, running=running),
                                    shards, now - (entities - i) * 0.01)
            done += 1
            if report is not None and done % REPORT_EVERY == 0:
                report(done, entities)


def _entity_rows(etype: str, i: int, kind: str, shards: int, at: float
                 ) -> Iterator[tuple[str, tuple[Any, ...]]]:
    key = key_of(i)
    shard = _shard(etype, key, shards)
    second = _SECOND.get(kind)
    next_seq = 3 if second else 2
    status = "completed" if kind == "closed" else "running"
    passivated = {"passivated": 1, "dead": 2, "waiting": 2}.get(kind)
    yield "entities", (etype, key, shard, 1, status, next_seq, passivated, at + 1, 1)
    yield "runs", (etype, key, 1, status, START_INPUT, ADD if kind == "closed" else None,
                   None, at, at + 1 if kind == "closed" else None, None, 1)
    messages = [("add", ADD)] + ([second] if second else [])
    for seq, (name, _) in enumerate(messages, 1):
        yield "dedupe", (etype, key, f"{key}-{seq}", seq, 1, _HASH[name], None, at + seq * 1e-3,
                         None)
    if kind in ("closed", "running", "suspended"):  # passivation truncated the others'
        for seq, (name, payload) in enumerate(messages, 1):
            yield "journal", (etype, key, seq, 1, shard, "signal", name, f"{key}-{seq}",
                              payload, None, at + seq * 1e-3)
    if kind != "running" and kind != "suspended":
        snap = _state(done=kind == "closed", gated=kind == "waiting")
        yield "snapshots", (etype, key, 1, next_seq - 1, snap, at + 1)
    if kind in ("closed", "running", "suspended"):
        yield "progress", (etype, key, next_seq - 1, 0, at + 1)
    if kind == "dead":
        yield "dead_letters", (etype, key, 1, 2, f"{key}-2", "poison", '{"n":2}', None,
                               "ValueError: poison", _TRACE.format("poison", "ValueError",
                                                                    "poison"), 1, at + 1)
    if kind == "waiting":
        yield "signal_waits", (etype, key, 1, "gate", shard, "open", at + 1, None, None, None,
                               None, None)
    if kind == "suspended":
        yield "suspensions", (etype, key, 1, shard,
                              "run() raised: " + _TRACE.format("run", "RuntimeError", "boom"),
                              1, at + 1, at + 3600)


COLUMNS = {
    "entities": "etype, key, shard, run_id, status, next_seq, passivated_seq, updated_at, "
                "first_seq",
    "runs": "etype, key, run_id, status, start_input, result, error, started_at, closed_at, "
            "continued_from, first_seq",
    "dedupe": "etype, key, message_id, seq, run_id, payload_hash, sender, accepted_at, outcome",
    "journal": "etype, key, seq, run_id, shard, kind, name, message_id, payload, sender, "
               "accepted_at",
    "snapshots": "etype, key, run_id, applied_seq, state, created_at",
    "progress": "etype, key, applied_seq, mailbox, recorded_at",
    "dead_letters": "etype, key, run_id, seq, message_id, name, payload, sender, error, "
                    "traceback, attempts, failed_at",
    "signal_waits": "etype, key, run_id, name, shard, status, opened_at, deadline, "
                    "delivery_key, payload, sender, delivered_at",
    "suspensions": "etype, key, run_id, shard, error, attempts, since, next_at",
}


async def build(url: str, *, entities: int, running: int = 0, types: int = 3,
                shards: int = 256, report: Callable[[int, int], None] | None = None
                ) -> dict[str, Any]:
    """Fill the empty store at `url` (a SQLite path or a PostgreSQL URL); what was built.

    Args:
        entities: how many entities (each with its run and rows, see the module).
        running: how many of them are running and not passivated (at most `entities`).
        types: how many entity types (1 to 5: `entity_types(types)` are their classes).
        shards: the store's shard count (corral's default for a new store: 256).
        report: called with (entities written, entities) every 100,000 entities.

    Returns:
        {"entities", "running", "types", "shards", "rows", "seconds"}.
    """
    if not 1 <= types <= len(ENTITY_TYPES) or not 0 <= running <= entities:
        raise ValueError(f"bad build: entities={entities} running={running} types={types}")
    began = time.perf_counter()
    await (await open_store(url, shards=shards)).close()  # the current schema, migrated
    rows = _rows(entities, running, types, shards, time.time() - 1.0, report)
    if url.startswith(("postgres://", "postgresql://")):
        count = await _load_postgres(url, rows)
    else:
        count = _load_sqlite(url, rows)
    await _recount(url)
    return {"entities": entities, "running": running, "types": types, "shards": shards,
            "rows": count, "seconds": time.perf_counter() - began}


def _by_table(rows: Iterator[tuple[str, tuple[Any, ...]]], batch: int = 50_000
              ) -> Iterator[tuple[str, list[tuple[Any, ...]]]]:
    """The rows in batches of one table each (so executemany / COPY take many at once)."""
    pending: dict[str, list[tuple[Any, ...]]] = {}
    for table, row in rows:
        bucket = pending.setdefault(table, [])
        bucket.append(row)
        if len(bucket) >= batch:
            yield table, bucket
            pending[table] = []
    for table, bucket in pending.items():
        if bucket:
            yield table, bucket


def _load_sqlite(path: str, rows: Iterator[tuple[str, tuple[Any, ...]]]) -> int:
    count = 0
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=OFF")  # one bulk transaction: durable at COMMIT's end
        db.execute("BEGIN IMMEDIATE")
        for table, batch in _by_table(rows):
            marks = ", ".join("?" * len(COLUMNS[table].split(",")))
            db.executemany(f"INSERT INTO {table} ({COLUMNS[table]}) VALUES ({marks})", batch)
            count += len(batch)
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return count


async def _load_postgres(url: str, rows: Iterator[tuple[str, tuple[Any, ...]]]) -> int:
    import asyncpg

    count, ticks = 0, {}
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            for table, batch in _by_table(rows):
                columns = [c.strip() for c in COLUMNS[table].split(",")]
                if table == "journal":  # PostgreSQL tails by a per-shard tick
                    columns.append("tick")
                    batch = [(*row, ticks.__setitem__(row[4], ticks.get(row[4], 0) + 1)
                              or ticks[row[4]]) for row in batch]
                await conn.copy_records_to_table(table, records=batch, columns=columns)
                count += len(batch)
            await conn.executemany("UPDATE shard_ticks SET tick = $2 WHERE shard = $1",
                                   list(ticks.items()))
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()
    return count


async def _recount(url: str) -> None:
    """Recompute the census's counters (one write transaction over the loaded store)
    after a load that bypassed the transactions that keep them."""
    async with transaction(url) as q:
        await _census.recount(q)


HOLDER = "bulk-host"  # the holder `hold` writes as
HELD_FOR = 10 * 365 * 86400.0  # a far expiry: the leases outlive any measurement


async def hold(url: str, *, owner: str = HOLDER, epoch: int = 1) -> int:
    """Write what live holders of every shard would have written: each shard's lease
    (`owner`, `epoch`, expiring in ten years) and its backlog summary at that epoch
    (`_backlog.summary_rows`: the shard's row of type '' vouching for it, one row per
    type behind), equal to the exact backlog the census falls back to without them
    (`_backlog.exact_sql` of that one shard). The census then reads the summaries (a
    few rows per shard) instead of counting the running entities: checked before the
    commit (`_backlog.VOUCHED`, every shard at its live lease's epoch). The store is held
    from then on: a host opened on it waits for those leases, so hold only a store
    measured without hosts. Returns the shards held.
    """
    async with transaction(url) as q:
        row = await q.fetchone("SELECT v FROM meta WHERE k = 'shards'")
        assert row is not None, "hold a store `build` made"
        shards, now = int(row[0]), await q.clock()
        sql, summaries = _backlog.exact_sql(q, 1), []
        for shard in range(shards):
            types = {str(etype): (int(messages), int(entities), oldest)
                     for etype, messages, entities, oldest in await q.fetchall(sql, shard)}
            summaries += _backlog.summary_rows(
                Fence(shard, owner, epoch), _backlog.ShardBacklog(types), now)
        await q.executemany(
            "INSERT INTO leases (shard, owner, epoch, expires_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (shard) DO UPDATE SET owner = excluded.owner, "
            "epoch = excluded.epoch, expires_at = excluded.expires_at",
            [(shard, owner, epoch, now + HELD_FOR) for shard in range(shards)])
        await q.executemany(_backlog.SUMMARIZE, summaries)
        vouched = await q.fetchall(_backlog.VOUCHED, now)  # what the census will trust
        if len(vouched) != shards:
            raise RuntimeError(f"{len(vouched)} of {shards} shards vouched for after hold")
    return shards


@asynccontextmanager
async def transaction(url: str) -> AsyncIterator[Txn]:
    """One write transaction on the store at `url` through corral's own `Txn` (its
    statements as corral writes them, placeholders translated per engine), committed
    on the way out, rolled back on an error."""
    if url.startswith(("postgres://", "postgresql://")):
        import asyncpg

        from corral.persistence._pg_txn import PgTxn

        conn = await asyncpg.connect(url)
        try:
            async with conn.transaction():
                yield PgTxn(conn=conn, token="")
        finally:
            await conn.close()
        return
    from corral.persistence._sqlite_txn import SqliteTxn

    with closing(sqlite3.connect(url, isolation_level=None)) as db:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield SqliteTxn(db=db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
