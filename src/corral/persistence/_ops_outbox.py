"""The outbox of entity-to-entity messages (`Entity.send`).

A send is written with the sender's own progress: in the transaction of the step
record, snapshot, close or continue-as-new that follows it (`write_sends`), under the
number the sender's host gave it within the run (`Send.seq`, 1, 2, ..., after
`last_send`). The number is the row's key and the write skips a number it finds, so a
write repeated after its commit's outcome was unknown (a lost connection during
PostgreSQL's COMMIT, retried by the caller) writes each send once. The sender's host
then accepts each row into its target, in `seq` order, with its message id: a send
`run()` made is `send:<type>/<key>/<run>/<seq>`; a handler's is derived from the journal
entry it applied and its place in that call, `send:<type>/<key>/<run>/<entry>.<n>`
(`handler_send_id`), so the same send made again by a handler re-applied after a crash
(written again, under a new number) is a duplicate at the target (its dedupe window),
as is a row delivered again. It then marks the rows done (`SentOp`). A host taking a
shard delivers what its senders left (`pending_senders`). Delivered rows are deleted,
except each run's newest, which keeps the run's numbering going.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from corral._tracing import is_traceparent

from ._txn import Fence, Fenced, Txn

__all__ = ["OutboxRow", "Send", "SentOp", "handler_send_id", "last_send", "pending_senders",
           "pending_sends", "send_message_id", "write_sends"]


@dataclass(frozen=True, slots=True)
class Send:
    """A message an entity sent, validated: a signal (or, with `start`, a
    signal-with-start) to `target_type` `target_key`.

    `seq`: its number within the sender's run (0 until the write that takes it numbers
    it). `message_id`: a handler's send carries the id derived from its cause
    (`handler_send_id`); None for a send of `run()`, whose id is derived from `seq`.
    `trace`: the W3C traceparent of the send's span (`corral._tracing`), which its
    acceptance into the target carries on; None when tracing is off."""

    target_type: str
    target_key: str
    name: str
    payload: str
    start: str | None
    id_reuse: str
    seq: int = 0
    message_id: str | None = None
    trace: str | None = None


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A written send: its sender's run and number, and what it carries."""

    entity_type: str
    key: str
    run_id: int
    seq: int
    send: Send

    @property
    def message_id(self) -> str:
        return self.send.message_id or send_message_id(self.entity_type, self.key,
                                                       self.run_id, self.seq)


def send_message_id(etype: str, key: str, run_id: int, seq: int) -> str:
    """The message id of a send of `run()`: derived from its sender's run and number."""
    return f"send:{etype}/{key}/{run_id}/{seq}"


def handler_send_id(etype: str, key: str, run_id: int, entry_seq: int, index: int) -> str:
    """The message id of a handler's send: derived from its sender's run, the journal
    entry the handler applied and the send's place (1, 2, ...) in that call, which a
    re-applied handler derives again."""
    return f"send:{etype}/{key}/{run_id}/{entry_seq}.{index}"


async def write_sends(txn: Txn, shard: int, etype: str, key: str, run_id: int,
                      sends: Sequence[Send]) -> None:
    """Write `sends` (numbered) to the outbox; a number already written is skipped: the
    same write repeated (its first commit's outcome unknown) writes nothing more."""
    if not sends:
        return
    if any(s.seq < 1 for s in sends):
        raise ValueError("a send is numbered before it is written")
    now = time.time()
    await txn.executemany(
        "INSERT INTO outbox (etype, key, run_id, seq, shard, target_type, target_key, name, "
        "payload, start, id_reuse, message_id, delivered, error, created_at, trace) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?) "
        "ON CONFLICT (etype, key, run_id, seq) DO NOTHING",
        [(etype, key, run_id, s.seq, shard, s.target_type, s.target_key, s.name,
          s.payload, s.start, s.id_reuse, s.message_id, False, now,
          s.trace if is_traceparent(s.trace) else None) for s in sends])


@dataclass(frozen=True, slots=True)
class SentOp(Fenced):
    """The sends of a run up to `upto` were accepted by their targets (or refused, with
    `errors` by seq: kept, with the reason, for operators): mark them delivered and
    delete the delivered rows before the run's newest."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    upto: int
    errors: tuple[tuple[int, str], ...] = ()

    async def apply(self, txn: Txn) -> None:
        await txn.check(self.fence)
        ident = (self.entity_type, self.key, self.run_id)
        await txn.executemany("UPDATE outbox SET error = ? WHERE etype = ? AND key = ? "
                              "AND run_id = ? AND seq = ?",
                              [(error, *ident, seq) for seq, error in self.errors])
        await txn.execute("UPDATE outbox SET delivered = ? WHERE etype = ? AND key = ? "
                          "AND run_id = ? AND seq <= ?", True, *ident, self.upto)
        await txn.execute(
            "DELETE FROM outbox WHERE etype = ? AND key = ? AND run_id = ? AND delivered "
            "AND error IS NULL AND seq < (SELECT max(seq) FROM outbox WHERE etype = ? "
            "AND key = ? AND run_id = ?)", *ident, *ident)


async def pending_sends(q: Txn, etype: str, key: str, run_id: int,
                        limit: int) -> list[OutboxRow]:
    """The run's first `limit` sends not delivered yet, in order."""
    rows = await q.fetchall(
        "SELECT seq, target_type, target_key, name, payload, start, id_reuse, message_id, "
        "trace FROM outbox WHERE etype = ? AND key = ? AND run_id = ? AND NOT delivered "
        "ORDER BY seq LIMIT ?", etype, key, run_id, limit)
    return [OutboxRow(etype, key, run_id, int(r[0]),
                      Send(r[1], r[2], r[3], r[4], r[5], r[6], int(r[0]), r[7],
                           r[8] if is_traceparent(r[8]) else None))
            for r in rows]


async def last_send(q: Txn, etype: str, key: str, run_id: int) -> int:
    """The number of the run's last written send (0: none); the run's next is after it
    (delivered rows go, but the newest stays)."""
    row = await q.fetchone("SELECT max(seq) FROM outbox WHERE etype = ? AND key = ? "
                           "AND run_id = ?", etype, key, run_id)
    return int(row[0]) if row is not None and row[0] is not None else 0


async def pending_senders(q: Txn, shard: int) -> list[tuple[str, str, int]]:
    """The runs of `shard` with sends not delivered yet."""
    rows = await q.fetchall("SELECT DISTINCT etype, key, run_id FROM outbox WHERE shard = ? "
                            "AND NOT delivered", shard)
    return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]
