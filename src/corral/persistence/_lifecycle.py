"""Writes a shard host makes for its entities (all fenced): update outcomes, closing
and continuing runs, snapshots, residency and durable timers."""

from __future__ import annotations

import time
from dataclasses import dataclass

from corral._common import RunStatus
from corral._errors import EntityNotRunningError

from ._codec import closing_texts
from ._records import JournalEntry
from ._txn import Fence, Txn
from ._unapplied import settle_run
from ._wait_ops import close_waits

__all__ = [
    "ActivatedOp",
    "CloseRunOp",
    "ContinueAsNewOp",
    "RecordUpdateOp",
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

    def apply(self, txn: Txn) -> None:
        txn.check(self.fence)
        txn.db.execute(
            "UPDATE dedupe SET outcome=? WHERE etype=? AND key=? AND message_id=?",
            (self.outcome, self.entity_type, self.key, self.message_id),
        )


@dataclass(frozen=True, slots=True)
class CloseRunOp:
    """Close a run, but only if every message accepted so far was applied.

    Returns False when newer messages exist: the host applies them and tries again, so
    a message accepted before the close is never left unapplied. With `force` (a run
    whose activation cannot be built, closed as failed) it closes regardless: its
    messages after `applied_seq`, and the `pending` mailbox entries `run()` never took,
    become dead letters of the run in the same transaction (`_unapplied.settle_run`).
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

    def apply(self, txn: Txn) -> bool:
        txn.check(self.fence)
        row = txn.entity(self.entity_type, self.key)
        if row is None or row.run_id != self.run_id or row.status is not RunStatus.RUNNING:
            return True  # already closed (terminated, or a retry of this close)
        if row.next_seq - 1 > self.applied_seq and not self.force:
            return False
        row.status = self.status
        txn.put_entity(self.entity_type, self.key, row)
        txn.db.execute("DELETE FROM timers WHERE etype=? AND key=?", (self.entity_type, self.key))
        close_waits(txn.db, self.entity_type, self.key, self.run_id)
        txn.db.execute(
            "UPDATE runs SET status=?, result=?, error=?, closed_at=? "
            "WHERE etype=? AND key=? AND run_id=?",
            (self.status.value, *closing_texts(self.result, self.error), time.time(),
             self.entity_type, self.key, self.run_id),
        )
        settle_run(txn.db, self.entity_type, self.key, self.run_id, self.applied_seq,
                   self.pending, time.time())
        return True


# The dedupe window: forget applied ids (seq <= ?5) that are too many messages ago
# (seq <= ?3), and applied ids too old (accepted before ?4) that come before the first id
# still kept in seq order: the index on (etype, key, seq) reads just those rows. An old
# id after a younger one (clocks of two senders) is forgotten on a later sweep: kept a
# little longer, never forgotten early. `_pg_lifecycle._TRIM` sweeps the same way.
# The bound is one `seq <` expression: written as `seq <= ?5 AND seq < ...`, SQLite's
# range scan ended at ?5 and tested the other bound row by row, reading every applied id
# of the window even when it forgot none (6.8 ms a snapshot at 80,000 ids).
SWEEP_DEDUPE = (
    "DELETE FROM dedupe WHERE etype=?1 AND key=?2 AND seq < min(?5 + 1, max(?3 + 1, "
    "coalesce((SELECT seq FROM dedupe WHERE etype=?1 AND key=?2 "
    "AND (accepted_at >= ?4 OR seq > ?5) ORDER BY seq LIMIT 1), ?5 + 1)))"
)


@dataclass(frozen=True, slots=True)
class SnapshotOp:
    """Store a snapshot covering `applied_seq`, keep the newest `keep`, truncate the journal.

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

    def apply(self, txn: Txn) -> int:
        """Returns the journal floor: entries up to it are covered and deleted."""
        txn.check(self.fence)
        db, ident = txn.db, (self.entity_type, self.key)
        db.execute(
            "INSERT INTO snapshots (etype, key, run_id, applied_seq, state, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (etype, key, applied_seq) DO UPDATE SET "
            "run_id=excluded.run_id, state=excluded.state, created_at=excluded.created_at",
            (*ident, self.run_id, self.applied_seq, self.state, time.time()),
        )
        kept = db.execute(
            "SELECT applied_seq FROM snapshots WHERE etype=? AND key=? "
            "ORDER BY applied_seq DESC LIMIT ?", (*ident, self.keep),
        ).fetchall()
        oldest = kept[-1][0]
        db.execute("DELETE FROM snapshots WHERE etype=? AND key=? AND applied_seq<?",
                   (*ident, oldest))
        db.execute("DELETE FROM journal WHERE etype=? AND key=? AND seq<=?", (*ident, oldest))
        db.execute(SWEEP_DEDUPE, (*ident, self.forget_seq, self.forget_before,
                                  self.applied_seq))
        if self.passivate:
            db.execute("UPDATE entities SET passivated_seq=? WHERE etype=? AND key=?",
                       (self.applied_seq, *ident))
        return int(oldest)


@dataclass(frozen=True, slots=True)
class ContinueAsNewOp:
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

    def apply(self, txn: Txn) -> int:
        txn.check(self.fence)
        db, ident = txn.db, (self.entity_type, self.key)
        row = txn.entity(*ident)
        if row is None or row.run_id != self.run_id or row.status is not RunStatus.RUNNING:
            raise EntityNotRunningError(
                f"{self.entity_type} {self.key!r}: run {self.run_id} is no longer running",
                entity_type=self.entity_type, key=self.key, run_id=self.run_id,
            )
        new, now = self.run_id + 1, time.time()
        db.execute("UPDATE runs SET status='continued', closed_at=? "
                   "WHERE etype=? AND key=? AND run_id=?", (now, *ident, self.run_id))
        db.executemany(
            "INSERT INTO journal (etype, key, seq, run_id, shard, kind, name, message_id, "
            "payload, sender, accepted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (etype, key, seq) DO UPDATE SET run_id=excluded.run_id",
            [(*ident, e.seq, new, self.fence.shard, e.kind.value, e.name, e.message_id,
              e.payload, e.sender, e.accepted_at) for e in self.carried],
        )
        db.execute("UPDATE journal SET run_id=? WHERE etype=? AND key=? AND run_id=? AND seq>?",
                   (new, *ident, self.run_id, self.applied_seq))
        db.execute("DELETE FROM journal WHERE etype=? AND key=? AND run_id=?",
                   (*ident, self.run_id))
        db.execute("DELETE FROM snapshots WHERE etype=? AND key=?", ident)
        db.execute("DELETE FROM timers WHERE etype=? AND key=?", ident)
        close_waits(db, *ident, self.run_id, carry_to=new)
        db.execute("UPDATE entities SET passivated_seq=NULL WHERE etype=? AND key=?", ident)
        first = self.applied_seq + 1  # carried entries do not count as this run's intake
        db.execute(
            "INSERT INTO runs (etype, key, run_id, status, start_input, started_at, "
            "continued_from, first_seq) VALUES (?, ?, ?, 'running', ?, ?, ?, ?)",
            (*ident, new, self.next_input, now, self.run_id, first),
        )
        row.run_id = new
        txn.put_entity(*ident, row)
        return new


@dataclass(frozen=True, slots=True)
class ActivatedOp:
    """An entity came back into memory: it is resident again and its old timers served."""

    fence: Fence
    entity_type: str
    key: str

    def apply(self, txn: Txn) -> None:
        txn.check(self.fence)
        ident = (self.entity_type, self.key)
        txn.db.execute("UPDATE entities SET passivated_seq=NULL WHERE etype=? AND key=? "
                       "AND passivated_seq IS NOT NULL", ident)
        txn.db.execute("DELETE FROM timers WHERE etype=? AND key=?", ident)


@dataclass(frozen=True, slots=True)
class TimerOp:
    """Set (`due_at` given) or clear (`due_at` None) one durable timer."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    timer_id: str
    due_at: float | None

    def apply(self, txn: Txn) -> None:
        txn.check(self.fence)
        if self.due_at is None:
            txn.db.execute("DELETE FROM timers WHERE etype=? AND key=? AND timer_id=?",
                           (self.entity_type, self.key, self.timer_id))
        else:
            txn.db.execute(
                "INSERT OR REPLACE INTO timers (etype, key, run_id, timer_id, shard, due_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (self.entity_type, self.key, self.run_id, self.timer_id, self.fence.shard,
                 self.due_at),
            )
