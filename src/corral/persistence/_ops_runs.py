"""Writes a shard host makes for its entities' runs, all fenced and written once for
both engines: update outcomes, closing and continuing runs, snapshots, residency and
durable timers. Each checks its `Fence` (on PostgreSQL holding the lease row `FOR
SHARE` until commit) before it writes."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

from corral._common import RunStatus
from corral._errors import EntityNotRunningError

from ._codec import closing_texts
from ._ops_outbox import Send, write_sends
from ._ops_steps import forget_run_steps, forget_steps
from ._ops_waits import SET_TIMER, close_waits, end_run
from ._records import JournalEntry
from ._suspensions import end_suspension
from ._txn import Fence, Fenced, LockPlan, Txn
from ._unapplied import settle_run

__all__ = [
    "PUT_SNAPSHOT",
    "ActivatedOp",
    "CloseRunOp",
    "ContinueAsNewOp",
    "RecordUpdateOp",
    "SnapshotOp",
    "TimerOp",
]


PUT_SNAPSHOT = (
    "INSERT INTO snapshots (etype, key, run_id, applied_seq, state, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (etype, key, applied_seq) DO UPDATE "
    "SET run_id = excluded.run_id, state = excluded.state, "
    "created_at = excluded.created_at"
)


@dataclass(frozen=True, slots=True)
class RecordUpdateOp(Fenced):
    fence: Fence
    entity_type: str
    key: str
    message_id: str
    outcome: str

    async def apply(self, txn: Txn) -> None:
        await txn.check(self.fence)
        await txn.execute(
            "UPDATE dedupe SET outcome = ? WHERE etype = ? AND key = ? AND message_id = ?",
            self.outcome, self.entity_type, self.key, self.message_id)


@dataclass(frozen=True, slots=True)
class CloseRunOp(Fenced):
    """Close a run, but only if every message accepted so far was applied.

    Returns False when newer messages exist: the host applies them and tries again, so
    a message accepted before the close is never left unapplied. With `force` (a run
    whose activation cannot be built, closed as failed) it closes regardless: its
    messages after `applied_seq`, and the `pending` mailbox entries `run()` never took,
    become dead letters of the run in the same transaction (`_unapplied.settle_run`).

    `state`: the entity's state as of the close (a snapshot envelope), written as the
    run's only snapshot at `applied_seq` in the same transaction, so that queries and
    operators read what the run left, not a replay of its messages without `run()`'s
    changes (guarantee 16); None (state that did not encode, an activation that could
    not be built) keeps the run's latest snapshot. The watermark is recorded as the
    entity's progress with it (`settle_run`).
    """

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
    sends: tuple[Send, ...] = ()
    state: bytes | None = None
    locks_entity: ClassVar[bool] = True

    async def apply(self, txn: Txn) -> bool:
        await txn.check(self.fence)
        row = await txn.entity(self.entity_type, self.key)
        if row is None or row.run_id != self.run_id or row.status is not RunStatus.RUNNING:
            return True  # already closed (terminated, or a retry of this close)
        if row.next_seq - 1 > self.applied_seq and not self.force:
            return False
        row.status = self.status
        txn.put_entity(self.entity_type, self.key, row)
        await write_sends(txn, self.fence.shard, self.entity_type, self.key, self.run_id,
                          self.sends)
        now = time.time()
        await end_run(txn, self.entity_type, self.key, self.run_id, self.status.value,
                      *closing_texts(self.result, self.error), now)
        if self.state is not None:
            await self._keep_final_state(txn, self.state, now)
        await settle_run(txn, self.entity_type, self.key, self.run_id, self.applied_seq,
                         self.pending, now)
        return True

    async def _keep_final_state(self, txn: Txn, state: bytes, now: float) -> None:
        """The run's state as of the close becomes its one snapshot (older ones of the
        run restore a state it left behind; its journal stays, for its history)."""
        ident = (self.entity_type, self.key)
        await txn.execute("DELETE FROM snapshots WHERE etype = ? AND key = ? AND run_id = ? "
                          "AND applied_seq <> ?", *ident, self.run_id, self.applied_seq)
        await txn.execute(PUT_SNAPSHOT, *ident, self.run_id, self.applied_seq, state, now)


@dataclass(frozen=True, slots=True)
class SnapshotOp(Fenced):
    """Store a snapshot covering `applied_seq`, keep the newest `keep`, truncate the
    journal and the dedupe window, optionally mark passivation, and delete the records
    of the steps a checkpoint covers (`forget_steps`, see `_ops_steps`).

    One transaction: the snapshot and the watermark it covers land together, and journal
    entries are deleted only once the oldest kept snapshot covers them.
    """

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
    forget_steps: tuple[str, ...] = ()
    sends: tuple[Send, ...] = ()

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)
        if self.passivate:
            plan.entities.add((self.entity_type, self.key))

    async def apply(self, txn: Txn) -> int:
        """Returns the journal floor: entries up to it are covered and deleted."""
        await txn.check(self.fence)
        await txn.execute(PUT_SNAPSHOT, self.entity_type, self.key, self.run_id,
                          self.applied_seq, self.state, time.time())
        floor = await txn.trim(self.entity_type, self.key, keep=self.keep,
                               applied_seq=self.applied_seq, forget_seq=self.forget_seq,
                               forget_before=self.forget_before, passivate=self.passivate)
        txn.forget_window(self.entity_type, self.key)
        if self.forget_steps:
            await forget_steps(txn, self.entity_type, self.key, self.run_id, self.forget_steps)
        await write_sends(txn, self.fence.shard, self.entity_type, self.key, self.run_id,
                          self.sends)
        return floor


@dataclass(frozen=True, slots=True)
class ContinueAsNewOp(Fenced):
    """Close run N as `continued` and open run N+1, carrying unconsumed messages.

    Carried: every entry after `applied_seq` (accepted, not yet applied) and the
    entries behind mailbox payloads `run()` has not taken (`carried`, re-inserted if a
    snapshot already truncated them). Everything else of run N leaves the journal.
    """

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    applied_seq: int
    next_input: str
    carried: tuple[JournalEntry, ...]
    sends: tuple[Send, ...] = ()
    locks_entity: ClassVar[bool] = True

    async def apply(self, txn: Txn) -> int:
        await txn.check(self.fence)
        ident = (self.entity_type, self.key)
        row = await txn.entity(*ident)
        if row is None or row.run_id != self.run_id or row.status is not RunStatus.RUNNING:
            raise EntityNotRunningError(
                f"{self.entity_type} {self.key!r}: run {self.run_id} is no longer running",
                entity_type=self.entity_type, key=self.key, run_id=self.run_id,
            )
        new, now = self.run_id + 1, time.time()
        await write_sends(txn, self.fence.shard, *ident, self.run_id, self.sends)
        await txn.execute("UPDATE runs SET status = 'continued', closed_at = ? "
                          "WHERE etype = ? AND key = ? AND run_id = ?", now, *ident, self.run_id)
        await txn.executemany(txn.CARRY_JOURNAL, [
            (*ident, e.seq, new, self.fence.shard, e.kind.value, e.name, e.message_id,
             e.payload, e.sender, e.accepted_at, e.trace) for e in self.carried])
        await txn.execute("UPDATE journal SET run_id = ? WHERE etype = ? AND key = ? "
                          "AND run_id = ? AND seq > ?", new, *ident, self.run_id,
                          self.applied_seq)
        await txn.execute("DELETE FROM journal WHERE etype = ? AND key = ? AND run_id = ?",
                          *ident, self.run_id)
        for statement in ("DELETE FROM snapshots WHERE etype = ? AND key = ?",
                          "DELETE FROM timers WHERE etype = ? AND key = ?",
                          "UPDATE entities SET passivated_seq = NULL "
                          "WHERE etype = ? AND key = ?"):
            await txn.execute(statement, *ident)
        await close_waits(txn, *ident, self.run_id, carry_to=new)
        await end_suspension(txn, *ident, self.run_id)
        await forget_run_steps(txn, *ident, self.run_id)
        first = self.applied_seq + 1  # carried entries do not count as this run's intake
        await txn.execute(
            "INSERT INTO runs (etype, key, run_id, status, start_input, started_at, "
            "continued_from, first_seq) VALUES (?, ?, ?, 'running', ?, ?, ?, ?)",
            *ident, new, self.next_input, now, self.run_id, first)
        row.run_id, row.first_seq = new, first
        txn.put_entity(*ident, row)
        return new


@dataclass(frozen=True, slots=True)
class ActivatedOp(Fenced):
    """An entity came back into memory: it is resident again.

    Its timers stay (operators see the pending deadline while the restored `run()`
    has not reached its wait again): returns their ids, which the activation replaces
    when `run()` waits again (`TimerOp.replacing`).
    """

    fence: Fence
    entity_type: str
    key: str
    locks_entity: ClassVar[bool] = True

    async def apply(self, txn: Txn) -> list[str]:
        await txn.check(self.fence)
        await txn.execute("UPDATE entities SET passivated_seq = NULL WHERE etype = ? "
                          "AND key = ? AND passivated_seq IS NOT NULL",
                          self.entity_type, self.key)
        rows = await txn.fetchall("SELECT timer_id FROM timers WHERE etype = ? AND key = ?",
                                  self.entity_type, self.key)
        return [str(r[0]) for r in rows]


@dataclass(frozen=True, slots=True)
class TimerOp(Fenced):
    """Set (`due_at` given) or clear (`due_at` None) one durable timer, and clear the
    timers it `replaces` (those an earlier activation left, in the same transaction:
    the entity's pending deadline is in the store at every moment)."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    timer_id: str
    due_at: float | None
    replacing: tuple[str, ...] = ()

    async def apply(self, txn: Txn) -> None:
        await txn.check(self.fence)
        ident = (self.entity_type, self.key)
        if self.due_at is not None:
            await txn.execute(SET_TIMER, *ident, self.run_id, self.timer_id,
                              self.fence.shard, self.due_at)
        gone = [t for t in self.replacing if t != self.timer_id]
        if self.due_at is None:
            gone.append(self.timer_id)
        if gone:
            await txn.executemany("DELETE FROM timers WHERE etype = ? AND key = ? "
                                  "AND timer_id = ?", [(*ident, t) for t in gone])
