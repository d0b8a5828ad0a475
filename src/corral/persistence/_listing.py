"""SQLite reads for operators: entities page by page, and one entity's details.

The listing walks an index in key order: by (etype, key) (the primary key) with or
without a type, and by `entities_status` (status, etype, key) with a status, so a page
costs the same however many entities the store holds.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from corral._common import RunStatus

from ._records import EntityDetails, EntityRecord
from ._suspensions import SUSPENDED_COLUMN, suspension_of
from ._waits import WAIT_COLUMNS, wait_from_row

__all__ = ["ENTITY_COLUMNS", "after_within", "entity_details", "entity_from_row",
           "list_entities"]

ENTITY_COLUMNS = ("etype, key, shard, run_id, status, next_seq - 1, passivated_seq, updated_at, "
                  f"{SUSPENDED_COLUMN}")


def entity_from_row(r: Any) -> EntityRecord:
    return EntityRecord(r[0], r[1], r[2], r[3], RunStatus(r[4]), r[5], r[6], r[7], bool(r[8]))


def after_within(etype: str | None, after: tuple[str, str] | None
                 ) -> tuple[str, str] | bool | None:
    """Where a page of one type (`etype`) starts: `after`, None (from the type's first
    key), or False (nothing: the cursor is past the type). With one type the query
    compares keys only (`key > ?`), which both databases seek in the index directly."""
    if etype is None or after is None or after[0] == etype:
        return after
    return None if after[0] < etype else False


def list_entities(db: sqlite3.Connection, etype: str | None, status: RunStatus | None,
                  limit: int, after: tuple[str, str] | None) -> list[EntityRecord]:
    start = after_within(etype, after)
    if start is False:
        return []
    where: list[str] = []
    args: list[Any] = []
    if status is not None:
        where.append("status = ?")
        args.append(status.value)
    if etype is not None:
        where.append("etype = ?")
        args.append(etype)
    if isinstance(start, tuple) and etype is not None:
        where.append("key > ?")
        args.append(start[1])
    elif isinstance(start, tuple):
        where.append("(etype, key) > (?, ?)")
        args.extend(start)
    rows = db.execute(
        f"SELECT {ENTITY_COLUMNS} FROM entities {'WHERE ' if where else ''}"
        f"{' AND '.join(where)} ORDER BY etype, key LIMIT ?", (*args, limit)).fetchall()
    return [entity_from_row(r) for r in rows]


def entity_details(db: sqlite3.Connection, etype: str, key: str, run_id: int) -> EntityDetails:
    ident = (etype, key)
    snap = db.execute("SELECT applied_seq, created_at FROM snapshots WHERE etype=? AND key=? "
                      "AND run_id=? ORDER BY applied_seq DESC LIMIT 1",
                      (*ident, run_id)).fetchone()
    timers = db.execute("SELECT due_at FROM timers WHERE etype=? AND key=? ORDER BY due_at",
                        ident).fetchall()
    waits = db.execute(f"SELECT {WAIT_COLUMNS} FROM signal_waits WHERE etype=? AND key=? "
                       "AND run_id=? ORDER BY name", (*ident, run_id)).fetchall()
    dead = db.execute("SELECT count(*) FROM dead_letters WHERE etype=? AND key=?",
                      ident).fetchone()[0]
    return EntityDetails(None if snap is None else snap[0], None if snap is None else snap[1],
                         tuple(t[0] for t in timers), tuple(wait_from_row(w) for w in waits),
                         int(dead), suspension_of(db, etype, key))
