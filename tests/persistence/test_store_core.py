"""The store core (`persistence/_txn`): SQL written once with `?` placeholders, numbered
for PostgreSQL; ops driven to completion on SQLite's synchronous primitives, and one
that would suspend there refused instead of half-run; the store roles."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3

import pytest

from corral.persistence import AcceptStore, HostStore, ReadStore, SqliteStore, Store
from corral.persistence._sqlite_txn import SqliteTxn
from corral.persistence._txn import drive


def test_sql_written_once_is_numbered_for_postgresql() -> None:
    numbered = pytest.importorskip("corral.persistence._pg_txn").numbered
    assert numbered("SELECT a FROM t WHERE b = ? AND c IN (?, ?)") == \
        "SELECT a FROM t WHERE b = $1 AND c IN ($2, $3)"
    assert numbered("DELETE FROM d WHERE etype=?1 AND key=?2 AND seq < ?3") == \
        "DELETE FROM d WHERE etype=$1 AND key=$2 AND seq < $3"


def test_an_op_on_sqlite_runs_to_completion_in_the_calling_thread() -> None:
    # closed explicitly: Python 3.13 warns of a connection left to the garbage collector
    with contextlib.closing(sqlite3.connect(":memory:", isolation_level=None)) as db:
        db.execute("CREATE TABLE leases (shard INTEGER PRIMARY KEY, owner TEXT, "
                   "epoch INTEGER, expires_at REAL)")
        db.execute("INSERT INTO leases VALUES (3, 'host', 7, 0)")
        txn = SqliteTxn(db=db)
        assert drive(txn.lease(3)) == ("host", 7, 0.0)
        assert drive(txn.execute("UPDATE leases SET epoch = ? WHERE shard = ?", 8, 3)) == 1


def test_an_op_that_would_suspend_on_sqlite_is_refused_not_half_run() -> None:
    async def suspends() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="suspended"):
        drive(suspends())


def test_each_store_role_is_part_of_store() -> None:
    assert {AcceptStore, HostStore, ReadStore} <= set(Store.__mro__)
    assert "idle" in dir(Store)
    assert isinstance(SqliteStore.idle, property)
