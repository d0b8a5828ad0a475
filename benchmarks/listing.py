"""Listing benchmark: a page of 100 entities out of 1,000,000, corral against raw SQL.

Run from the repository root:

    .venv/bin/python benchmarks/listing.py                # 1,000,000 entities (~2 min)
    .venv/bin/python benchmarks/listing.py --quick        # 100,000 entities (< 30 s)
    .venv/bin/python benchmarks/listing.py --no-postgres  # SQLite only

The store is filled by bulk SQL (four entity types, one in ten runs completed): this
measures reading, and a million acceptances would only measure writing. Each row of the
table is `rt.entities(...)` (the public API, `host=False`, through the whole runtime:
validation, the cursor, the store read, the summaries) at 200 random positions, against
the same query sent straight to the database (sqlite3 / asyncpg: the ceiling); the goal
is p99 well under 50 ms. Results are printed and written to
benchmarks/results/listing.json.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _pg
import asyncpg
from accept import write_json
from pydantic import BaseModel

import corral
from corral.persistence import open_store
from corral.runtime.client._results import encode_cursor

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "listing.json"
TYPES = ("Cart", "Order", "Session", "Ticket")
SAMPLES = 200
PAGE = 100


class Start(BaseModel):
    n: int = 0


def _entity(name: str) -> type[corral.Entity]:
    def init(self: corral.Entity, init: Start) -> None:
        pass
    return type(name, (corral.Entity,), {"__init__": init, "__module__": __name__})


ENTITIES = [_entity(t) for t in TYPES]


def _rows(n: int) -> list[tuple[Any, ...]]:
    now = time.time()
    return [(TYPES[i % 4], f"key-{i:08d}", i % 16, 1, "completed" if i % 10 == 0 else "running",
             2, None, now) for i in range(n)]


def fill_sqlite(path: str, n: int) -> None:
    """`n` entities, each with its one run (a listing joins an entity to its run)."""
    with sqlite3.connect(path) as db:
        for start in range(0, n, 100_000):
            rows = _rows(min(n, start + 100_000))[start:]
            db.executemany("INSERT INTO entities (etype, key, shard, run_id, status, next_seq, "
                           "passivated_seq, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            db.executemany("INSERT INTO runs (etype, key, run_id, status, started_at, "
                           "first_seq) VALUES (?, ?, ?, ?, ?, 1)",
                           [(r[0], r[1], r[3], r[4], r[7]) for r in rows])
        db.execute("ANALYZE")


async def fill_postgres(url: str, n: int) -> None:
    """`n` entities, each with its one run (a listing joins an entity to its run)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO entities (etype, key, shard, run_id, status, next_seq, updated_at) "
            "SELECT (ARRAY['Cart','Order','Session','Ticket'])[i % 4 + 1], "
            "'key-' || lpad(i::text, 8, '0'), i % 16, 1, "
            "CASE WHEN i % 10 = 0 THEN 'completed' ELSE 'running' END, 2, "
            "extract(epoch FROM now()) FROM generate_series(0, $1 - 1) i", n)
        await conn.execute(
            "INSERT INTO runs (etype, key, run_id, status, started_at, first_seq) "
            "SELECT etype, key, run_id, status, updated_at, 1 FROM entities")
        await conn.execute("ANALYZE entities")
        await conn.execute("ANALYZE runs")
    finally:
        await conn.close()


async def timed(fn: Callable[[str], Awaitable[int]], keys: list[str]) -> list[float]:
    out = []
    for key in keys:
        began = time.perf_counter()
        got = await fn(key)
        out.append(time.perf_counter() - began)
        assert got == PAGE, got
    return out


def stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"p50_ms": statistics.median(s) * 1e3, "p99_ms": s[int(len(s) * 0.99) - 1] * 1e3}


async def measure(store: str, n: int, raw: Callable[[str, str | None, str | None], Awaitable[int]]
                  ) -> list[dict[str, Any]]:
    rng = random.Random(7)
    keys = [f"key-{rng.randrange(n - 100 * PAGE):08d}" for _ in range(SAMPLES)]
    rows: list[dict[str, Any]] = []
    async with corral.open_runtime(store, entities=ENTITIES, host=False) as rt:
        for label, etype, status in (("all", None, None), ("one type", "Order", None),
                                     ("running", None, "running"),
                                     ("one type, completed", "Cart", "completed")):
            async def api(key: str, etype: str | None = etype,
                          status: str | None = status) -> int:
                page = await rt.entities(etype, status=status, limit=PAGE,
                                         after=encode_cursor((etype or "Cart", key)))
                return len(page.items)

            async def ceiling(key: str, etype: str | None = etype,
                              status: str | None = status) -> int:
                return await raw(key, etype, status)

            await api(keys[0])
            await ceiling(keys[0])
            corral_s, raw_s = await timed(api, keys), await timed(ceiling, keys)
            c, r = stats(corral_s), stats(raw_s)
            rows.append({"filter": label, "corral": c, "raw_sql": r,
                         "ratio_p50": c["p50_ms"] / r["p50_ms"]})
            print(f"  {label:<22} corral p50 {c['p50_ms']:6.2f} ms  p99 {c['p99_ms']:6.2f} ms"
                  f"   raw SQL p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms"
                  f"   corral/raw {c['p50_ms'] / r['p50_ms']:.2f}", flush=True)
    return rows


def _where(etype: str | None, status: str | None, mark: Callable[[int], str]
           ) -> tuple[str, list[Any]]:
    where, args = [], []
    if status is not None:
        args.append(status)
        where.append(f"status = {mark(len(args))}")
    if etype is not None:
        args.append(etype)
        where.append(f"etype = {mark(len(args))}")
    return " AND ".join(where), args


async def bench_sqlite(n: int, tmp: str) -> list[dict[str, Any]]:
    path = str(Path(tmp) / "listing.db")
    store = await open_store(path, shards=16)
    await store.close()
    began = time.perf_counter()
    fill_sqlite(path, n)
    print(f"SQLite: {n:,} entities written in {time.perf_counter() - began:.1f} s", flush=True)
    db = sqlite3.connect(path)

    async def raw(key: str, etype: str | None, status: str | None) -> int:
        where, args = _where(etype, status, lambda _: "?")
        seek, at = ("key > ?", [key]) if etype else ("(etype, key) > (?, ?)", ["Cart", key])
        sql = (f"SELECT etype, key, shard, run_id, status, next_seq - 1, passivated_seq, "
               f"updated_at FROM entities WHERE {where + ' AND ' if where else ''}{seek} "
               f"ORDER BY etype, key LIMIT ?")
        return len(db.execute(sql, (*args, *at, PAGE)).fetchall())

    try:
        return await measure(path, n, raw)
    finally:
        db.close()


async def bench_postgres(n: int, server: _pg.Server) -> list[dict[str, Any]]:
    async with server.database("listing") as url:
        store = await open_store(url, shards=16)
        await store.close()
        began = time.perf_counter()
        await fill_postgres(url, n)
        print(f"PostgreSQL: {n:,} entities written in {time.perf_counter() - began:.1f} s",
              flush=True)
        conn = await asyncpg.connect(url)

        async def raw(key: str, etype: str | None, status: str | None) -> int:
            where, args = _where(etype, status, lambda i: f"${i}")
            k = len(args)
            seek, at = ((f"key > ${k + 1}", [key]) if etype else
                        (f"(etype, key) > (${k + 1}, ${k + 2})", ["Cart", key]))
            sql = (f"SELECT etype, key, shard, run_id, status, next_seq - 1, passivated_seq, "
                   f"updated_at FROM entities WHERE {where + ' AND ' if where else ''}{seek} "
                   f"ORDER BY etype, key LIMIT ${k + len(at) + 1}")
            return len(await conn.fetch(sql, *args, *at, PAGE))

        try:
            return await measure(url, n, raw)
        finally:
            await conn.close()


async def main(args: argparse.Namespace) -> None:
    n = 100_000 if args.quick else 1_000_000
    result: dict[str, Any] = {"entities": n, "page": PAGE, "samples": SAMPLES,
                              "machine": platform.platform(), "date": time.strftime("%F")}
    with tempfile.TemporaryDirectory() as tmp:
        result["sqlite"] = await bench_sqlite(n, tmp)
    if not args.no_postgres:
        try:
            with _pg.throwaway_server() as server:
                result["postgresql"] = await bench_postgres(n, server)
        except _pg.ServerUnavailable as err:
            print(f"PostgreSQL: not run ({err})")
            result["postgresql"] = f"not run: {err}"
    if not args.quick:
        write_json(RESULTS, result)
        print(f"written to {RESULTS}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-postgres", action="store_true")
    asyncio.run(main(parser.parse_args()))
