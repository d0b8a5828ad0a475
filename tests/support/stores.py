"""Where a test's store lives, and reading it directly, on either store.

The `db_path` fixture (`tests/conftest.py`) is a store *location*, as
`corral.open_runtime` takes it: a SQLite file under `tmp_path`, or the `postgresql://`
URL of a database on the session's cluster (`tests/support/pg.py`), emptied before each test
(`reset_postgres`). The helpers here take that location and run SQL on whichever store
it names, synchronously, as plain `sqlite3` does: tests call them from inside async
tests without awaiting, and worker processes call them too. On PostgreSQL each call
runs asyncpg on a private event loop in a short-lived thread, with its own connection,
and `?` placeholders are rewritten to `$1..$n`.

The PostgreSQL schema mirrors the SQLite one table by table; what differs, and what the
tests do about it:

- the SQLite journal's `pos` (a global position) is PostgreSQL's `tick` (per shard), and
  PostgreSQL has a `shard_ticks` table: no test reads either;
- PostgreSQL's `leases` holds one row per shard from the start (owner `''`, epoch 0);
  SQLite's gets a row the first time a shard is leased (see `leased_owners`);
- BLOB and bytea both read back as `bytes`; pass a blob as a `bytes` parameter, not an
  `x'..'` literal;
- SQLite lists `sqlite_sequence` among its tables (`tables`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import sqlite3
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from corral.persistence import is_postgres_url

__all__ = [
    "is_postgres",
    "leased_owners",
    "reset_postgres",
    "row_counts",
    "sql",
    "store_rows",
    "tables",
]

T = TypeVar("T")
_TIMEOUT = 60.0  # seconds for one call on PostgreSQL: connect, query, close
_LARGE = 32 * 2**20  # bytes: a database this large (~8 MiB when new) is reset by a drop
_PLACEHOLDER = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?")


def is_postgres(location: str) -> bool:
    """Whether `location` names a PostgreSQL database, not a SQLite file."""
    return is_postgres_url(location)


def sql(location: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run one statement on the store at `location` (committed); all its rows as tuples.

    `query` uses `?` placeholders on both stores."""
    return _run(location, [(query, params)])[0]


def vm_steps(location: str, read: Callable[[Any], Coroutine[Any, Any, T]]) -> tuple[int, T]:
    """SQLite VM steps of `read` (given a `SqliteTxn` on its own connection to the store
    at `location`; a progress handler called at every instruction), and its result:
    work that the machine's load cannot change."""
    from corral.persistence._sqlite_txn import SqliteTxn
    from corral.persistence._txn import drive

    db = sqlite3.connect(location, isolation_level=None)
    steps = [0]

    def step() -> int:
        steps[0] += 1
        return 0

    db.set_progress_handler(step, 1)
    try:
        found = drive(read(SqliteTxn(db=db)))  # type: ignore[arg-type]
    finally:
        db.close()
    return steps[0], found


def tables(location: str) -> list[str]:
    """The names of the store's tables, sorted."""
    if is_postgres(location):
        query = ("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                 "ORDER BY tablename")
    else:
        query = "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name"
    return [r[0] for r in sql(location, query)]


def store_rows(location: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, each table's rows sorted (leases only counted:
    renewals move their expiry)."""
    names = tables(location)
    queries = [('SELECT count(*) FROM "leases"' if n == "leases" else f'SELECT * FROM "{n}"',
                ()) for n in names]
    return {n: sorted(rows, key=repr)
            for n, rows in zip(names, _run(location, queries), strict=True)}


def row_counts(location: str) -> dict[str, int]:
    """Row count of every table in the store."""
    names = tables(location)
    counts = _run(location, [(f'SELECT count(*) FROM "{n}"', ()) for n in names])
    return {n: rows[0][0] for n, rows in zip(names, counts, strict=True)}


def leased_owners(location: str) -> set[str]:
    """The owners of the store's shard leases: shards never leased have no row on
    SQLite and a row owned by `''` on PostgreSQL, so neither counts."""
    return {o for (o,) in sql(location, "SELECT owner FROM leases WHERE owner <> ''")}


def reset_postgres(url: str) -> None:
    """Empty the database at `url` completely, as a new one is, for the next test.

    Every other session on it is ended first (a leftover store would hold locks). Then,
    usually, every row of every table is deleted and every sequence restarted (~10 ms;
    the tables are the ones this corral creates, so the next store to open it finds no
    `meta` rows, runs its no-op `CREATE ... IF NOT EXISTS` and pins its own shard count).
    A database grown large (a scale test) gets its schema dropped and recreated instead
    (~15 ms, but the next open then creates every table: ~40 ms more), so no test
    inherits another's dead rows.
    """

    async def reset(conn: Any) -> None:
        await conn.execute("SET lock_timeout = '30s'")
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        names = [r[0] for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        size = await conn.fetchval("SELECT pg_database_size(current_database())")
        if names and size < _LARGE:
            sequences = [r[0] for r in await conn.fetch(
                "SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'")]
            async with conn.transaction():
                await conn.execute("".join(f'DELETE FROM public."{n}";' for n in names))
                for name in sequences:
                    await conn.execute(f'ALTER SEQUENCE public."{name}" RESTART')
        else:
            await conn.execute("DROP SCHEMA IF EXISTS public CASCADE")
            await conn.execute("CREATE SCHEMA public")

    _on_postgres(url, reset)


def _run(location: str, statements: Sequence[tuple[str, Sequence[Any]]]
         ) -> list[list[tuple[Any, ...]]]:
    """Run `statements` (query, params) in order on one connection and commit; the rows
    of each."""
    if not is_postgres(location):
        with contextlib.closing(sqlite3.connect(location)) as db, db:
            return [db.execute(q, tuple(p)).fetchall() for q, p in statements]

    async def fetch(conn: Any) -> list[list[tuple[Any, ...]]]:
        return [[tuple(r) for r in await conn.fetch(_numbered(q), *p)] for q, p in statements]

    return _on_postgres(location, fetch)


def _numbered(query: str) -> str:
    """`?` placeholders (outside quotes) as PostgreSQL's `$1, $2, ...`."""
    n = itertools.count(1)
    return _PLACEHOLDER.sub(lambda m: f"${next(n)}" if m.group() == "?" else m.group(), query)


def _on_postgres(url: str, work: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
    """Run `work(connection)` on a fresh connection to `url`, in a thread of its own (the
    caller may be inside a running event loop), and wait for it."""
    import asyncpg  # only when a test uses PostgreSQL

    async def main() -> T:
        conn = await asyncpg.connect(url, timeout=_TIMEOUT, command_timeout=_TIMEOUT)
        try:
            return await work(conn)
        finally:
            await conn.close()

    box: dict[str, Any] = {}

    def thread() -> None:
        try:
            box["result"] = asyncio.run(main())
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    runner = threading.Thread(target=thread, name="corral-tests-sql", daemon=True)
    runner.start()
    runner.join(_TIMEOUT * 2)
    if runner.is_alive():
        raise TimeoutError(f"a query on {url} took more than {_TIMEOUT * 2:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["result"]  # type: ignore[no-any-return]
