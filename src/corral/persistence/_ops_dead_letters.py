"""Dead letters: signals whose handler kept raising, and the operator's replay/discard.
Written once for both engines (see `_txn`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from corral._common import IdReusePolicy
from corral._errors import DeadLetterNotFoundError, EntityNotRunningError

from ._codec import payload_hash, storable_text
from ._ops_accept import AcceptOp
from ._records import Acceptance, AcceptResult, EntryKind, JournalEntry
from ._txn import DEAD_LETTERS, Fence, Fenced, LockPlan, Txn
from ._unapplied import DEAD_LETTER_COLUMNS

__all__ = [
    "DiscardDeadLetterOp",
    "RecordDeadLetterOp",
    "ReplayDeadLetterOp",
    "replay_message_id",
]


@dataclass(frozen=True, slots=True)
class RecordDeadLetterOp(Fenced):
    """Move a signal whose handler kept raising to the dead letters (fenced).

    Idempotent per journal entry: a second record for the same run and seq returns the
    first row's id. Returns the dead letter's id.
    """

    fence: Fence
    entry: JournalEntry
    error: str
    traceback: str
    attempts: int
    failed_at: float

    async def apply(self, txn: Txn) -> int:
        await txn.check(self.fence)
        e = self.entry
        found = await txn.fetchone(
            "SELECT id FROM dead_letters WHERE etype = ? AND key = ? AND run_id = ? "
            "AND seq = ?", e.entity_type, e.key, e.run_id, e.seq)
        if found is not None:
            return int(found[0])
        letter = await txn.insert_id(
            f"INSERT INTO dead_letters ({DEAD_LETTER_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            e.entity_type, e.key, e.run_id, e.seq, e.message_id, e.name, e.payload, e.sender,
            storable_text(self.error), storable_text(self.traceback), self.attempts,
            self.failed_at)
        txn.add_count(e.entity_type, DEAD_LETTERS, await txn.shard_of(e.entity_type, e.key),
                      1)
        return letter


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
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.ticks.add(self.shard)  # serialises two processes replaying the same letter
        plan.entities.add((self.entity_type, self.key))

    async def apply(self, txn: Txn) -> AcceptResult:
        row = await txn.fetchone(
            "SELECT message_id, name, payload, sender FROM dead_letters "
            f"WHERE id = ? AND etype = ? AND key = ?{txn.ROW_LOCK}",
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
        await txn.execute("DELETE FROM dead_letters WHERE id = ?", self.dead_letter_id)
        txn.add_count(self.entity_type, DEAD_LETTERS,
                      await txn.shard_of(self.entity_type, self.key), -1)
        return result

    async def _replayed_before(self, txn: Txn) -> AcceptResult:
        prefix, args = txn.starts_with("message_id", replay_message_id(self.dead_letter_id, ""))
        seen = await txn.fetchone(
            "SELECT message_id, seq, run_id, sender, accepted_at FROM dedupe "
            f"WHERE etype = ? AND key = ? AND {prefix} LIMIT 1",
            self.entity_type, self.key, *args)
        if seen is None:
            raise DeadLetterNotFoundError(
                f"{self.entity_type} {self.key!r} has no dead letter {self.dead_letter_id}",
                entity_type=self.entity_type, key=self.key,
            )
        message_id, seq, run_id, sender, accepted_at = seen
        stored = await txn.fetchone(
            "SELECT name, payload FROM journal WHERE etype = ? AND key = ? AND seq = ?",
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

    async def apply(self, txn: Txn) -> bool:
        deleted = await txn.execute("DELETE FROM dead_letters WHERE id = ? AND etype = ? "
                                    "AND key = ?", self.dead_letter_id, self.entity_type,
                                    self.key)
        if deleted:
            txn.add_count(self.entity_type, DEAD_LETTERS,
                          await txn.shard_of(self.entity_type, self.key), -deleted)
        return deleted == 1
