"""Scale part "hot" (issue 42, item 4): one entity receiving a million signals keeps a
store of bounded size, and its throughput and work per signal stay flat.

`measure(engine, url, quick)` (the contract of `benchmarks/scale.py`) sends 1,000,000
signals (`quick`: 100,000) to one entity with the default `SnapshotPolicy` (every 1,000,
keep 2) and `DedupeWindow` (100,000 ids), from 100 closed-loop senders
(`signal_with_start`, ~180-byte payloads), in ten windows of a tenth each. Figures:

- `database size` (MiB) after 200,000 signals (`quick`: 20,000) and at the end: SQLite's
  file and WAL, PostgreSQL's `pg_database_size`; flat means within 2x of the first
  (with `quick` the dedupe window, 100,000 ids, is still filling at the end: both
  stores grow ~2-2.6x, which says nothing about flatness);
- `buffers per signal` in the first and the last tenth (PostgreSQL only): shared blocks
  hit or read by the database's statements (`pg_stat_statements`, when the server
  preloads it: the store's own vacuums included), else by every backend of the
  database (`pg_stat_database`, autovacuum's included), per signal;
- `signals/s` in the first and the last tenth (its `size`: the signals sent by the
  end of that tenth).

Run alone (starts its own PostgreSQL with `pg_stat_statements` preloaded):

    python benchmarks/_scale_hot.py [--quick] [--no-postgres]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import corral

__all__ = ["measure"]

SENDERS = 100
TEXT = "The customer replied: the replacement part arrived, but the fan still rattles. " * 2
_MONITOR = "%pg_stat%"  # our own reads of the statistics, left out of the counts


class Ping(BaseModel):
    n: int
    text: str


class Begin(BaseModel):
    pass


class HotCounter(corral.Entity):
    """Counts its signals; the default snapshot policy and dedupe window."""

    def __init__(self, begin: Begin) -> None:
        self.count = 0

    @corral.signal
    def ping(self, p: Ping) -> None:
        self.count += 1


async def _send(ref: corral.EntityRef[HotCounter], first: int, n: int) -> None:
    async def sender(s: int) -> None:
        for i in range(first + s, first + n, SENDERS):
            await ref.signal_with_start(HotCounter.ping, Ping(n=i, text=TEXT), start=Begin())

    await asyncio.gather(*(sender(s) for s in range(SENDERS)))


class _Postgres:
    """The database's size and the shared blocks its work touched so far."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.source = "pg_stat_database"

    @classmethod
    async def open(cls, url: str) -> _Postgres:
        import asyncpg

        self = cls(await asyncpg.connect(url))
        try:
            await self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            await self.conn.fetchval("SELECT count(*) FROM pg_stat_statements")
            self.source = "pg_stat_statements"
        except asyncpg.PostgresError:  # not preloaded by this server
            pass
        return self

    async def size(self) -> int:
        return int(await self.conn.fetchval("SELECT pg_database_size(current_database())"))

    async def blocks(self) -> int:
        if self.source == "pg_stat_statements":
            found = await self.conn.fetchval(
                "SELECT sum(shared_blks_hit + shared_blks_read) FROM pg_stat_statements s "
                "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = current_database() "
                "AND s.query NOT LIKE $1", _MONITOR)
        else:
            found = await self.conn.fetchval(
                "SELECT blks_hit + blks_read FROM pg_stat_database "
                "WHERE datname = current_database()")
        return int(found or 0)


def _sqlite_size(path: str) -> int:
    return sum(p.stat().st_size for p in (Path(path), Path(f"{path}-wal")) if p.exists())


async def measure(engine: str, url: str, quick: bool) -> list[dict[str, object]]:
    """The hot entity's figures on the store at `url` (empty; `engine`: its kind)."""
    total = 100_000 if quick else 1_000_000
    tenth, reference = total // 10, total // 5  # 200,000 of a million
    pg = await _Postgres.open(url) if engine == "postgres" else None
    windows: list[dict[str, float]] = []
    sizes: dict[int, int] = {}
    try:
        async with corral.open_runtime(url, entities=[HotCounter]) as rt:
            ref = rt.ref(HotCounter, "hot-1")
            for first in range(0, total, tenth):
                blocks = await pg.blocks() if pg else 0
                started = time.perf_counter()
                await _send(ref, first, tenth)
                seconds = time.perf_counter() - started
                spent = (await pg.blocks() - blocks) if pg else 0
                sent = first + tenth
                windows.append({"sent": sent, "rate": tenth / seconds, "blocks": spent / tenth})
                if sent in (reference, total):
                    sizes[sent] = await pg.size() if pg else _sqlite_size(url)
                print(f"  hot {engine}: {sent:>9,} signals, {tenth / seconds:8,.0f}/s"
                      + (f", {spent / tenth:5.1f} buffers/signal" if pg else ""), flush=True)
    finally:
        if pg is not None:
            await pg.conn.close()
    figures: list[dict[str, object]] = [
        {"item": "hot", "case": "database size", "size": n, "value": b / 2**20, "unit": "MiB"}
        for n, b in sorted(sizes.items())]
    for w in (windows[0], windows[-1]):
        figures.append({"item": "hot", "case": "signals/s", "size": int(w["sent"]),
                        "value": w["rate"], "unit": "signals/s"})
        if pg is not None:
            figures.append({"item": "hot", "case": f"buffers per signal ({pg.source})",
                            "size": int(w["sent"]), "value": w["blocks"], "unit": "buffers"})
    return figures


async def _main(quick: bool, server: Any) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="corral-hot-") as tmp:
        results = {"sqlite": await measure("sqlite", str(Path(tmp) / "hot.db"), quick)}
    if server is not None:
        async with server.database("hot") as url:
            results["postgres"] = await measure("postgres", url, quick)
    for engine, figures in results.items():
        for f in figures:
            print(f"{engine:8} {f['case']:40} {f['size']:>9,} {f['value']:10.2f} {f['unit']}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _pg

    args = _pg.arguments(__doc__, "100,000 signals instead of 1,000,000").parse_args()
    if args.no_postgres:
        _pg.run(_main(args.quick, None))
    else:
        with _pg.throwaway_server(
                settings="-c shared_preload_libraries=pg_stat_statements") as found:
            _pg.run(_main(args.quick, found))
