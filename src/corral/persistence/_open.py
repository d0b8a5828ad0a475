"""Choosing the store from where it lives: a SQLite file, or a PostgreSQL URL.

`open_store` is the store's one `open_*`, as `open_runtime` is the runtime's, hence the
name this module shares with `corral.runtime._open` (which calls it).
"""

from __future__ import annotations

from ._sqlite import open_sqlite_store
from ._store import Store
from ._urls import is_postgres_url

__all__ = ["open_store"]


async def open_store(location: str, *, shards: int) -> Store:
    """Open the store at `location`: `postgresql://user:pw@host:port/db` (also
    `postgres://`; needs the `postgres` extra, asyncpg), else a SQLite path,
    `sqlite:///path` or `":memory:"`.

    Raises:
        StoreError: the store cannot be opened, or was written by a newer corral.
        ShardCountError: the store was created with another shard count (both named).
        InvalidArgumentError: a malformed PostgreSQL URL.
    """
    if is_postgres_url(location):
        from ._postgres import open_postgres_store  # asyncpg only when asked for

        return await open_postgres_store(location, shards=shards)
    return await open_sqlite_store(location, shards=shards)
