"""Suspended runs: the durable record of a run whose `run()` raised (or whose activation
could not be built), kept while the host retries it.

One row per entity (`suspensions`, schema 6 on SQLite, 4 on PostgreSQL): the run it
belongs to, the error text with its traceback, the failed attempts in a row, since
when, and when the host tries next. A row counts only while its run is the entity's
running run (a run closed or continued meanwhile leaves a stale row, which every read
ignores and the next suspension replaces). Both engines share the statements below,
written with `?`; PostgreSQL numbers them (`numbered`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._codec import storable_text
from ._records import Suspension
from ._rows import Row
from ._txn import Fence, Fenced, Txn

__all__ = ["CLEAR", "OF_ENTITY", "OF_SHARD", "SUSPEND", "SUSPENDED_COLUMN",
           "ClearSuspensionOp", "SuspendOp", "suspension_from_row"]

SUSPENSION_COLUMNS = "s.etype, s.key, s.run_id, s.error, s.attempts, s.since, s.next_at"

SUSPEND = (
    "INSERT INTO suspensions (etype, key, run_id, shard, error, attempts, since, next_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (etype, key) DO UPDATE SET "
    "run_id = excluded.run_id, shard = excluded.shard, error = excluded.error, "
    "attempts = excluded.attempts, since = excluded.since, next_at = excluded.next_at"
)
CLEAR = "DELETE FROM suspensions WHERE etype = ? AND key = ? AND run_id = ?"
OF_ENTITY = (
    f"SELECT {SUSPENSION_COLUMNS} FROM suspensions s JOIN entities e "
    "ON e.etype = s.etype AND e.key = s.key AND e.run_id = s.run_id "
    "WHERE s.etype = ? AND s.key = ? AND e.status = 'running'"
)
OF_SHARD = (
    f"SELECT {SUSPENSION_COLUMNS} FROM suspensions s JOIN entities e "
    "ON e.etype = s.etype AND e.key = s.key AND e.run_id = s.run_id "
    "WHERE s.shard = ? AND e.status = 'running'"
)

SUSPENDED_COLUMN = (
    "EXISTS (SELECT 1 FROM suspensions s WHERE s.etype = entities.etype AND "
    "s.key = entities.key AND s.run_id = entities.run_id AND entities.status = 'running')"
)
"""A listing column: whether the entity's running run is suspended."""


def suspension_from_row(r: Any) -> Suspension:
    row = Row("suspensions", r[0], r[1], r[2])
    return Suspension(r[0], r[1], row.integer("run_id", r[2]), r[3],
                      row.integer("attempts", r[4]), row.seconds("since", r[5]),
                      row.seconds("next_at", r[6]))


@dataclass(frozen=True, slots=True)
class SuspendOp(Fenced):
    """Record (or update) the suspension of a run (fenced)."""

    fence: Fence
    record: Suspension

    async def apply(self, txn: Txn) -> None:
        await txn.check(self.fence)
        r = self.record
        await txn.execute(SUSPEND, r.entity_type, r.key, r.run_id, self.fence.shard,
                          storable_text(r.error), r.attempts, r.since, r.next_attempt_at)


@dataclass(frozen=True, slots=True)
class ClearSuspensionOp(Fenced):
    """The run got past the point that suspended it: forget the suspension (fenced)."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int

    async def apply(self, txn: Txn) -> None:
        await txn.check(self.fence)
        await txn.execute(CLEAR, self.entity_type, self.key, self.run_id)
