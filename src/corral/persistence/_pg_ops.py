"""PostgreSQL write ops open to any process: acceptance, dead-letter replay and discard,
and shard leases. Each mirrors its SQLite twin (`_accept`, `_dead_letters`, `_leases`)
exactly: same refusals, same results; only the SQL and the locking differ."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from corral._common import IdReusePolicy, RunStatus
from corral._errors import (
    DeadLetterNotFoundError,
    EntityClosedError,
    EntityNotRunningError,
    IdempotencyConflictError,
)

from ._codec import payload_hash
from ._dead_letters import replay_message_id
from ._pg_txn import LockPlan, PgTxn, Seen
from ._pg_waits import close_waits
from ._records import Acceptance, AcceptResult, EntryKind, JournalEntry
from ._txn import EntityRow

__all__ = [
    "AcceptOp",
    "AcquireLeasesOp",
    "DiscardDeadLetterOp",
    "ReleaseLeasesOp",
    "RenewLeasesOp",
    "ReplayDeadLetterOp",
]


@dataclass(frozen=True, slots=True)
class AcceptOp:
    """Start the run if needed (per the id reuse policy), dedupe, append to the journal."""

    acc: Acceptance
    buffered: ClassVar[bool] = True  # its rows wait for PgTxn.flush

    def plan(self, plan: LockPlan) -> None:
        a = self.acc
        plan.ticks.add(a.shard)
        plan.entities.add((a.entity_type, a.key))
        if not a.fresh_id:
            plan.dedupe.add((a.entity_type, a.key, a.message_id))

    async def apply(self, txn: PgTxn) -> AcceptResult:
        a = self.acc
        if not a.fresh_id:
            seen = await txn.seen(a.entity_type, a.key, a.message_id)
            if seen is not None:
                return self._duplicate(seen)
        row = await txn.entity(a.entity_type, a.key)
        started = False
        if row is None or row.status is not RunStatus.RUNNING:
            row = self._start(txn, row)
            started = True
        entry = JournalEntry(
            a.entity_type, a.key, row.next_seq, row.run_id, a.kind, a.name, a.message_id,
            a.payload, a.sender, a.accepted_at,
        )
        await txn.append(a.shard, entry, a.payload_hash)
        row.next_seq += 1
        if a.kind is EntryKind.TERMINATE:
            row.status = RunStatus.TERMINATED
            await txn.flush()  # the run may have started earlier in this batch
            await txn.conn.execute("DELETE FROM timers WHERE etype = $1 AND key = $2",
                                   a.entity_type, a.key)
            await close_waits(txn.conn, a.entity_type, a.key, row.run_id)
            await txn.conn.execute(
                "UPDATE runs SET status = 'terminated', error = $1, closed_at = $2 "
                "WHERE etype = $3 AND key = $4 AND run_id = $5",
                a.payload, a.accepted_at, a.entity_type, a.key, row.run_id)
        txn.put_entity(a.entity_type, a.key, row)
        return AcceptResult(duplicate=False, started=started, entry=entry)

    def _start(self, txn: PgTxn, row: EntityRow | None) -> EntityRow:
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
        txn.runs_rows.append((a.entity_type, a.key, run_id, a.start, a.accepted_at, next_seq))
        return EntityRow(a.shard, run_id, RunStatus.RUNNING, next_seq)

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
class ReplayDeadLetterOp:
    """Accept a dead letter's payload again as a new signal of the running run and delete
    the dead letter, in one transaction (see `_dead_letters.ReplayDeadLetterOp`)."""

    entity_type: str
    key: str
    shard: int
    dead_letter_id: int
    accepted_at: float
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.ticks.add(self.shard)  # serialises two processes replaying the same letter
        plan.entities.add((self.entity_type, self.key))

    async def apply(self, txn: PgTxn) -> AcceptResult:
        row = await txn.conn.fetchrow(
            "SELECT message_id, name, payload, sender FROM dead_letters "
            "WHERE id = $1 AND etype = $2 AND key = $3 FOR UPDATE",
            self.dead_letter_id, self.entity_type, self.key)
        if row is None:
            return await self._replayed_before(txn)
        message_id, name, payload, sender = row
        acc = Acceptance(
            self.entity_type, self.key, self.shard, EntryKind.SIGNAL, name,
            replay_message_id(self.dead_letter_id, message_id), payload,
            payload_hash(name, payload), sender, None, IdReusePolicy.ALLOW_DUPLICATE,
            self.accepted_at,
        )
        try:
            result = await AcceptOp(acc).apply(txn)  # refuses before writing anything
        except EntityNotRunningError as err:
            raise EntityNotRunningError(
                f"cannot replay dead letter {self.dead_letter_id}: {self.entity_type} "
                f"{self.key!r} is not running ({err})",
                entity_type=self.entity_type, key=self.key, run_id=err.run_id,
                message_id=acc.message_id,
            ) from err
        await txn.conn.execute("DELETE FROM dead_letters WHERE id = $1", self.dead_letter_id)
        return result

    async def _replayed_before(self, txn: PgTxn) -> AcceptResult:
        prefix = replay_message_id(self.dead_letter_id, "")
        seen = await txn.conn.fetchrow(  # starts_with: independent of the collation
            "SELECT message_id, seq, run_id, sender, accepted_at FROM dedupe "
            "WHERE etype = $1 AND key = $2 AND starts_with(message_id, $3) LIMIT 1",
            self.entity_type, self.key, prefix)
        if seen is None:
            raise DeadLetterNotFoundError(
                f"{self.entity_type} {self.key!r} has no dead letter {self.dead_letter_id}",
                entity_type=self.entity_type, key=self.key,
            )
        message_id, seq, run_id, sender, accepted_at = seen
        stored = await txn.conn.fetchrow(
            "SELECT name, payload FROM journal WHERE etype = $1 AND key = $2 AND seq = $3",
            self.entity_type, self.key, seq)
        # The entry may be covered by a snapshot by now; only run_id and seq matter then.
        name, payload = (stored[0], stored[1]) if stored is not None else ("", "null")
        entry = JournalEntry(self.entity_type, self.key, seq, run_id, EntryKind.SIGNAL, name,
                             message_id, payload, sender, accepted_at)
        return AcceptResult(duplicate=True, started=False, entry=entry)


@dataclass(frozen=True, slots=True)
class DiscardDeadLetterOp:
    """Delete a dead letter; returns whether it existed."""

    entity_type: str
    key: str
    dead_letter_id: int
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        pass

    async def apply(self, txn: PgTxn) -> bool:
        status = await txn.conn.execute(
            "DELETE FROM dead_letters WHERE id = $1 AND etype = $2 AND key = $3",
            self.dead_letter_id, self.entity_type, self.key)
        return bool(status == "DELETE 1")


@dataclass(frozen=True, slots=True)
class AcquireLeasesOp:
    """Take every listed shard whose lease is free, expired or already ours; a new holder
    gets a new epoch (the fencing token); `force` takes live leases too, and so does
    `orphaned`: shards whose advisory lock the store obtained, so no live session holds
    them (see `_leases.AcquireLeasesOp`, `_pg_session`). Expiry is judged by the
    database server's clock, the one clock every process sharing the store agrees on."""

    owner: str
    shards: tuple[int, ...]
    ttl: float
    force: bool = False
    orphaned: frozenset[int] = frozenset()
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.update(self.shards)
        plan.lease_update = plan.new_leases = True

    async def apply(self, txn: PgTxn) -> dict[int, int]:
        now = await txn.clock()
        taken: dict[int, int] = {}
        for shard in self.shards:
            row = await txn.lease(shard)
            if row is not None and row[0] == self.owner and not self.force:
                epoch = row[1]
            elif row is None or row[2] < now or self.force or shard in self.orphaned:
                epoch = (row[1] if row else 0) + 1
            else:
                continue
            taken[shard] = epoch
            txn.leases[shard] = (self.owner, epoch, now + self.ttl)
        await txn.conn.execute(
            "UPDATE leases l SET owner = $1, epoch = t.epoch, expires_at = $2 "
            "FROM unnest($3::int[], $4::bigint[]) AS t(shard, epoch) WHERE l.shard = t.shard",
            self.owner, now + self.ttl, list(taken), list(taken.values()))
        return taken


@dataclass(frozen=True, slots=True)
class RenewLeasesOp:
    """Extend the leases still held at their epoch; returns the shards that remain ours."""

    owner: str
    held: tuple[tuple[int, int], ...]
    ttl: float
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.update(shard for shard, _ in self.held)
        plan.lease_update = True

    async def apply(self, txn: PgTxn) -> set[int]:
        rows = await txn.conn.fetch(
            "UPDATE leases l SET expires_at = extract(epoch FROM clock_timestamp()) + $1 "
            "FROM unnest($2::int[], $3::bigint[]) AS h(shard, epoch) "
            "WHERE l.shard = h.shard AND l.owner = $4 AND l.epoch = h.epoch RETURNING l.shard",
            self.ttl, [s for s, _ in self.held], [e for _, e in self.held], self.owner)
        return {r[0] for r in rows}


@dataclass(frozen=True, slots=True)
class ReleaseLeasesOp:
    owner: str
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        pass

    async def apply(self, txn: PgTxn) -> None:
        rows = await txn.conn.fetch(
            "UPDATE leases SET expires_at = 0 WHERE owner = $1 RETURNING shard", self.owner)
        for r in rows:
            if r[0] in txn.leases:
                owner, epoch, _ = txn.leases[r[0]]
                txn.leases[r[0]] = (owner, epoch, 0.0)
