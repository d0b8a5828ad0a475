"""PostgreSQL writes a shard host makes for its entities, all fenced: update outcomes,
closing and continuing runs, snapshots, residency, durable timers and dead letters.
Each mirrors its SQLite twin in `_lifecycle` / `_dead_letters` exactly; every one checks
its `Fence` (holding the lease row `FOR SHARE` until commit) before it writes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from corral._common import RunStatus
from corral._errors import EntityNotRunningError

from ._codec import closing_texts, storable_text
from ._dead_letters import DEAD_LETTER_COLUMNS
from ._pg_txn import LockPlan, PgTxn
from ._pg_waits import close_waits
from ._records import JournalEntry
from ._txn import Fence
from ._unapplied import MESSAGE_KINDS, unapplied_letters

__all__ = [
    "ActivatedOp",
    "CloseRunOp",
    "ContinueAsNewOp",
    "RecordDeadLetterOp",
    "RecordUpdateOp",
    "SettleRunOp",
    "SnapshotOp",
    "TimerOp",
]


@dataclass(frozen=True, slots=True)
class RecordUpdateOp:
    fence: Fence
    entity_type: str
    key: str
    message_id: str
    outcome: str
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)

    async def apply(self, txn: PgTxn) -> None:
        await txn.check(self.fence)
        await txn.conn.execute(
            "UPDATE dedupe SET outcome = $1 WHERE etype = $2 AND key = $3 AND message_id = $4",
            self.outcome, self.entity_type, self.key, self.message_id)


@dataclass(frozen=True, slots=True)
class CloseRunOp:
    """Close a run unless messages after `applied_seq` exist (then False); `force` closes
    it regardless (see `_lifecycle.CloseRunOp`)."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    applied_seq: int
    status: RunStatus
    result: str | None
    error: str | None
    force: bool = False
    pending: tuple[JournalEntry, ...] = ()
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)
        plan.entities.add((self.entity_type, self.key))

    async def apply(self, txn: PgTxn) -> bool:
        await txn.check(self.fence)
        row = await txn.entity(self.entity_type, self.key)
        if row is None or row.run_id != self.run_id or row.status is not RunStatus.RUNNING:
            return True  # already closed (terminated, or a retry of this close)
        if row.next_seq - 1 > self.applied_seq and not self.force:
            return False
        row.status = self.status
        txn.put_entity(self.entity_type, self.key, row)
        await txn.conn.execute("DELETE FROM timers WHERE etype = $1 AND key = $2",
                               self.entity_type, self.key)
        await close_waits(txn.conn, self.entity_type, self.key, self.run_id)
        await txn.conn.execute(
            "UPDATE runs SET status = $1, result = $2, error = $3, closed_at = $4 "
            "WHERE etype = $5 AND key = $6 AND run_id = $7",
            self.status.value, *closing_texts(self.result, self.error), time.time(),
            self.entity_type, self.key, self.run_id)
        await settle_run(txn.conn, self.entity_type, self.key, self.run_id, self.applied_seq,
                         self.pending, time.time())
        return True


# After the snapshot row is written: keep the newest `keep`, delete the journal they
# cover and the dedupe ids that left the window, mark passivation; returns the floor.
# The dedupe sweep is SQLite's (`_lifecycle.SWEEP_DEDUPE`): applied ids ($4) past the
# count bound ($5), and too old ones ($6) before the first id kept in seq order, read
# through the partial index `dedupe_sweep` (its predicate `seq > 0` is in both WHEREs).
# The delete's bounds are row comparisons, (etype, key, seq) between ($1, $2, 0) and
# ($1, $2, bound): exactly this entity's ids below the bound, and a condition only an
# index on (etype, key, seq) can serve. With `etype = $1 AND key = $2` the planner,
# on a table not analyzed yet, scanned the primary key and filtered every id by seq.
_TRIM = """
WITH kept AS (
    SELECT applied_seq FROM snapshots WHERE etype = $1 AND key = $2
    ORDER BY applied_seq DESC LIMIT $3
), floor AS (SELECT min(applied_seq) AS seq FROM kept),
s AS (DELETE FROM snapshots WHERE etype = $1 AND key = $2
      AND applied_seq < (SELECT seq FROM floor)),
j AS (DELETE FROM journal WHERE etype = $1 AND key = $2 AND seq <= (SELECT seq FROM floor)),
d AS (DELETE FROM dedupe WHERE (etype, key, seq) > ($1, $2, 0) AND seq > 0
      AND (etype, key, seq) < ($1, $2, LEAST($4 + 1, GREATEST($5 + 1, COALESCE(
          (SELECT seq FROM dedupe WHERE etype = $1 AND key = $2 AND seq > 0
           AND (accepted_at >= $6 OR seq > $4) ORDER BY seq LIMIT 1), $4 + 1))))),
p AS (UPDATE entities SET passivated_seq = $4 WHERE $7 AND etype = $1 AND key = $2)
SELECT seq FROM floor
"""


@dataclass(frozen=True, slots=True)
class SnapshotOp:
    """Store a snapshot covering `applied_seq`, keep the newest `keep`, truncate the
    journal and the dedupe window, optionally mark passivation: one transaction."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    applied_seq: int
    state: bytes
    keep: int
    passivate: bool = False
    forget_seq: int = 0
    forget_before: float = 0.0
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)
        if self.passivate:
            plan.entities.add((self.entity_type, self.key))

    async def apply(self, txn: PgTxn) -> int:
        """Returns the journal floor: entries up to it are covered and deleted."""
        await txn.check(self.fence)
        ident = (self.entity_type, self.key)
        await txn.conn.execute(
            "INSERT INTO snapshots (etype, key, run_id, applied_seq, state, created_at) "
            "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (etype, key, applied_seq) DO UPDATE "
            "SET run_id = excluded.run_id, state = excluded.state, "
            "created_at = excluded.created_at",
            *ident, self.run_id, self.applied_seq, self.state, time.time())
        floor = await txn.conn.fetchval(
            _TRIM, *ident, self.keep, self.applied_seq, self.forget_seq, self.forget_before,
            self.passivate)
        txn.forget_window(*ident)
        return int(floor)


@dataclass(frozen=True, slots=True)
class ContinueAsNewOp:
    """Close run N as `continued` and open run N+1, carrying unconsumed messages (see
    `_lifecycle.ContinueAsNewOp`). Re-inserted carried entries get tick 0: they are not
    new acceptances, and the host that carries them holds them already."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    applied_seq: int
    next_input: str
    carried: tuple[JournalEntry, ...]
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)
        plan.entities.add((self.entity_type, self.key))

    async def apply(self, txn: PgTxn) -> int:
        await txn.check(self.fence)
        conn, ident = txn.conn, (self.entity_type, self.key)
        row = await txn.entity(*ident)
        if row is None or row.run_id != self.run_id or row.status is not RunStatus.RUNNING:
            raise EntityNotRunningError(
                f"{self.entity_type} {self.key!r}: run {self.run_id} is no longer running",
                entity_type=self.entity_type, key=self.key, run_id=self.run_id,
            )
        new, now = self.run_id + 1, time.time()
        await conn.execute("UPDATE runs SET status = 'continued', closed_at = $1 "
                           "WHERE etype = $2 AND key = $3 AND run_id = $4",
                           now, *ident, self.run_id)
        await self._carry(txn, new)
        for statement in ("DELETE FROM snapshots WHERE etype = $1 AND key = $2",
                          "DELETE FROM timers WHERE etype = $1 AND key = $2",
                          "UPDATE entities SET passivated_seq = NULL "
                          "WHERE etype = $1 AND key = $2"):
            await conn.execute(statement, *ident)
        await close_waits(conn, *ident, self.run_id, carry_to=new)
        first = self.applied_seq + 1  # carried entries do not count as this run's intake
        await conn.execute(
            "INSERT INTO runs (etype, key, run_id, status, start_input, started_at, "
            "continued_from, first_seq) VALUES ($1, $2, $3, 'running', $4, $5, $6, $7)",
            *ident, new, self.next_input, now, self.run_id, first)
        row.run_id = new
        txn.put_entity(*ident, row)
        return new

    async def _carry(self, txn: PgTxn, new: int) -> None:
        conn, ident = txn.conn, (self.entity_type, self.key)
        if self.carried:
            await conn.executemany(
                "INSERT INTO journal (etype, key, seq, run_id, shard, tick, kind, name, "
                "message_id, payload, sender, accepted_at) VALUES ($1, $2, $3, $4, $5, 0, "
                "$6, $7, $8, $9, $10, $11) ON CONFLICT (etype, key, seq) "
                "DO UPDATE SET run_id = excluded.run_id",
                [(*ident, e.seq, new, self.fence.shard, e.kind.value, e.name, e.message_id,
                  e.payload, e.sender, e.accepted_at) for e in self.carried])
        await conn.execute("UPDATE journal SET run_id = $1 WHERE etype = $2 AND key = $3 "
                           "AND run_id = $4 AND seq > $5",
                           new, *ident, self.run_id, self.applied_seq)
        await conn.execute("DELETE FROM journal WHERE etype = $1 AND key = $2 AND run_id = $3",
                           *ident, self.run_id)


@dataclass(frozen=True, slots=True)
class ActivatedOp:
    """An entity came back into memory: it is resident again and its old timers served."""

    fence: Fence
    entity_type: str
    key: str
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)
        plan.entities.add((self.entity_type, self.key))

    async def apply(self, txn: PgTxn) -> None:
        await txn.check(self.fence)
        await txn.conn.execute("UPDATE entities SET passivated_seq = NULL WHERE etype = $1 "
                               "AND key = $2 AND passivated_seq IS NOT NULL",
                               self.entity_type, self.key)
        await txn.conn.execute("DELETE FROM timers WHERE etype = $1 AND key = $2",
                               self.entity_type, self.key)


@dataclass(frozen=True, slots=True)
class TimerOp:
    """Set (`due_at` given) or clear (`due_at` None) one durable timer."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    timer_id: str
    due_at: float | None
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)

    async def apply(self, txn: PgTxn) -> None:
        await txn.check(self.fence)
        if self.due_at is None:
            await txn.conn.execute(
                "DELETE FROM timers WHERE etype = $1 AND key = $2 AND timer_id = $3",
                self.entity_type, self.key, self.timer_id)
            return
        await txn.conn.execute(
            "INSERT INTO timers (etype, key, run_id, timer_id, shard, due_at) "
            "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (etype, key, timer_id) DO UPDATE "
            "SET run_id = excluded.run_id, shard = excluded.shard, due_at = excluded.due_at",
            self.entity_type, self.key, self.run_id, self.timer_id, self.fence.shard,
            self.due_at)


async def settle_run(conn: Any, etype: str, key: str, run_id: int, applied_seq: int | None,
                     pending: Sequence[JournalEntry], failed_at: float) -> int:
    """`_unapplied.settle_run` in PostgreSQL's statements (same decision, same reasons)."""
    row = await conn.fetchrow("SELECT status, first_seq FROM runs WHERE etype = $1 AND "
                              "key = $2 AND run_id = $3", etype, key, run_id)
    if row is None or row["status"] == RunStatus.RUNNING.value:
        return 0
    status = RunStatus(row["status"])
    if applied_seq is None and status is not RunStatus.TERMINATED:
        return 0  # other closes are the host's, which settled them with its watermark
    if applied_seq is None:
        snap = await conn.fetchval("SELECT max(applied_seq) FROM snapshots WHERE etype = $1 "
                                   "AND key = $2 AND run_id = $3", etype, key, run_id)
        applied_seq = int(snap) if snap is not None else int(row["first_seq"]) - 1
    rows = await conn.fetch(
        "SELECT seq, message_id, name, payload, sender FROM journal WHERE etype = $1 AND "
        "key = $2 AND run_id = $3 AND seq > $4 AND kind = ANY($5::text[]) ORDER BY seq",
        etype, key, run_id, applied_seq, list(MESSAGE_KINDS))
    added = 0
    for seq, mid, name, payload, sender, reason in unapplied_letters(
            run_id, status, [tuple(r) for r in rows], pending):
        if await conn.fetchval("SELECT 1 FROM dead_letters WHERE etype = $1 AND key = $2 AND "
                               "run_id = $3 AND seq = $4", etype, key, run_id, seq) is not None:
            continue
        await conn.execute(
            f"INSERT INTO dead_letters ({DEAD_LETTER_COLUMNS}) VALUES ($1, $2, $3, $4, $5, "
            "$6, $7, $8, $9, $10, $11, $12)", etype, key, run_id, seq, mid, name, payload,
            sender, storable_text(reason), "", 0, failed_at)
        added += 1
    return added


@dataclass(frozen=True, slots=True)
class SettleRunOp:
    """`settle_run` as a fenced write (see `_unapplied`)."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    applied_seq: int | None
    pending: tuple[JournalEntry, ...]
    failed_at: float
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)
        plan.entities.add((self.entity_type, self.key))

    async def apply(self, txn: PgTxn) -> int:
        await txn.check(self.fence)
        return await settle_run(txn.conn, self.entity_type, self.key, self.run_id,
                                self.applied_seq, self.pending, self.failed_at)


@dataclass(frozen=True, slots=True)
class RecordDeadLetterOp:
    """Move a signal whose handler kept raising to the dead letters (fenced; idempotent
    per run and seq: a second record returns the first row's id)."""

    fence: Fence
    entry: JournalEntry
    error: str
    traceback: str
    attempts: int
    failed_at: float
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)

    async def apply(self, txn: PgTxn) -> int:
        await txn.check(self.fence)
        e = self.entry
        found = await txn.conn.fetchval(
            "SELECT id FROM dead_letters WHERE etype = $1 AND key = $2 AND run_id = $3 "
            "AND seq = $4", e.entity_type, e.key, e.run_id, e.seq)
        if found is not None:
            return int(found)
        new_id = await txn.conn.fetchval(
            f"INSERT INTO dead_letters ({DEAD_LETTER_COLUMNS}) VALUES ($1, $2, $3, $4, $5, "
            "$6, $7, $8, $9, $10, $11, $12) RETURNING id",
            e.entity_type, e.key, e.run_id, e.seq, e.message_id, e.name, e.payload, e.sender,
            storable_text(self.error), storable_text(self.traceback), self.attempts,
            self.failed_at)
        return int(new_id)
