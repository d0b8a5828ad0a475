"""Backpressure: a signal over its entity's `max_backlog` is refused, or kept as a dead
letter, inside the accepting transaction (where acceptance is linearised, so two
processes never both admit the last free place). Written once for both engines.

The backlog is the entity's accepted seq (`next_seq - 1`, this batch's own acceptances
included) minus the applied watermark the transaction can know: the higher of the
accepting process's own (`Acceptance.applied`, exact where it hosts the entity), the
latest snapshot's and the one its host last recorded in `progress` (at most a second or
so old). All only lag the truth, so a stale watermark makes the bound refuse
early, never admit past it. The snapshot is read only when the first count is over.
"""

from __future__ import annotations

from corral._errors import EntityOverloadedError

from ._records import Acceptance, AcceptResult, JournalEntry
from ._txn import DEAD_LETTERS, EntityRow, Txn
from ._unapplied import DEAD_LETTER_COLUMNS

__all__ = ["overflow", "retry_after"]


def retry_after(backlog: int) -> float:
    """The delay suggested to a refused sender: the time to apply `backlog` at ~1,000
    messages a second (a host's rate for a light handler), between 0.05 and 5 s."""
    return round(min(5.0, max(0.05, backlog / 1000)), 3)


async def overflow(txn: Txn, acc: Acceptance, row: EntityRow) -> AcceptResult | None:
    """None if `acc` fits its entity's backlog; else its dead letter's result
    (`overflow="dead_letter"`), or `EntityOverloadedError` raised before anything is written."""
    bound = acc.max_backlog
    assert bound is not None
    accepted = row.next_seq - 1
    if accepted - acc.applied < bound:
        return None
    backlog = accepted - max(acc.applied, await _stored_floor(txn, acc.entity_type, acc.key))
    if backlog < bound:
        return None
    reason = (f"overloaded: {acc.entity_type} {acc.key!r} has {backlog} signals accepted "
              f"but not applied (max_backlog {bound})")
    if acc.overflow == "dead_letter":
        return await _dead_letter(txn, acc, row, reason)
    raise EntityOverloadedError(
        f"{reason}; retry the send later", backlog=backlog, max_backlog=bound,
        retry_after=retry_after(backlog - bound + 1), entity_type=acc.entity_type,
        key=acc.key, run_id=row.run_id, message_id=acc.message_id)


async def _stored_floor(txn: Txn, etype: str, key: str) -> int:
    """The entity's applied seq as the store knows it (0 if not at all): the higher of
    its latest snapshot's and its host's recorded progress; read once a batch."""
    ident = (etype, key)
    if ident not in txn.floors:
        r = await txn.fetchone(
            "SELECT MAX(seq) FROM (SELECT MAX(applied_seq) AS seq FROM snapshots "
            "WHERE etype = ? AND key = ? UNION ALL SELECT applied_seq AS seq FROM progress "
            "WHERE etype = ? AND key = ?) AS known", etype, key, etype, key)
        txn.floors[ident] = int(r[0]) if r is not None and r[0] is not None else 0
    return txn.floors[ident]


async def _dead_letter(txn: Txn, acc: Acceptance, row: EntityRow, reason: str) -> AcceptResult:
    """Keep the signal as a dead letter of the running run (seq 0: it is in no journal,
    and holds no place in the dedupe window). Written at once: no buffered row of the
    batch touches `dead_letters`."""
    letter = await txn.insert_id(
        f"INSERT INTO dead_letters ({DEAD_LETTER_COLUMNS}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        acc.entity_type, acc.key, row.run_id, 0, acc.message_id, acc.name, acc.payload,
        acc.sender, reason, "", 0, acc.accepted_at)
    txn.add_count(acc.entity_type, DEAD_LETTERS, row.shard, 1)
    entry = JournalEntry(acc.entity_type, acc.key, 0, row.run_id, acc.kind, acc.name,
                         acc.message_id, acc.payload, acc.sender, acc.accepted_at)
    return AcceptResult(duplicate=False, started=False, entry=entry, dead_letter_id=letter)
