"""A store that is already there: found, and its shard count read, without writing.

Opening a store creates it if needed and migrates it; a tool that only works on the
application's store (the operator tools) must do neither, so it asks `stored_shards`
first. That reads the `meta` rows (`schema_version`, `shards`) the store pinned when
it was created, on a connection of its own that writes nothing: no table is created,
no pragma persisted, no file made. A file or database without them is not a store of
corral's, whatever else it holds (the application's own tables, or nothing: a 0-byte
file), and `":memory:"` never is (it would be new and empty, and gone on close).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

from corral._errors import InvalidArgumentError, StoreError

from ._pg_schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from ._schema import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from ._urls import is_postgres_url, redacted, transaction_pooled, url_refused

__all__ = ["stored_shards"]

# What a file that is not corral's answers: no such table or column, not a database.
# Told by message: `sqlite_errorname` exists only from Python 3.11 (on 3.10 every
# such file read as unreadable, a StoreError, not "not a corral store").
_NOT_OURS = ("no such table", "no such column", "not a database")


async def stored_shards(location: str, *, any_version: bool = False) -> int:
    """The shard count of the corral store at `location` (a SQLite path, `sqlite:///path`
    or a PostgreSQL URL), read without creating, migrating or writing anything.
    `any_version`: also of a store at another schema version (the application that
    opens it next migrates it; its shard count stays).

    Raises:
        InvalidArgumentError: no corral store there: `":memory:"`, no such file, or a
            file or database without corral's tables.
        StoreError: the store is at another schema version (an older one is migrated
            by the application when it next opens it; a newer one needs a newer
            corral), or cannot be read.
        StoreUnavailableError: the PostgreSQL server cannot be reached.
    """
    from ._sqlite import MEMORY

    if is_postgres_url(location):
        where = f"store {redacted(location)!r}"
        meta = await _postgres_meta(location, where)
        return _shards_of(meta, where, None if any_version else PG_SCHEMA_VERSION)
    if location in MEMORY:
        raise InvalidArgumentError(
            f"--store {location}: a ':memory:' store is new and empty, and gone with "
            "whatever was written to it when the command exits; name the application's "
            "store")
    path = location.removeprefix("sqlite:///")
    where = f"store {path!r}"
    meta = await asyncio.to_thread(_sqlite_meta, path, where)
    return _shards_of(meta, where, None if any_version else SQLITE_SCHEMA_VERSION)


def _shards_of(meta: dict[str, str], where: str, current: int | None) -> int:
    """The pinned shard count, if `meta` is a corral store's at schema `current` (None:
    at any)."""
    shards = meta.get("shards", "")
    if not (shards.isascii() and shards.isdecimal() and int(shards) > 0):
        raise InvalidArgumentError(
            f"{where} is not a corral store (no corral tables in it): name the store "
            "the application opens")
    version = meta.get("schema_version", "1")  # version 1 did not record it
    if current is not None and version != str(current):
        raise StoreError(
            f"{where} has schema version {version!r}, this corral's is {current}: the "
            "application migrates an older store when it opens it; a newer one needs a "
            "newer corral")
    return int(shards)


def _sqlite_meta(path: str, where: str) -> dict[str, str]:
    """The `meta` rows of a SQLite file, read on a connection that may not create it."""
    if not os.path.isfile(path):
        raise InvalidArgumentError(
            f"{where}: no such SQLite file (a store is created by the application that "
            "first opens it, never by an operator tool)")
    uri = Path(path).absolute().as_uri() + "?mode=rw"
    try:
        db = sqlite3.connect(uri, uri=True, timeout=30, isolation_level=None)
    except sqlite3.Error as err:
        raise StoreError(f"cannot open {where}: {err}") from err
    try:
        return {str(k): str(v) for k, v in db.execute("SELECT k, v FROM meta")}
    except sqlite3.Error as err:
        if any(phrase in str(err) for phrase in _NOT_OURS):
            return {}
        raise StoreError(f"cannot read {where}: {err}") from err
    finally:
        db.close()


async def _postgres_meta(url: str, where: str) -> dict[str, str]:
    """The `meta` rows of a PostgreSQL database ({} when it has no such table)."""
    import asyncpg  # type: ignore[import-untyped, import-not-found, unused-ignore]

    from ._pg_txn import store_error

    try:
        dsn, pooled = transaction_pooled(url)  # behind PgBouncer: no prepared statements
        conn = await asyncpg.connect(dsn, timeout=30, command_timeout=30,
                                     statement_cache_size=0 if pooled else 100)
    except ValueError as err:  # the URL is malformed: no retry fixes it
        raise url_refused(url, err) from None  # its message quotes the URL's secrets
    except Exception as err:
        raise store_error(f"cannot open {where}", err) from err
    try:
        if not await conn.fetchval("SELECT to_regclass('meta') IS NOT NULL"):
            return {}
        rows = await conn.fetch("SELECT k::text, v::text FROM meta")
    except (asyncpg.UndefinedColumnError, asyncpg.UndefinedFunctionError):
        return {}  # a table of the application's own named meta
    except Exception as err:
        raise StoreError(f"cannot read {where}: {type(err).__name__}: {err}") from err
    finally:
        await conn.close()
    return {str(r[0]): str(r[1]) for r in rows}


