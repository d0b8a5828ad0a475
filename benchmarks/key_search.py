"""Key-prefix search benchmark: `rt.entities(key_prefix=...)` (the dashboard's search box)
on 100,000 entities, against the same query sent straight to the database.

Run from the repository root:

    .venv/bin/python benchmarks/key_search.py                # SQLite and PostgreSQL
    .venv/bin/python benchmarks/key_search.py --no-postgres  # SQLite only

The store is filled by bulk SQL as in `listing.py` (four types, keys `key-00000000`...).
A prefix is a filter on the (type, key) walk: SQLite turns it into a key range that the
primary key seeks; PostgreSQL's `starts_with` (collation-independent) is checked row by
row, so a prefix that matches few keys, or none, walks the whole type. Each row is the
p50/p99 of 50 calls; results go to benchmarks/results/key_search.json.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
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
from listing import ENTITIES, fill_postgres, fill_sqlite

import corral
from corral.persistence import open_store

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "key_search.json"
N = 100_000
SAMPLES = 50
PAGE = 100
CASES = (  # (label, type, prefix, keys found)
    ("one type, 250 match", "Order", "key-00050", PAGE),
    ("all types, 1,000 match", None, "key-00050", PAGE),
    ("one type, 1 match (late)", "Order", "key-00099997", 1),
    ("one type, none", "Order", "nokey", 0),
    ("no prefix (plain page)", "Order", None, PAGE),
)


def stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"p50_ms": statistics.median(s) * 1e3, "p99_ms": s[int(len(s) * 0.99) - 1] * 1e3}


async def timed(fn: Callable[[], Awaitable[int]], expected: int) -> list[float]:
    await fn()
    out = []
    for _ in range(SAMPLES):
        began = time.perf_counter()
        got = await fn()
        out.append(time.perf_counter() - began)
        assert got == expected, (got, expected)
    return out


async def measure(store: str, raw: Callable[[str | None, str | None], Awaitable[int]]
                  ) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with corral.open_runtime(store, entities=ENTITIES, host=False) as rt:
        for label, etype, prefix, expected in CASES:
            async def api(etype: str | None = etype, prefix: str | None = prefix) -> int:
                return len((await rt.entities(etype, limit=PAGE, key_prefix=prefix)).items)

            async def ceiling(etype: str | None = etype, prefix: str | None = prefix) -> int:
                return await raw(etype, prefix)

            c, r = stats(await timed(api, expected)), stats(await timed(ceiling, expected))
            rows.append({"case": label, "corral": c, "raw_sql": r,
                         "ratio_p50": c["p50_ms"] / r["p50_ms"]})
            print(f"  {label:<26} corral p50 {c['p50_ms']:7.2f} ms  p99 {c['p99_ms']:7.2f} ms"
                  f"   raw SQL p50 {r['p50_ms']:7.2f} ms   corral/raw "
                  f"{c['p50_ms'] / r['p50_ms']:.2f}", flush=True)
    return rows


_COLUMNS = "etype, key, shard, run_id, status, next_seq - 1, passivated_seq, updated_at"


async def bench_sqlite(tmp: str) -> list[dict[str, Any]]:
    path = str(Path(tmp) / "search.db")
    await (await open_store(path, shards=16)).close()
    fill_sqlite(path, N)
    db = sqlite3.connect(path)

    async def raw(etype: str | None, prefix: str | None) -> int:
        where, args = [], []
        if etype is not None:
            where.append("etype = ?")
            args.append(etype)
        if prefix is not None:
            where.append("key >= ? AND key < ?")
            args += [prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)]
        sql = (f"SELECT {_COLUMNS} FROM entities {'WHERE ' if where else ''}"
               f"{' AND '.join(where)} ORDER BY etype, key LIMIT ?")
        return len(db.execute(sql, (*args, PAGE)).fetchall())

    print(f"SQLite, {N:,} entities:", flush=True)
    try:
        return await measure(path, raw)
    finally:
        db.close()


async def bench_postgres(server: _pg.Server) -> list[dict[str, Any]]:
    async with server.database("search") as url:
        await (await open_store(url, shards=16)).close()
        await fill_postgres(url, N)
        conn = await asyncpg.connect(url)

        async def raw(etype: str | None, prefix: str | None) -> int:
            where, args = [], []
            if etype is not None:
                args.append(etype)
                where.append(f"etype = ${len(args)}")
            if prefix is not None:
                args.append(prefix)
                where.append(f"starts_with(key, ${len(args)})")
            sql = (f"SELECT {_COLUMNS} FROM entities {'WHERE ' if where else ''}"
                   f"{' AND '.join(where)} ORDER BY etype, key LIMIT ${len(args) + 1}")
            return len(await conn.fetch(sql, *args, PAGE))

        print(f"PostgreSQL, {N:,} entities:", flush=True)
        try:
            return await measure(url, raw)
        finally:
            await conn.close()


async def main(args: argparse.Namespace) -> None:
    result: dict[str, Any] = {"entities": N, "page": PAGE, "samples": SAMPLES,
                              "machine": platform.platform(), "date": time.strftime("%F")}
    with tempfile.TemporaryDirectory() as tmp:
        result["sqlite"] = await bench_sqlite(tmp)
    if not args.no_postgres:
        try:
            with _pg.throwaway_server() as server:
                result["postgresql"] = await bench_postgres(server)
        except _pg.ServerUnavailable as err:
            print(f"PostgreSQL: not run ({err})")
            result["postgresql"] = f"not run: {err}"
    write_json(RESULTS, result)
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-postgres", action="store_true")
    asyncio.run(main(parser.parse_args()))
