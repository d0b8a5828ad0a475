"""An entity's history as the store keeps it, read once for both engines (`_reads`'
style: functions of a read-only `Txn`).

What is kept bounds what can be shown (guarantee 7, bounded storage): a message is in
the journal until a snapshot covers it, with its name and payload; after that only its
row of the dedupe window says it was accepted (id, seq, run, sender, time), until the
window forgets it; a dead letter keeps its payload and error until it is replayed or
discarded. `messages` merges the three by seq, so each message appears once with what
is still known of it.
"""

from __future__ import annotations

from ._ops_dead_letters import replay_message_id
from ._records import EntryKind, MessageRecord, TimerRecord, WaitRecord
from ._rows import Row
from ._txn import Txn
from ._waits import WAIT_COLUMNS, wait_from_row

__all__ = ["entity_timers", "entity_waits", "messages", "replayed_to"]


async def messages(q: Txn, etype: str, key: str, after_seq: int, limit: int
                   ) -> list[MessageRecord]:
    """The entity's messages with a seq above `after_seq`, oldest first, at most `limit`.

    Each of the three sources is read up to `limit` rows after `after_seq`, so the first
    `limit` seqs of their union are all there.
    """
    found: dict[int, MessageRecord] = {}
    for r in await q.fetchall(
            "SELECT seq, run_id, message_id, sender, accepted_at FROM dedupe "
            "WHERE etype = ? AND key = ? AND seq > ? ORDER BY seq LIMIT ?",
            etype, key, after_seq, limit):
        at = Row("dedupe", etype, key, r[1], what=f"seq {r[0]}").seconds("accepted_at", r[4])
        found[r[0]] = MessageRecord(r[0], r[1], r[2], r[3], at)
    for r in await q.fetchall(
            "SELECT seq, run_id, message_id, sender, accepted_at, kind, name, payload "
            "FROM journal WHERE etype = ? AND key = ? AND seq > ? ORDER BY seq LIMIT ?",
            etype, key, after_seq, limit):
        row = Row("journal", etype, key, r[1], what=f"seq {r[0]}")
        found[r[0]] = MessageRecord(r[0], r[1], r[2], r[3], row.seconds("accepted_at", r[4]),
                                    row.enum("kind", EntryKind, r[5]), r[6], r[7])
    for r in await q.fetchall(
            "SELECT seq, run_id, message_id, sender, failed_at, name, payload, id, error "
            "FROM dead_letters WHERE etype = ? AND key = ? AND seq > ? ORDER BY seq LIMIT ?",
            etype, key, after_seq, limit):
        known = found.get(r[0])
        failed = Row("dead_letters", etype, key, r[1], what=f"dead letter {r[7]}").seconds(
            "failed_at", r[4])
        found[r[0]] = MessageRecord(
            r[0], r[1], r[2], r[3], known.accepted_at if known else None, EntryKind.SIGNAL,
            r[5], r[6], dead_letter_id=r[7], error=r[8], failed_at=failed)
    return [found[seq] for seq in sorted(found)[:limit]]


async def entity_timers(q: Txn, etype: str, key: str) -> list[TimerRecord]:
    """The entity's pending durable timers, the earliest due first."""
    rows = await q.fetchall("SELECT run_id, timer_id, due_at FROM timers WHERE etype = ? "
                            "AND key = ? ORDER BY due_at, timer_id", etype, key)
    return [TimerRecord(r[0], r[1], Row("timers", etype, key, r[0], what=f"timer {r[1]!r}")
                        .seconds("due_at", r[2])) for r in rows]


async def entity_waits(q: Txn, etype: str, key: str) -> list[WaitRecord]:
    """Every signal wait of the entity's retained runs, by run and name."""
    rows = await q.fetchall(f"SELECT {WAIT_COLUMNS} FROM signal_waits WHERE etype = ? "
                            "AND key = ? ORDER BY run_id, name", etype, key)
    return [wait_from_row(r) for r in rows]


async def replayed_to(q: Txn, dead_letter_id: int) -> tuple[str, str] | None:
    """The entity (type, key) a dead letter was replayed to, while its replay's message
    id is in that entity's dedupe window; None otherwise. A scan of the dedupe window
    (its key leads with the entity): only an operator's retried replay asks."""
    prefix, args = q.starts_with("message_id", replay_message_id(dead_letter_id, ""))
    row = await q.fetchone(f"SELECT etype, key FROM dedupe WHERE {prefix} LIMIT 1", *args)
    return None if row is None else (row[0], row[1])
