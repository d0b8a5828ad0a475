"""Suspended runs: the durable record of a run whose `run()` raised (or whose activation
could not be built), kept while the host retries it.

One row per entity (`suspensions`, schema 6 on SQLite, 4 on PostgreSQL): the run it
belongs to, the error text with its traceback, the failed attempts in a row, since
when, and when the host tries next. A row counts only while its run is the entity's
running run: it is recorded only for that run (under the entity row's lock), and the
run's end (close, terminate, continue-as-new) deletes it (`end_suspension`), so the
census counts suspended runs as their rows come and go (`_census`). A stale row an
older corral left (it kept a run's row past its end) is ignored by every read and
replaced by the next suspension. Both engines share the statements below, written with
`?`; PostgreSQL numbers them (`numbered`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from corral._common import RunStatus

from ._codec import storable_text
from ._records import Suspension
from ._rows import Row
from ._txn import SUSPENDED_RUNS, Fence, Fenced, LockPlan, Txn

__all__ = ["CLEAR", "OF_ENTITY", "OF_SHARD", "SUSPEND", "SUSPENDED_COLUMN",
           "ClearSuspensionOp", "SuspendOp", "end_suspension", "suspension_from_row"]

SUSPENSION_COLUMNS = "s.etype, s.key, s.run_id, s.error, s.attempts, s.since, s.next_at"

SUSPEND = (
    "INSERT INTO suspensions (etype, key, run_id, shard, error, attempts, since, next_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (etype, key) DO UPDATE SET "
    "run_id = excluded.run_id, shard = excluded.shard, error = excluded.error, "
    "attempts = excluded.attempts, since = excluded.since, next_at = excluded.next_at"
)
_RETRIED = (
    "UPDATE suspensions SET error = ?, attempts = ?, since = ?, next_at = ? "
    "WHERE etype = ? AND key = ? AND run_id = ?"
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


async def _running(txn: Txn, etype: str, key: str, run_id: int) -> int | None:
    """The entity's shard if `run_id` is its running run, else None."""
    row = await txn.entity(etype, key)
    if row is None or row.run_id != run_id or row.status is not RunStatus.RUNNING:
        return None
    return row.shard


async def end_suspension(txn: Txn, etype: str, key: str, run_id: int) -> None:
    """Run `run_id`, running until now, ended: its suspension (if any) goes with it."""
    if gone := await txn.execute(CLEAR, etype, key, run_id):
        txn.add_count(etype, SUSPENDED_RUNS, await txn.shard_of(etype, key), -gone)


@dataclass(frozen=True, slots=True)
class SuspendOp(Fenced):
    """Record (or update) the suspension of a running run (fenced); nothing for a run
    that ended meanwhile (terminated by another process)."""

    fence: Fence
    record: Suspension

    def plan(self, plan: LockPlan) -> None:  # the entity row too, as `locks_entity`
        plan.leases.add(self.fence.shard)
        plan.entities.add((self.record.entity_type, self.record.key))

    async def apply(self, txn: Txn) -> None:
        await txn.check(self.fence)
        r = self.record
        shard = await _running(txn, r.entity_type, r.key, r.run_id)
        if shard is None:
            return
        error = storable_text(r.error)
        if not await txn.execute(_RETRIED, error, r.attempts, r.since, r.next_attempt_at,
                                 r.entity_type, r.key, r.run_id):
            await txn.execute(SUSPEND, r.entity_type, r.key, r.run_id, self.fence.shard,
                              error, r.attempts, r.since, r.next_attempt_at)
            txn.add_count(r.entity_type, SUSPENDED_RUNS, shard, 1)


@dataclass(frozen=True, slots=True)
class ClearSuspensionOp(Fenced):
    """The run got past the point that suspended it: forget the suspension (fenced)."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    locks_entity: ClassVar[bool] = True

    async def apply(self, txn: Txn) -> None:
        await txn.check(self.fence)
        shard = await _running(txn, self.entity_type, self.key, self.run_id)
        gone = await txn.execute(CLEAR, self.entity_type, self.key, self.run_id)
        if shard is not None:
            txn.add_count(self.entity_type, SUSPENDED_RUNS, shard, -gone)
