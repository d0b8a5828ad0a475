"""Issue 42, item 1: what each operator read costs at 10k / 100k / 1M entities.

`measure(engine, url, quick)` builds one store per size (`_bulk.build`, 1,000 running
entities, three types) beside `url` (SQLite: files next to it; PostgreSQL: databases on
the same server), then calls every operator read through the public API of a runtime
opened with `host=False` (what `corral ls / show / history` and the dashboard call):

- `rt.entities(...)`: the first page and a deep page (a cursor in the middle), with and
  without a type; by status; key-prefix search in one type and across all types, with
  few matches (fewer than a page: the search must find them without a walk) and many;
- `ref.describe()` (`corral show`), `ref.history()`, `ref.state()` of a built entity;
- `rt.dead_letters(limit=20)`, with and without a type (a full page at every size);
- `rt.census()` (every `/metrics` scrape), item "census", twice: first as the built
  store is, no live holder vouching for any shard, so the backlog is counted exactly
  from every running entity ("census (no host: exact fallback)", `_backlog`'s degraded
  mode, growing with the running entities); then after `_bulk.hold` wrote what live
  hosts holding every shard would have (leases and backlog summaries equal to that
  exact count), read from the summaries as a running deployment's census is
  ("census (hosts holding every shard)", `CENSUS_HELD`).

Work, which load cannot change, per call:

- SQLite: VM steps, counted by a progress handler with n=1 installed on the store's own
  connections (reader and writer, in their threads), so exactly the statements the
  operation runs are counted; the median of 5 calls (a background statement of the
  runtime landing in one call does not move it);
- PostgreSQL: shared buffers hit + read of the database's statements, from
  `pg_stat_statements` (the server is started with `shared_preload_libraries`; reset
  before each call), the median of 5 calls; planning buffers are not counted.

Plus the wall-clock median (ms) over `REPEAT` calls, taken without the handler (a
Python callback per VM step would dominate it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import _bulk
import asyncpg

import corral
from corral.runtime.client._results import encode_cursor

__all__ = ["CENSUS_HELD", "measure", "reads"]

RUNNING = 1_000
TYPES = 3
WORK_CALLS = 5
ONE_TYPE = "Cart"
FEW, MANY = "key-0000123", "key-00001"  # 10 keys (over all types) / 1,000 at 10k, more above
Read = Callable[[corral.Runtime], Awaitable[Any]]


def _middle(entities: int, kind: str) -> str:
    """The key of an entity of `kind` near the middle of a built store."""
    i = entities // 2
    while _bulk.kind_of(i, entities=entities, running=RUNNING) != kind:
        i += 1
    return _bulk.key_of(i)


def reads(entities: int) -> list[tuple[str, str, Read]]:
    """(item, case, read) of every operator read on a store of `entities`."""
    classes = {c.__name__: c for c in _bulk.entity_types(TYPES)}
    deep = _bulk.key_of(entities // 2)
    passive, closed = _middle(entities, "passivated"), _middle(entities, "closed")

    def ref(rt: corral.Runtime, key: str) -> Any:
        i = int(key.rsplit("-", 1)[1])
        return rt.ref(classes[_bulk.ENTITY_TYPES[i % TYPES].__name__], key)

    cases: list[tuple[str, str, Read]] = [
        ("reads", "ls first page", lambda rt: rt.entities()),
        ("reads", "ls first page, one type", lambda rt: rt.entities(ONE_TYPE)),
        ("reads", "ls deep page", lambda rt: rt.entities(
            after=encode_cursor((ONE_TYPE, deep)))),
        ("reads", "ls deep page, one type", lambda rt: rt.entities(
            ONE_TYPE, after=encode_cursor((ONE_TYPE, deep)))),
        ("reads", "ls status completed", lambda rt: rt.entities(status="completed")),
        ("reads", "ls status running, one type", lambda rt: rt.entities(
            ONE_TYPE, status="running")),
        ("reads", "search one type, few", lambda rt: rt.entities(ONE_TYPE, key_prefix=FEW)),
        ("reads", "search one type, many", lambda rt: rt.entities(ONE_TYPE, key_prefix=MANY)),
        ("reads", "search all types, few", lambda rt: rt.entities(key_prefix=FEW)),
        ("reads", "search all types, many", lambda rt: rt.entities(key_prefix=MANY)),
        ("reads", "show", lambda rt: ref(rt, passive).describe()),
        ("reads", "history", lambda rt: ref(rt, closed).history()),
        ("reads", "state", lambda rt: ref(rt, passive).state()),
        ("reads", "dead letters", lambda rt: rt.dead_letters(limit=20)),
        ("reads", "dead letters, one type", lambda rt: rt.dead_letters(ONE_TYPE, limit=20)),
        ("census", "census (no host: exact fallback)", lambda rt: rt.census()),
    ]
    return cases


CENSUS_HELD: tuple[str, str, Read] = (
    "census", "census (hosts holding every shard)", lambda rt: rt.census())
"""Measured last, after `_bulk.hold` (the store is held from then on)."""


async def measure(engine: str, url: str, quick: bool) -> list[dict[str, object]]:
    """Every operator read at each size of `_bulk.sizes(quick)`, on `engine`."""
    figures: list[dict[str, object]] = []
    repeat = 10 if quick else 20
    for size in _bulk.sizes(quick):
        async with _sized_store(engine, url, size) as store:
            built = await _bulk.build(store, entities=size, running=min(RUNNING, size),
                                      types=TYPES, report=_bulk.progress_printer(engine))
            print(f"  {engine} {size:,} entities built in {built['seconds']:.1f} s "
                  f"({built['rows']:,} rows)", flush=True)
            figures.append({"item": "build", "case": "seconds", "size": size,
                            "value": round(built["seconds"], 2), "unit": "s"})
            figures += await _measure_store(engine, store, size, repeat, built["shards"])
    return figures


async def _measure_store(engine: str, store: str, size: int, repeat: int, shards: int
                         ) -> list[dict[str, object]]:
    figures: list[dict[str, object]] = []
    async with corral.open_runtime(store, entities=_bulk.entity_types(TYPES),
                                   shards=shards, host=False) as rt:
        counter = await (_SqliteSteps.on(rt) if engine == "sqlite" else _PgBuffers.on(store))
        try:
            for item, case, read in reads(size):
                # The no-host census walks every running entity (seconds at 1M): 3 calls.
                times = min(repeat, 3) if "fallback" in case else repeat
                figures += await _measure_read(rt, counter, engine, size, times,
                                               item, case, read)
            await _bulk.hold(store)
            figures += await _measure_read(rt, counter, engine, size, repeat, *CENSUS_HELD)
        finally:
            await counter.close()
    return figures


async def _measure_read(rt: corral.Runtime, counter: _SqliteSteps | _PgBuffers, engine: str,
                        size: int, repeat: int, item: str, case: str, read: Read
                        ) -> list[dict[str, object]]:
    """One read's work per call and its wall-clock median, as two figures."""
    await read(rt)  # warm: plans, pool, page cache
    took = []
    for _ in range(repeat):
        began = time.perf_counter()
        await read(rt)
        took.append(time.perf_counter() - began)
    work = await counter.per_call(rt, read)
    ms = statistics.median(took) * 1e3
    print(f"  {engine:8} {size:>9,} {case:<36} {work:>12,} {counter.unit:<8} "
          f"{ms:9.2f} ms", flush=True)
    return [{"item": item, "case": case, "size": size, "value": work, "unit": counter.unit},
            {"item": item, "case": case, "size": size, "value": round(ms, 3), "unit": "ms"}]


@asynccontextmanager
async def _sized_store(engine: str, url: str, size: int) -> AsyncIterator[str]:
    """An empty store for one size, beside `url` (dropped after)."""
    if engine == "sqlite":
        path = Path(url).with_name(f"{Path(url).stem}-{size}.db")
        try:
            yield str(path)
        finally:
            for leftover in path.parent.glob(f"{path.name}*"):
                if leftover.is_file():
                    leftover.unlink()
        return
    base, _, database = url.rpartition("/")
    name = f"{database}_{size}"
    admin = await asyncpg.connect(url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield f"{base}/{name}"
    finally:
        admin = await asyncpg.connect(url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


class _SqliteSteps:
    """VM steps of the statements a read runs on the store's own connections."""

    unit = "steps"

    def __init__(self, threads: list[Any]) -> None:
        self.threads = threads
        self.steps = 0

    @classmethod
    async def on(cls, rt: corral.Runtime) -> _SqliteSteps:
        store: Any = rt.store
        threads = list({id(t): t for t in (store._reader, store._writer)}.values())
        return cls(threads)

    def _count(self) -> int:
        self.steps += 1
        return 0

    async def _handler(self, on: bool) -> None:
        for thread in self.threads:
            await thread.call(lambda db: db.set_progress_handler(
                self._count if on else None, 1))

    async def per_call(self, rt: corral.Runtime, read: Read) -> int:
        counts = []
        await self._handler(True)
        try:
            for _ in range(WORK_CALLS):
                self.steps = 0
                await read(rt)
                counts.append(self.steps)
        finally:
            await self._handler(False)
        return int(statistics.median(counts))

    async def close(self) -> None:
        pass


class _PgBuffers:
    """Shared buffers (hit + read) of a read's statements, from pg_stat_statements."""

    unit = "buffers"

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    @classmethod
    async def on(cls, url: str) -> _PgBuffers:
        conn = await asyncpg.connect(url)
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return cls(conn)

    async def per_call(self, rt: corral.Runtime, read: Read) -> int:
        counts = []
        for _ in range(WORK_CALLS):
            await self.conn.execute("SELECT pg_stat_statements_reset()")
            await read(rt)
            counts.append(await self.conn.fetchval(
                "SELECT coalesce(sum(shared_blks_hit + shared_blks_read), 0) "
                "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database "
                "WHERE datname = current_database()) AND query NOT LIKE '%pg_stat_%'"))
        return int(statistics.median(counts))

    async def close(self) -> None:
        await self.conn.close()
