"""Idle cost per host (issue 42, item 3; part of `benchmarks/scale.py`).

N idle host processes (1, 4, 8; `quick`: 1, 4) hold every shard of a store of 16 and
of 256 shards and do nothing else. Once every shard is leased and a warm-up has
passed (a burst's extra pooled connections close), a window is measured:

- statements/s per host: PostgreSQL counts them on the server, `pg_stat_statements`
  calls when the server preloads it, else `pg_stat_database` transactions (case
  "statements/s (xacts)"); SQLite counts them in each host process (a trace callback
  on the store's connections, written to a file every second).
- transactions/s per host: `pg_stat_database` commits and rollbacks; on SQLite the
  `BEGIN`s the hosts ran.
- connections per host (PostgreSQL): backends named `corral*` in `pg_stat_activity`
  over N, the median of the samples taken every 0.5 s over the window (and the most
  seen: a moment when two statements overlap for longer than the pool's patience).
- the projection to 100 hosts (PostgreSQL): connections made directly (100 x the
  figure above) and through PgBouncer in transaction mode (its server connections are
  its pool: `PGBOUNCER_POOL`, whatever the number of hosts).

Run alone: `python -m benchmarks._scale_idle [--quick] [--url POSTGRESQL_URL]`. A host is this
module run as `python -m benchmarks._scale_idle --host URL --shards S --counts FILE`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import corral
from corral.persistence import open_store

__all__ = ["measure"]

LEASE_TTL = 10.0  # the runtime's default
SHARD_COUNTS = (16, 256)
PGBOUNCER_POOL = 20  # PgBouncer's default_pool_size in the docs' example
WARM_UP = 15.0  # seconds after every shard is leased (pooled connections close in 10)
_ROOT = Path(__file__).resolve().parents[1]


class Nothing(BaseModel):
    pass


class Idle(corral.Entity):
    """Hosted but never sent to: the host's own loops are all that runs."""

    @corral.signal
    async def poke(self, msg: Nothing) -> None:
        pass


# -- a host process ---------------------------------------------------------------------


async def _host(url: str, shards: int, counts: Path) -> None:
    store = await open_store(url, shards=shards)
    seen = {"statements": 0, "begins": 0}
    if not url.startswith(("postgresql://", "postgres://")):
        await _trace_sqlite(store, seen)
    async with corral.open_runtime(store, entities=[Idle], lease_ttl=LEASE_TTL):
        while True:
            counts.write_text(json.dumps(seen))  # noqa: ASYNC240 (a few bytes a second)
            await asyncio.sleep(1.0)


async def _trace_sqlite(store: Any, seen: dict[str, int]) -> None:
    def traced(sql: str) -> None:
        seen["statements"] += 1
        if sql.lstrip().upper().startswith("BEGIN"):
            seen["begins"] += 1

    threads = {id(t): t for t in (getattr(store, "_writer", None),
                                  getattr(store, "_reader", None)) if t is not None}
    for thread in threads.values():
        await thread.call(lambda db: db.set_trace_callback(traced))


# -- the measurement ----------------------------------------------------------------------


@contextlib.contextmanager
def _hosts(url: str, shards: int, n: int, where: Path) -> Iterator[list[Path]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(corral.__file__).parents[1]), str(_ROOT), os.environ.get("PYTHONPATH", "")])}
    counts = [where / f"counts-{shards}-{n}-{i}.json" for i in range(n)]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "benchmarks._scale_idle", "--host", url, "--shards",
         str(shards), "--counts", str(c)], cwd=_ROOT, env=env, stdout=subprocess.DEVNULL)
        for c in counts]
    try:
        yield counts
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class _Server:
    """What the measurement reads from the store's own side."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.postgres = url.startswith(("postgresql://", "postgres://"))
        self._conn: Any = None
        self.statements_view = False

    async def __aenter__(self) -> _Server:
        if self.postgres:
            import asyncpg
            self._conn = await asyncpg.connect(self.url)
            with contextlib.suppress(Exception):
                await self._conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                await self._conn.fetchval("SELECT count(*) FROM pg_stat_statements")
                self.statements_view = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._conn is not None:
            await self._conn.close()

    async def leased(self) -> int:
        """Shards leased now (0 before the hosts made the schema)."""
        sql = "SELECT count(*) FROM leases WHERE owner <> '' AND expires_at > {}"
        now = time.time()
        if self.postgres:
            if not await self._conn.fetchval("SELECT to_regclass('leases') IS NOT NULL"):
                return 0
            return int(await self._conn.fetchval(sql.format("$1"), now))
        with contextlib.closing(sqlite3.connect(self.url, timeout=30)) as db:
            try:
                return int(db.execute(sql.format("?"), (now,)).fetchone()[0])
            except sqlite3.OperationalError:
                return 0

    async def counters(self) -> tuple[int, int]:
        """(statements, transactions) the database ran so far (PostgreSQL)."""
        xacts = int(await self._conn.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"))
        if not self.statements_view:
            return xacts, xacts
        calls = await self._conn.fetchval(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE dbid = (SELECT oid "
            "FROM pg_database WHERE datname = current_database()) AND query NOT LIKE '%pg_stat%'"
            " AND query NOT LIKE '%pg_database%'")
        return int(calls), xacts

    async def connections(self) -> int:
        return int(await self._conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'corral%'"))


def _summed(counts: list[Path]) -> tuple[int, int]:
    total = begins = 0
    for path in counts:
        with contextlib.suppress(OSError, ValueError):
            seen = json.loads(path.read_text())
            total, begins = total + seen["statements"], begins + seen["begins"]
    return total, begins


async def _one(url: str, shards: int, n: int, window: float, where: Path
               ) -> list[dict[str, object]]:
    async with _Server(url) as server:
        with _hosts(url, shards, n, where) as counts:
            deadline = time.monotonic() + 180
            while await server.leased() < shards:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{n} hosts did not lease {shards} shards in 180 s")
                await asyncio.sleep(0.5)
            await asyncio.sleep(WARM_UP)
            began = time.monotonic()
            before = await server.counters() if server.postgres else _summed(counts)
            held: list[int] = []
            while time.monotonic() - began < window:
                await asyncio.sleep(0.5)
                if server.postgres:
                    held.append(await server.connections())
            after = await server.counters() if server.postgres else _summed(counts)
            took = time.monotonic() - began
    statements, xacts = ((a - b) / took / n for a, b in zip(after, before, strict=True))
    case = f"{shards} shards"
    kind = "statements/s" if not server.postgres or server.statements_view \
        else "statements/s (xacts)"
    figures: list[dict[str, object]] = [
        {"item": "idle", "case": f"{kind} per host, {case}", "size": n,
         "value": round(statements, 2), "unit": "1/s"},
        {"item": "idle", "case": f"transactions/s per host, {case}", "size": n,
         "value": round(xacts, 2), "unit": "1/s"},
    ]
    if server.postgres:
        per_host = statistics.median(held) / n
        figures += [
            {"item": "idle", "case": f"connections per host, {case}", "size": n,
             "value": round(per_host, 2), "unit": "connections"},
            {"item": "idle", "case": f"connections per host (most seen), {case}", "size": n,
             "value": round(max(held) / n, 2), "unit": "connections"},
            {"item": "idle", "case": f"100 hosts direct, {case} (from {n})", "size": 100,
             "value": round(per_host * 100), "unit": "connections"},
            {"item": "idle", "case": f"100 hosts through PgBouncer, {case}", "size": 100,
             "value": PGBOUNCER_POOL, "unit": "server connections"},
        ]
    return figures


async def _store_of(engine: str, url: str, shards: int, n: int) -> str:
    """A fresh store for one round: `url` for the first, a sibling for the others
    (the file beside it, or a database on the same server)."""
    if (shards, n) == (SHARD_COUNTS[0], 1):
        return url
    if engine == "sqlite":
        return f"{url}.{shards}-{n}"
    import asyncpg
    base, _, name = url.rpartition("/")
    sibling = f"{name}_s{shards}_n{n}"
    admin = await asyncpg.connect(url)
    try:
        await admin.execute(f'CREATE DATABASE "{sibling}"')
    finally:
        await admin.close()
    return f"{base}/{sibling}"


async def measure(engine: str, url: str, quick: bool) -> list[dict[str, object]]:
    """The idle figures for `engine`'s empty store at `url` (see the module docstring)."""
    sizes, window = ((1, 4), 10.0) if quick else ((1, 4, 8), 20.0)
    figures: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="corral-idle-") as where:
        for shards in SHARD_COUNTS:
            for n in sizes:
                store = await _store_of(engine, url, shards, n)
                figures += await _one(store, shards, n, window, Path(where))
    return figures


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--counts")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--url", help="a PostgreSQL URL of an empty database to use")
    args = parser.parse_args()
    if args.host:
        asyncio.run(_host(args.host, args.shards, Path(args.counts)))
        return
    with tempfile.TemporaryDirectory(prefix="corral-idle-") as where:
        figures = asyncio.run(measure("sqlite", str(Path(where) / "idle.db"), args.quick))
        if args.url:
            figures += asyncio.run(measure("postgres", args.url, args.quick))
    for f in figures:
        print(f"{f['case']:<45} N={f['size']:<4} {f['value']:>10} {f['unit']}")


if __name__ == "__main__":
    _main()
