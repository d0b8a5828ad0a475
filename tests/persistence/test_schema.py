"""Versioned schema: a store made by an earlier corral is upgraded when opened; a store
written by a newer corral is refused, naming both versions.

The upgrade and refusal tests are about SQLite files (a schema-1 file made by an earlier
corral, edited with sqlite3); `test_postgres_store.py` refuses a newer or re-sharded
PostgreSQL store. A new store is created at the current version on both stores."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path

import pytest

import corral
from corral.persistence import open_sqlite_store, open_store
from corral.persistence._pg_schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from corral.persistence._schema import SCHEMA_VERSION
from entities import Job, Reply, Start, Ticket, wait_applied
from stores import is_postgres, sql

SCHEMA_1 = Path(__file__).resolve().parents[1] / "support" / "data" / "store-schema-1.db"
"""Made by corral at schema 1: Ticket 'ticket-1' running with replies r0-r2, Job
'job-1' completed."""


def indexes(location: str) -> set[str]:
    if is_postgres(location):
        query = "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
    else:
        query = "SELECT name FROM sqlite_master WHERE type='index'"
    return {r[0] for r in sql(location, query)}


async def test_a_store_made_with_schema_1_is_upgraded_and_keeps_working(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    shutil.copy(SCHEMA_1, path)
    assert sql(path, "SELECT v FROM meta WHERE k='schema_version'") == [("1",)]
    assert "timers_shard_due" not in indexes(path)
    with contextlib.closing(sqlite3.connect(path)) as db, db:  # a dead letter to carry over
        db.execute("INSERT INTO dead_letters (id, etype, key, run_id, seq, message_id, name, "
                   "payload, sender, error, traceback, attempts, failed_at) VALUES (7, "
                   "'Ticket', 'ticket-9', 1, 2, 'm-1', 'reply', '{}', NULL, 'e', 'tb', 3, 1.0)")
    async with corral.open_runtime(path, entities=[Ticket, Job]) as rt:
        ref = rt.ref(Ticket, "ticket-1")
        ack = await ref.signal(Ticket.reply, Reply(text="r3"), message_id="m-3")
        assert ack.seq == 4
        dup = await ref.signal(Ticket.reply, Reply(text="r0"), message_id="m-0")
        assert dup.status == "duplicate"  # the old dedupe window carried over
        await wait_applied(ref, 4)
        assert (await ref.query(Ticket.status)).inbox == [f"acme:r{i}" for i in range(4)]
        assert (await rt.ref(Job, "job-1").result()).tenant == "acme"
    assert sql(path, "SELECT v FROM meta WHERE k='schema_version'") == [(str(SCHEMA_VERSION),)]
    assert {"timers_shard_due", "entities_status", "signal_waits_open"} <= indexes(path)
    assert sql(path, "SELECT key, updated_at IS NOT NULL FROM entities ORDER BY key") == [
        ("job-1", 0), ("ticket-1", 1)]  # written since the upgrade, or not
    [(dead_letters,)] = sql(path, "SELECT sql FROM sqlite_master WHERE name='dead_letters'")
    assert "AUTOINCREMENT" in dead_letters  # schema 4 rebuilt the table, keeping its rows
    assert sql(path, "SELECT id, message_id, attempts FROM dead_letters") == [(7, "m-1", 3)]
    assert sql(path, "SELECT count(*) FROM suspensions") == [(0,)]  # schema 6
    assert "suspensions_shard" in indexes(path)


async def test_a_store_at_schema_5_gains_the_suspensions_table_and_suspends_runs(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "five.db")
    async with corral.open_runtime(path, entities=[Ticket]) as rt:
        await rt.ref(Ticket, "t-1").signal_with_start(Ticket.reply, Reply(text="a"),
                                                      start=Start(tenant="acme"))
    # Back to what a corral of schema 5 wrote: no suspensions table.
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("DROP TABLE suspensions")
        db.execute("ALTER TABLE entities DROP COLUMN first_seq")  # schema 18's
        db.execute("UPDATE meta SET v='5' WHERE k='schema_version'")
    async with corral.open_runtime(path, entities=[Ticket]) as rt:
        ref = rt.ref(Ticket, "t-1")
        await ref.signal(Ticket.reply, Reply(text="b"))
        await wait_applied(ref, 2)
        assert (await ref.describe()).suspension is None
        assert [e.suspended for e in (await rt.entities(Ticket)).items] == [False]
    assert sql(path, "SELECT v FROM meta WHERE k='schema_version'") == [(str(SCHEMA_VERSION),)]
    assert sql(path, "SELECT count(*) FROM suspensions") == [(0,)]
    assert "suspensions_shard" in indexes(path)


async def test_a_new_store_is_created_at_the_current_version(db_path: str) -> None:
    store = await open_store(db_path, shards=4)
    await store.close()
    version = PG_SCHEMA_VERSION if is_postgres(db_path) else SCHEMA_VERSION
    assert sql(db_path, "SELECT k, v FROM meta ORDER BY k") == [
        ("schema_version", str(version)), ("shards", "4")]
    assert {"timers_shard_due", "entities_status"} <= indexes(db_path)


def schema(location: str) -> dict[str, object]:
    """Every table's columns (in order) and every index of the store, as its engine's
    catalog describes them."""
    if is_postgres(location):
        return {
            "columns": sql(location, "SELECT table_name, column_name, data_type, is_nullable, "
                           "column_default, is_identity FROM information_schema.columns WHERE "
                           "table_schema = current_schema() ORDER BY table_name, ordinal_position"),
            "indexes": set(sql(location, "SELECT tablename, indexname, indexdef FROM pg_indexes "
                               "WHERE schemaname = current_schema()")),
            "storage": set(sql(location, "SELECT relname, array_to_string(reloptions, ',') "
                               "FROM pg_class WHERE relnamespace = current_schema()::regnamespace "
                               "AND reloptions IS NOT NULL"))}
    found: dict[str, object] = {}
    for name, create in sql(location, "SELECT name, sql FROM sqlite_master WHERE type='table'"):
        found[name] = (sql(location, f"PRAGMA table_info({name})"),
                       "WITHOUT ROWID" in create, "AUTOINCREMENT" in create,
                       {(index[1:], tuple(sql(location, f"PRAGMA index_info({index[1]})")))
                        for index in sql(location, f"PRAGMA index_list({name})")})
    return found


async def test_a_new_store_has_exactly_the_schema_of_one_migrated_from_schema_1(
    db_path: str, tmp_path: Path,
) -> None:
    """A new store is created at the current schema at once, an old one migrated step by
    step: both must end up alike (tables, columns in order, types, keys, indexes)."""
    await (await open_store(db_path, shards=16)).close()
    new = schema(db_path)
    if is_postgres(db_path):  # back to what a corral of schema 1 wrote
        for statement in ("DROP TABLE signal_waits", "DROP TABLE suspensions",
                          "DROP INDEX dedupe_sweep", "ALTER TABLE entities DROP COLUMN updated_at",
                          "ALTER TABLE entities DROP COLUMN first_seq",
                          "ALTER TABLE entities RESET (fillfactor)",
                          "ALTER TABLE shard_ticks RESET (fillfactor)",
                          *(f"ALTER TABLE {t} RESET (autovacuum_vacuum_threshold, "
                            "autovacuum_vacuum_scale_factor, autovacuum_vacuum_cost_delay)"
                            for t in ("journal", "dedupe", "snapshots")),
                          "UPDATE meta SET v = '1' WHERE k = 'schema_version'"):
            sql(db_path, statement)
        old = db_path
    else:
        old = str(tmp_path / "old.db")
        shutil.copy(SCHEMA_1, old)
    await (await open_store(old, shards=16)).close()
    assert schema(old) == new


async def test_a_store_written_by_a_newer_corral_is_refused_and_left_untouched(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "newer.db")
    shutil.copy(SCHEMA_1, path)
    future = SCHEMA_VERSION + 7
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE meta SET v=? WHERE k='schema_version'", (str(future),))
    with pytest.raises(corral.StoreError) as caught:
        await open_sqlite_store(path, shards=16)
    assert f"schema version {future}" in str(caught.value)
    assert f"versions up to {SCHEMA_VERSION}" in str(caught.value)
    assert sql(path, "SELECT v FROM meta WHERE k='schema_version'") == [(str(future),)]
    assert "timers_shard_due" not in indexes(path)


async def test_a_store_with_an_unreadable_schema_version_is_refused_with_a_store_error(
    db_path: str,
) -> None:
    """Issue 21, item 5: SQLite let `int()`'s ValueError out of `open_runtime`."""
    async with corral.open_runtime(db_path, entities=[Ticket], shards=4):
        pass
    sql(db_path, "UPDATE meta SET v='garbage' WHERE k='schema_version'")
    with pytest.raises(corral.StoreError, match="unreadable schema version 'garbage'") as caught:
        async with corral.open_runtime(db_path, entities=[Ticket], shards=4):
            pass
    assert "meta" in str(caught.value)  # where to look
    assert sql(db_path, "SELECT v FROM meta WHERE k='schema_version'") == [("garbage",)]


async def test_a_store_is_refused_with_another_shard_count(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    shutil.copy(SCHEMA_1, path)
    with pytest.raises(corral.ShardCountError, match="shards=16, this runtime uses 4"):
        await open_sqlite_store(path, shards=4)


_ = Start
