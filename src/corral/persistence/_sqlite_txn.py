"""SQLite's transaction primitives under the shared `Txn` (see `_txn`).

Every primitive is a plain `sqlite3` call that never suspends: the writer thread runs
each op's coroutine to completion with `drive`. `BEGIN IMMEDIATE` takes the file's
write lock for the whole batch, so there is nothing to lock row by row (`lock` is a
no-op) and a read is the row as this transaction sees it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ._txn import Txn, code_point_range

__all__ = ["ADD_COUNTS", "SWEEP_DEDUPE", "SqliteTxn"]

_JOURNAL_INSERT = (
    "INSERT INTO journal (etype, key, seq, run_id, shard, kind, name, message_id, payload, "
    "sender, accepted_at, trace) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_DEDUPE_INSERT = (
    "INSERT INTO dedupe (etype, key, message_id, seq, run_id, payload_hash, sender, "
    "accepted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_RUNS_INSERT = (
    "INSERT INTO runs (etype, key, run_id, status, start_input, started_at, first_seq) "
    "VALUES (?, ?, ?, 'running', ?, ?, ?)"
)
_ENTITIES_UPSERT = (
    "INSERT INTO entities (etype, key, shard, run_id, status, next_seq, updated_at, "
    "first_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (etype, key) DO UPDATE SET "
    "run_id=excluded.run_id, status=excluded.status, next_seq=excluded.next_seq, "
    "updated_at=excluded.updated_at, "
    "first_seq=coalesce(excluded.first_seq, entities.first_seq)"
)
ADD_COUNTS = (
    "INSERT INTO census_counts (etype, what, shard, n) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (etype, what, shard) DO UPDATE SET n = census_counts.n + excluded.n"
)

# The dedupe window: forget applied ids (seq <= ?5) that are too many messages ago
# (seq <= ?3), and applied ids too old (accepted before ?4) that come before the first id
# still kept in seq order: the index on (etype, key, seq) reads just those rows. An old
# id after a younger one (clocks of two senders) is forgotten on a later sweep: kept a
# little longer, never forgotten early. `_pg_txn._TRIM` sweeps the same way.
# The bound is one `seq <` expression: written as `seq <= ?5 AND seq < ...`, SQLite's
# range scan ended at ?5 and tested the other bound row by row, reading every applied id
# of the window even when it forgot none (6.8 ms a snapshot at 80,000 ids).
SWEEP_DEDUPE = (
    "DELETE FROM dedupe WHERE etype=?1 AND key=?2 AND seq < min(?5 + 1, max(?3 + 1, "
    "coalesce((SELECT seq FROM dedupe WHERE etype=?1 AND key=?2 "
    "AND (accepted_at >= ?4 OR seq > ?5) ORDER BY seq LIMIT 1), ?5 + 1)))"
)


@dataclass(slots=True)
class SqliteTxn(Txn):
    """One `BEGIN IMMEDIATE` transaction on the writer's `sqlite3` connection."""

    GREATEST: ClassVar[str] = "max"
    ROW_CURSOR: ClassVar[bool] = False
    PAGE_RANGE: ClassVar[bool] = False
    RUNNING_INDEX: ClassVar[str] = " INDEXED BY entities_running"

    CARRY_JOURNAL: ClassVar[str] = (
        "INSERT INTO journal (etype, key, seq, run_id, shard, kind, name, message_id, "
        "payload, sender, accepted_at, trace) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (etype, key, seq) DO UPDATE SET run_id=excluded.run_id"
    )

    db: sqlite3.Connection = field(kw_only=True)

    async def execute(self, sql: str, *args: Any) -> int:
        return self.db.execute(sql, args).rowcount

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.db.executemany(sql, rows)

    async def fetchone(self, sql: str, *args: Any) -> Sequence[Any] | None:
        row: Sequence[Any] | None = self.db.execute(sql, args).fetchone()
        return row

    async def fetchall(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        return self.db.execute(sql, args).fetchall()

    async def add_counts(self, rows: Sequence[tuple[str, str, int, int]]) -> None:
        self.db.executemany(ADD_COUNTS, rows)

    async def insert_id(self, sql: str, *args: Any) -> int:
        cur = self.db.execute(sql, args)
        assert cur.lastrowid is not None
        return cur.lastrowid

    async def clock(self) -> float:
        return time.time()

    def joined(self, expr: str, separator: str, *, order: str) -> str:
        return f"group_concat({expr}, {separator})"

    def in_pairs(self, first: str, second: str, pairs: Sequence[tuple[int, int]]
                 ) -> tuple[str, tuple[Any, ...]]:
        # One JSON text however many pairs: one cached statement (a row-value list of
        # `?` would be a new statement for every count).
        return (f"({first}, {second}) IN (SELECT json_extract(value, '$[0]'), "
                f"json_extract(value, '$[1]') FROM json_each(?))",
                (json.dumps([[int(a), int(b)] for a, b in pairs]),))

    def starts_with(self, column: str, prefix: str) -> tuple[str, tuple[Any, ...]]:
        return code_point_range(column, prefix)  # SQLite orders UTF-8 bytes

    async def trim(self, etype: str, key: str, *, keep: int, applied_seq: int,
                   forget_seq: int, forget_before: float, passivate: bool) -> int:
        db, ident = self.db, (etype, key)
        kept = db.execute("SELECT applied_seq FROM snapshots WHERE etype=? AND key=? "
                          "ORDER BY applied_seq DESC LIMIT ?", (*ident, keep)).fetchall()
        oldest = kept[-1][0]
        db.execute("DELETE FROM snapshots WHERE etype=? AND key=? AND applied_seq<?",
                   (*ident, oldest))
        db.execute("DELETE FROM journal WHERE etype=? AND key=? AND seq<=?", (*ident, oldest))
        db.execute(SWEEP_DEDUPE, (*ident, forget_seq, forget_before, applied_seq))
        if passivate:
            db.execute("UPDATE entities SET passivated_seq=? WHERE etype=? AND key=?",
                       (applied_seq, *ident))
        return int(oldest)

    async def flush(self) -> None:
        db = self.db
        if self.runs_rows:
            db.executemany(_RUNS_INSERT, self.runs_rows)
            self.runs_rows.clear()
        if self.appended:
            rows = [(e, shard, digest) for shard, e, digest in self.appended]
            db.executemany(_JOURNAL_INSERT, [
                (e.entity_type, e.key, e.seq, e.run_id, shard, e.kind._value_, e.name,
                 e.message_id, e.payload, e.sender, e.accepted_at, e.trace)
                for e, shard, _ in rows])
            db.executemany(_DEDUPE_INSERT, [
                (e.entity_type, e.key, e.message_id, e.seq, e.run_id, digest, e.sender,
                 e.accepted_at) for e, _, digest in rows])
            self.appended.clear()
        dirty = self.dirty_entities()
        if dirty:
            self.tally(dirty)
            now = time.time()
            db.executemany(_ENTITIES_UPSERT, [
                (e, k, r.shard, r.run_id, r.status._value_, r.next_seq, now, r.first_seq)
                for e, k, r in dirty])
            for _, _, r in dirty:
                r.dirty = False
