"""A shard's recovery read seeks its own running entities (issue 42): on SQLite too, the
partial index `entities_running` (shard) WHERE status = 'running', never a walk of every
running entity of every shard through `entities_status`."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from corral.persistence import open_store
from corral.persistence._reads import RUNNING_ENTITIES, URGENT_ENTITIES, dead_letter_page
from corral.persistence._schema import SCHEMA_VERSION
from corral.persistence._sqlite_txn import SqliteTxn

INDEX = SqliteTxn.RUNNING_INDEX  # as the store runs it


async def test_the_recovery_read_of_a_shard_seeks_the_running_index(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    await (await open_store(path, shards=4)).close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        plan = [row[-1] for row in db.execute(
            f"EXPLAIN QUERY PLAN {URGENT_ENTITIES.format(index=INDEX)}", (2, 2, 0.0))]
        running = [row[-1] for row in db.execute(
            f"EXPLAIN QUERY PLAN {RUNNING_ENTITIES.format(index=INDEX)}", (2,))]
    # The urgency of each row: the shard's due timers sought once, then primary-key
    # lookups of its own rows, never a walk.
    assert plan[0] == "SEARCH entities USING INDEX entities_running (shard=?)", plan
    assert "SEARCH t USING COVERING INDEX timers_shard_due (shard=? AND due_at<?)" in plan
    assert not [step for step in plan if step.startswith("SCAN")], plan
    assert running == ["SEARCH entities USING INDEX entities_running (shard=?)"], running


async def test_a_store_of_schema_14_gains_the_running_index(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    await (await open_store(path, shards=4)).close()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("DROP INDEX entities_running")
        db.execute("ALTER TABLE entities DROP COLUMN first_seq")  # schema 18's
        db.execute("UPDATE meta SET v = ? WHERE k = 'schema_version'", ("14",))
    await (await open_store(path, shards=4)).close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND "
                          "name = 'entities_running'").fetchone() == (1,)
        assert db.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone() == \
            (str(SCHEMA_VERSION),)


def _plan(path: str, sql: str, *args: object) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", args)]


async def test_a_page_of_one_types_or_one_entitys_dead_letters_is_a_seek(
        tmp_path: Path) -> None:
    """Operators page dead letters in id order by type, or by entity: a seek of an index
    in that order (it sorted every letter of the type: x37 from 10k to 1M entities)."""
    path = str(tmp_path / "store.db")
    await (await open_store(path, shards=4)).close()
    by_type, _ = dead_letter_page("T", None, row_cursor=False)
    assert _plan(path, by_type, 0, "T", 10) == [
        "SEARCH dead_letters USING INDEX dead_letters_type (etype=? AND id>?)"], by_type
    by_entity, _ = dead_letter_page("T", "k", row_cursor=False)
    assert _plan(path, by_entity, 0, "T", "k", 10) == [
        "SEARCH dead_letters USING INDEX dead_letters_key (etype=? AND key=? AND id>?)"]
