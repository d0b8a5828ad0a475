"""Acceptance, open to any process: start the run if needed (per the id reuse policy),
deduplicate, append to the journal. Written once for both engines (see `_txn`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from corral._common import RunStatus
from corral._errors import (
    BatchRefusedError,
    CorralError,
    EntityClosedError,
    EntityNotRunningError,
    IdempotencyConflictError,
    InvalidArgumentError,
)
from corral._tracing import is_traceparent

from ._backpressure import overflow
from ._ops_waits import end_run
from ._records import Acceptance, AcceptResult, EntryKind, JournalEntry
from ._txn import EntityRow, LockPlan, Seen, Txn

__all__ = ["AcceptAllOp", "AcceptOp"]


@dataclass(frozen=True, slots=True)
class AcceptOp:
    """Start the run if needed (per the id reuse policy), dedupe, append to the journal."""

    acc: Acceptance
    buffered: ClassVar[bool] = True  # its rows wait for Txn.flush

    def plan(self, plan: LockPlan) -> None:
        a = self.acc
        plan.ticks.add(a.shard)
        plan.entities.add((a.entity_type, a.key))
        if not a.fresh_id:
            plan.dedupe.add((a.entity_type, a.key, a.message_id))

    async def apply(self, txn: Txn) -> AcceptResult:
        a = self.acc
        if a.trace is not None and not is_traceparent(a.trace):
            raise InvalidArgumentError(
                f"{a.entity_type} {a.key!r}: trace context {a.trace!r:.80} is not a W3C "
                "traceparent; nothing stored", entity_type=a.entity_type, key=a.key,
                message_id=a.message_id)
        if not a.fresh_id:
            seen = await txn.seen(a.entity_type, a.key, a.message_id)
            if seen is not None:
                return self._duplicate(seen)
        row = await txn.entity(a.entity_type, a.key)
        started = False
        if row is None or row.status is not RunStatus.RUNNING:
            row = self._start(txn, row)
            started = True
        elif a.max_backlog is not None:
            overflowed = await overflow(txn, a, row)
            if overflowed is not None:
                return overflowed
        entry = JournalEntry(
            a.entity_type, a.key, row.next_seq, row.run_id, a.kind, a.name, a.message_id,
            a.payload, a.sender, a.accepted_at, a.trace,
        )
        txn.append(a.shard, entry, a.payload_hash)
        row.next_seq += 1
        txn.put_entity(a.entity_type, a.key, row)
        if a.kind is EntryKind.TERMINATE:
            row.status = RunStatus.TERMINATED
            await txn.flush()  # the run may have started earlier in this batch
            await end_run(txn, a.entity_type, a.key, row.run_id, RunStatus.TERMINATED.value,
                          None, a.payload, a.accepted_at)
        return AcceptResult(duplicate=False, started=started, entry=entry)

    def _start(self, txn: Txn, row: EntityRow | None) -> EntityRow:
        """Open the next run (buffered), or refuse before writing anything."""
        a = self.acc
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
        txn.start_run(a.entity_type, a.key, run_id, a.start, a.accepted_at, next_seq)
        return EntityRow(a.shard, run_id, RunStatus.RUNNING, next_seq, first_seq=next_seq)

    def _duplicate(self, seen: Seen) -> AcceptResult:
        a = self.acc
        seq, run_id, stored_hash, sender, accepted_at = seen
        if stored_hash != a.payload_hash:
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


@dataclass(frozen=True, slots=True)
class AcceptAllOp:
    """Accept every acceptance, in order, or none (`Runtime.signal_many`): a refused one
    (conflict, closed run, overloaded) refuses the batch with `BatchRefusedError`,
    naming its index, and nothing of the batch is written. A duplicate is not a refusal:
    it is answered duplicate, as alone (of an earlier item of the batch too).

    Not `buffered`: it starts on a flushed transaction, inside a savepoint, so a refusal
    rolls back what its items executed and drops what they buffered (`Txn.forget_all`)."""

    accs: Sequence[Acceptance]
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        for acc in self.accs:
            AcceptOp(acc).plan(plan)

    async def apply(self, txn: Txn) -> list[AcceptResult]:
        counts = dict(txn.counts)
        await txn.execute("SAVEPOINT accept_all")
        results: list[AcceptResult] = []
        for index, acc in enumerate(self.accs):
            try:
                results.append(await AcceptOp(acc).apply(txn))
            except CorralError as err:
                await txn.execute("ROLLBACK TO SAVEPOINT accept_all")
                await txn.execute("RELEASE SAVEPOINT accept_all")
                txn.forget_all(counts)
                raise BatchRefusedError.of(index, err) from err
        await txn.execute("RELEASE SAVEPOINT accept_all")
        return results
