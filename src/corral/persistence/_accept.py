"""Acceptance: start the run if needed, deduplicate, append to the journal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from corral._common import RunStatus
from corral._errors import (
    EntityClosedError,
    EntityNotRunningError,
    IdempotencyConflictError,
)

from ._records import Acceptance, AcceptResult, EntryKind, JournalEntry
from ._txn import EntityRow, Txn
from ._wait_ops import close_waits

__all__ = ["AcceptOp"]


@dataclass(frozen=True, slots=True)
class AcceptOp:
    acc: Acceptance
    buffered: ClassVar[bool] = True  # its journal/dedupe rows wait for Txn.flush

    def apply(self, txn: Txn) -> AcceptResult:
        a = self.acc
        db = txn.db
        ident = (a.entity_type, a.key, a.message_id)
        if not a.fresh_id:
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
                    if a.kind not in (EntryKind.TERMINATE, EntryKind.RESUME)
                    else f"{a.entity_type} {a.key!r} {state}; nothing to {a.kind.value}",
                    entity_type=a.entity_type, key=a.key, message_id=a.message_id,
                    run_id=None if row is None else row.run_id,
                )
            if row is not None and not a.id_reuse.allows_after(row.status):
                raise EntityClosedError(
                    f"{a.entity_type} {a.key!r}: run {row.run_id} is {row.status.value} and "
                    f"the id reuse policy is {a.id_reuse.name}",
                    entity_type=a.entity_type, key=a.key, run_id=row.run_id,
                    message_id=a.message_id,
                )
            run_id = 1 if row is None else row.run_id + 1
            next_seq = 1 if row is None else row.next_seq
            db.execute(
                "INSERT INTO runs (etype, key, run_id, status, start_input, started_at, "
                "first_seq) VALUES (?, ?, ?, 'running', ?, ?, ?)",
                (a.entity_type, a.key, run_id, a.start, a.accepted_at, next_seq),
            )
            row = EntityRow(a.shard, run_id, RunStatus.RUNNING, next_seq)
            started = True
        entry = JournalEntry(
            a.entity_type, a.key, row.next_seq, row.run_id, a.kind, a.name, a.message_id,
            a.payload, a.sender, a.accepted_at,
        )
        txn.journal_rows.append((
            a.entity_type, a.key, entry.seq, entry.run_id, a.shard, a.kind._value_, a.name,
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
            close_waits(db, a.entity_type, a.key, row.run_id)
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
                "before with a different payload",
                entity_type=a.entity_type, key=a.key, run_id=run_id, message_id=a.message_id,
            )
        if sender != a.sender:
            raise IdempotencyConflictError(
                f"message id {a.message_id!r} for {a.entity_type} {a.key!r} was accepted "
                f"before from sender {sender!r}, not {a.sender!r}",
                entity_type=a.entity_type, key=a.key, run_id=run_id, message_id=a.message_id,
            )
        entry = JournalEntry(
            a.entity_type, a.key, seq, run_id, a.kind, a.name, a.message_id, a.payload,
            sender, accepted_at,
        )
        return AcceptResult(duplicate=True, started=False, entry=entry)
