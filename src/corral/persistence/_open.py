"""Choosing the store from where it lives: a SQLite file, or a PostgreSQL URL."""

from __future__ import annotations

from ._sqlite import open_sqlite_store
from ._store import Store

__all__ = ["is_postgres_url", "open_store", "redacted"]

_POSTGRES = ("postgresql://", "postgres://")


def is_postgres_url(location: str) -> bool:
    """Whether `location` names a PostgreSQL database (`postgresql://` or `postgres://`)."""
    return location.startswith(_POSTGRES)


def redacted(url: str) -> str:
    """The URL without its password, for messages and reprs."""
    head, sep, tail = url.rpartition("@")
    if not sep or "://" not in head:
        return url
    scheme, _, creds = head.partition("://")
    return f"{scheme}://{creds.split(':', 1)[0]}@{tail}"


async def open_store(location: str, *, shards: int) -> Store:
    """Open the store at `location`: `postgresql://user:pw@host:port/db` (also
    `postgres://`; needs the `postgres` extra, asyncpg), else a SQLite path,
    `sqlite:///path` or `":memory:"`.

    Raises:
        StoreError: the store cannot be opened, or was written by a newer corral.
        ShardCountError: the store was created with another shard count (both named).
    """
    if is_postgres_url(location):
        from ._postgres import open_postgres_store  # asyncpg only when asked for

        return await open_postgres_store(location, shards=shards)
    return await open_sqlite_store(location, shards=shards)
