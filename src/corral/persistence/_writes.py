"""Write operations, each applied inside one group-commit transaction.

An op raises a `CorralError` *before* writing anything when it refuses (conflict,
closed run, lost lease), so the other ops of its batch still commit.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from corral.actors import (
    DeadLetterNotFoundError,
    EntityClosedError,
    EntityNotRunningError,
    IdempotencyConflictError,
    IdReusePolicy,
    LeaseLostError,
    RunStatus,
)

from ._codec import payload_hash
from ._records import Acceptance, AcceptResult, EntryKind, JournalEntry

__all__ = [
    "AcceptOp",
    "AcquireLeasesOp",
    "ActivatedOp",
    "CloseRunOp",
    "ContinueAsNewOp",
    "DiscardDeadLetterOp",
    "Fence",
    "RecordDeadLetterOp",
    "RecordUpdateOp",
    "ReleaseLeasesOp",
    "RenewLeasesOp",
    "ReplayDeadLetterOp",
    "SnapshotOp",
    "TimerOp",
    "Txn",
    "WriteOp",
    "replay_message_id",
]


@dataclass(slots=True)
class _EntityRow:
    shard: int
    run_id: int
    status: RunStatus
    next_seq: int
    dirty: bool = False


@dataclass(frozen=True, slots=True)
class Fence:
    """A host's claim to write for a shard: refused unless `epoch` is still current."""

    shard: int
    owner: str
    epoch: int


_JOURNAL_INSERT = (
    "INSERT INTO journal (etype, key, seq, run_id, shard, kind, name, message_id, payload, "
    "sender, accepted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_DEDUPE_INSERT = (
    "INSERT INTO dedupe (etype, key, message_id, seq, run_id, payload_hash, sender, "
    "accepted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


@dataclass(slots=True)
class Txn:
    """One open transaction.

    Caches entity rows so a batch updates each row once, and buffers accepted journal
    and dedupe rows for one `executemany` each (`flush`, before any other kind of op
    reads or changes them). `accepted` answers dedupe lookups for ids accepted earlier
    in this same batch.
    """

    db: sqlite3.Connection
    entities: dict[tuple[str, str], _EntityRow | None] = field(default_factory=dict)
    journal_rows: list[tuple[Any, ...]] = field(default_factory=list)
    dedupe_rows: list[tuple[Any, ...]] = field(default_factory=list)
    accepted: dict[tuple[str, str, str], tuple[Any, ...]] = field(default_factory=dict)

    def entity(self, etype: str, key: str) -> _EntityRow | None:
        ident = (etype, key)
        if ident not in self.entities:
            row = self.db.execute(
                "SELECT shard, run_id, status, next_seq FROM entities WHERE etype=? AND key=?",
                ident,
            ).fetchone()
            self.entities[ident] = (
                None if row is None else _EntityRow(row[0], row[1], RunStatus(row[2]), row[3])
            )
        return self.entities[ident]

    def put_entity(self, etype: str, key: str, row: _EntityRow) -> None:
        row.dirty = True
        self.entities[(etype, key)] = row

    def check(self, fence: Fence) -> None:
        row = self.db.execute(
            "SELECT owner, epoch FROM leases WHERE shard=?", (fence.shard,)
        ).fetchone()
        if row is None or (row[0], row[1]) != (fence.owner, fence.epoch):
            raise LeaseLostError(
                f"shard {fence.shard}: epoch {fence.epoch} of {fence.owner} is no longer current"
            )

    def flush(self) -> None:
        if self.journal_rows:
            self.db.executemany(_JOURNAL_INSERT, self.journal_rows)
            self.db.executemany(_DEDUPE_INSERT, self.dedupe_rows)
            self.journal_rows.clear()
            self.dedupe_rows.clear()
            self.accepted.clear()
        dirty = [(k[0], k[1], r) for k, r in self.entities.items() if r is not None and r.dirty]
        if dirty:
            self.db.executemany(
                "INSERT INTO entities (etype, key, shard, run_id, status, next_seq) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (etype, key) DO UPDATE SET "
                "run_id=excluded.run_id, status=excluded.status, next_seq=excluded.next_seq",
                [(e, k, r.shard, r.run_id, r.status.value, r.next_seq) for e, k, r in dirty],
            )
            for _, _, r in dirty:
                r.dirty = False


class WriteOp(Protocol):
    def apply(self, txn: Txn) -> Any: ...


@dataclass(frozen=True, slots=True)
class AcceptOp:
    acc: Acceptance
    buffered: ClassVar[bool] = True  # its journal/dedupe rows wait for Txn.flush

    def apply(self, txn: Txn) -> AcceptResult:
        a = self.acc
        db = txn.db
        ident = (a.entity_type, a.key, a.message_id)
        seen = txn.accepted.get(ident) or db.execute(
            "SELECT seq, run_id, payload_hash, sender, accepted_at FROM dedupe "
            "WHERE etype=? AND key=? AND message_id=?", ident,
        ).fetchone()
        if seen is not None:
            return self._duplicate(seen)
        row = txn.entity(a.entity_type, a.key)
        started = False
        if row is None or row.status is not RunStatus.RUNNING:
            if a.start is None:
                state = "was never started" if row is None else f"is {row.status.value}"
                raise EntityNotRunningError(
                    f"{a.entity_type} {a.key!r} {state}; use {a.kind.value}_with_start"
                    if a.kind is not EntryKind.TERMINATE
                    else f"{a.entity_type} {a.key!r} {state}; nothing to terminate"
                )
            if row is not None and not a.id_reuse.allows_after(row.status):
                raise EntityClosedError(
                    f"{a.entity_type} {a.key!r}: run {row.run_id} is {row.status.value} and "
                    f"the id reuse policy is {a.id_reuse.name}"
                )
            run_id = 1 if row is None else row.run_id + 1
            next_seq = 1 if row is None else row.next_seq
            db.execute(
                "INSERT INTO runs (etype, key, run_id, status, start_input, started_at, "
                "first_seq) VALUES (?, ?, ?, 'running', ?, ?, ?)",
                (a.entity_type, a.key, run_id, a.start, a.accepted_at, next_seq),
            )
            row = _EntityRow(a.shard, run_id, RunStatus.RUNNING, next_seq)
            started = True
        entry = JournalEntry(
            a.entity_type, a.key, row.next_seq, row.run_id, a.kind, a.name, a.message_id,
            a.payload, a.sender, a.accepted_at,
        )
        txn.journal_rows.append((
            a.entity_type, a.key, entry.seq, entry.run_id, a.shard, a.kind.value, a.name,
            a.message_id, a.payload, a.sender, a.accepted_at,
        ))
        txn.dedupe_rows.append((
            a.entity_type, a.key, a.message_id, entry.seq, entry.run_id, a.payload_hash,
            a.sender, a.accepted_at,
        ))
        txn.accepted[ident] = (entry.seq, entry.run_id, a.payload_hash, a.sender,
                               a.accepted_at)
        row.next_seq += 1
        if a.kind is EntryKind.TERMINATE:
            row.status = RunStatus.TERMINATED
            db.execute("DELETE FROM timers WHERE etype=? AND key=?", (a.entity_type, a.key))
            db.execute(
                "UPDATE runs SET status='terminated', error=?, closed_at=? "
                "WHERE etype=? AND key=? AND run_id=?",
                (a.payload, a.accepted_at, a.entity_type, a.key, row.run_id),
            )
        txn.put_entity(a.entity_type, a.key, row)
        return AcceptResult(duplicate=False, started=started, entry=entry)

    def _duplicate(self, seen: tuple[Any, ...]) -> AcceptResult:
        a = self.acc
        seq, run_id, stored_hash, sender, accepted_at = seen
        if bytes(stored_hash) != a.payload_hash:
            raise IdempotencyConflictError(
                f"message id {a.message_id!r} for {a.entity_type} {a.key!r} was accepted "
                "before with a different payload"
            )
        if sender != a.sender:
            raise IdempotencyConflictError(
                f"message id {a.message_id!r} for {a.entity_type} {a.key!r} was accepted "
                f"before from sender {sender!r}, not {a.sender!r}"
            )
        entry = JournalEntry(
            a.entity_type, a.key, seq, run_id, a.kind, a.name, a.message_id, a.payload,
            sender, accepted_at,
        )
        return AcceptResult(duplicate=True, started=False, entry=entry)


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
    a message accepted before the close is never left unapplied.
    """

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    applied_seq: int
    status: RunStatus
    result: str | None
    error: str | None

    def apply(self, txn: Txn) -> bool:
        txn.check(self.fence)
        row = txn.entity(self.entity_type, self.key)
        if row is None or row.run_id != self.run_id or row.status is not RunStatus.RUNNING:
            return True  # already closed (terminated, or a retry of this close)
        if row.next_seq - 1 > self.applied_seq:
            return False
        row.status = self.status
        txn.put_entity(self.entity_type, self.key, row)
        txn.db.execute("DELETE FROM timers WHERE etype=? AND key=?", (self.entity_type, self.key))
        txn.db.execute(
            "UPDATE runs SET status=?, result=?, error=?, closed_at=? "
            "WHERE etype=? AND key=? AND run_id=?",
            (self.status.value, self.result, self.error, time.time(), self.entity_type,
             self.key, self.run_id),
        )
        return True


@dataclass(frozen=True, slots=True)
class AcquireLeasesOp:
    """Take every listed shard whose lease is free, expired or already ours.

    Taking a shard from someone else (or afresh) bumps its epoch: the fencing token
    that makes the previous holder's writes fail. With `force`, every listed shard is
    taken at a new epoch even if its lease is live: a restarted Ray shard actor (whose
    name maps to exactly one live incarnation) fences out its predecessor at once.
    """

    owner: str
    shards: tuple[int, ...]
    ttl: float
    force: bool = False

    def apply(self, txn: Txn) -> dict[int, int]:
        now = time.time()
        taken: dict[int, int] = {}
        for shard in self.shards:
            row = txn.db.execute(
                "SELECT owner, epoch, expires_at FROM leases WHERE shard=?", (shard,)
            ).fetchone()
            if row is not None and row[0] == self.owner and not self.force:
                epoch = row[1]
            elif row is None or row[2] < now or self.force:
                epoch = (row[1] if row else 0) + 1
            else:
                continue
            txn.db.execute(
                "INSERT INTO leases (shard, owner, epoch, expires_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (shard) DO UPDATE SET owner=excluded.owner, "
                "epoch=excluded.epoch, expires_at=excluded.expires_at",
                (shard, self.owner, epoch, now + self.ttl),
            )
            taken[shard] = epoch
        return taken


@dataclass(frozen=True, slots=True)
class RenewLeasesOp:
    """Extend the leases still held at their epoch; returns the shards that remain ours."""

    owner: str
    held: tuple[tuple[int, int], ...]
    ttl: float

    def apply(self, txn: Txn) -> set[int]:
        expires = time.time() + self.ttl
        kept: set[int] = set()
        for shard, epoch in self.held:
            cur = txn.db.execute(
                "UPDATE leases SET expires_at=? WHERE shard=? AND owner=? AND epoch=?",
                (expires, shard, self.owner, epoch),
            )
            if cur.rowcount == 1:
                kept.add(shard)
        return kept


@dataclass(frozen=True, slots=True)
class ReleaseLeasesOp:
    owner: str

    def apply(self, txn: Txn) -> None:
        txn.db.execute("UPDATE leases SET expires_at=0 WHERE owner=?", (self.owner,))


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
        # The dedupe window: forget applied ids that are too many messages or too old ago.
        db.execute("DELETE FROM dedupe WHERE etype=? AND key=? AND seq<=? "
                   "AND (seq<=? OR accepted_at<?)",
                   (*ident, self.applied_seq, self.forget_seq, self.forget_before))
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
                f"{self.entity_type} {self.key!r}: run {self.run_id} is no longer running"
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


_DEAD_LETTER_COLS = ("etype, key, run_id, seq, message_id, name, payload, sender, error, "
                     "traceback, attempts, failed_at")


@dataclass(frozen=True, slots=True)
class RecordDeadLetterOp:
    """Move a signal whose handler kept raising to the dead letters (fenced).

    Idempotent per journal entry: a second record for the same run and seq returns the
    first row's id. Returns the dead letter's id.
    """

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    seq: int
    message_id: str
    name: str
    payload: str
    sender: str | None
    error: str
    traceback: str
    attempts: int
    failed_at: float

    def apply(self, txn: Txn) -> int:
        txn.check(self.fence)
        found = txn.db.execute(
            "SELECT id FROM dead_letters WHERE etype=? AND key=? AND run_id=? AND seq=?",
            (self.entity_type, self.key, self.run_id, self.seq),
        ).fetchone()
        if found is not None:
            return int(found[0])
        cur = txn.db.execute(
            f"INSERT INTO dead_letters ({_DEAD_LETTER_COLS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self.entity_type, self.key, self.run_id, self.seq, self.message_id, self.name,
             self.payload, self.sender, self.error, self.traceback, self.attempts,
             self.failed_at),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid


def replay_message_id(dead_letter_id: int, message_id: str) -> str:
    """The message id of a dead letter's replay: a retried replay is a duplicate."""
    return f"replay:{dead_letter_id}:{message_id}"


@dataclass(frozen=True, slots=True)
class ReplayDeadLetterOp:
    """Accept a dead letter's payload again as a new signal of the running run, and delete
    the dead letter, in one transaction (open to any process, like `AcceptOp`).

    The new entry's message id is `replay_message_id(id, original id)`, so retrying a
    replay whose answer was lost is answered `duplicate` (found through the dedupe
    window once the dead letter is gone). The recorded sender stays the original one:
    the payload is still that sender's message.
    """

    entity_type: str
    key: str
    shard: int
    dead_letter_id: int
    accepted_at: float

    def apply(self, txn: Txn) -> AcceptResult:
        db, ident = txn.db, (self.entity_type, self.key)
        row = db.execute(
            "SELECT message_id, name, payload, sender FROM dead_letters "
            "WHERE id=? AND etype=? AND key=?", (self.dead_letter_id, *ident),
        ).fetchone()
        if row is None:
            return self._replayed_before(txn)
        message_id, name, payload, sender = row
        acc = Acceptance(
            self.entity_type, self.key, self.shard, EntryKind.SIGNAL, name,
            replay_message_id(self.dead_letter_id, message_id), payload,
            payload_hash(name, payload), sender, None, IdReusePolicy.ALLOW_DUPLICATE,
            self.accepted_at,
        )
        try:
            result = AcceptOp(acc).apply(txn)  # refuses before writing anything
        except EntityNotRunningError as err:
            raise EntityNotRunningError(
                f"cannot replay dead letter {self.dead_letter_id}: {self.entity_type} "
                f"{self.key!r} is not running ({err})"
            ) from err
        db.execute("DELETE FROM dead_letters WHERE id=?", (self.dead_letter_id,))
        return result

    def _replayed_before(self, txn: Txn) -> AcceptResult:
        prefix = replay_message_id(self.dead_letter_id, "")
        ident = (self.entity_type, self.key)
        seen = txn.db.execute(  # a range scan of the dedupe key: ids starting with prefix
            "SELECT message_id, seq, run_id, sender, accepted_at FROM dedupe "
            "WHERE etype=? AND key=? AND message_id>=? AND message_id<? LIMIT 1",
            (*ident, prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)),
        ).fetchone()
        if seen is None:
            raise DeadLetterNotFoundError(
                f"{self.entity_type} {self.key!r} has no dead letter {self.dead_letter_id}"
            )
        message_id, seq, run_id, sender, accepted_at = seen
        stored = txn.db.execute(
            "SELECT name, payload FROM journal WHERE etype=? AND key=? AND seq=?", (*ident, seq)
        ).fetchone()
        # The entry may be covered by a snapshot by now; only run_id and seq matter then.
        name, payload = stored if stored is not None else ("", "null")
        entry = JournalEntry(self.entity_type, self.key, seq, run_id, EntryKind.SIGNAL, name,
                             message_id, payload, sender, accepted_at)
        return AcceptResult(duplicate=True, started=False, entry=entry)


@dataclass(frozen=True, slots=True)
class DiscardDeadLetterOp:
    """Delete a dead letter; returns whether it existed."""

    entity_type: str
    key: str
    dead_letter_id: int

    def apply(self, txn: Txn) -> bool:
        cur = txn.db.execute("DELETE FROM dead_letters WHERE id=? AND etype=? AND key=?",
                             (self.dead_letter_id, self.entity_type, self.key))
        return cur.rowcount == 1
