"""The outbox of entity-to-entity messages (`Entity.send`).

A send is written with the sender's own progress: in the transaction of the step
record, snapshot, close or continue-as-new that follows it (`write_sends`), numbered by
the sender's run (`seq`, 1, 2, ...). The sender's host then accepts each row into its
target, in `seq` order, with the message id `send:<type>/<key>/<run>/<seq>`, so a row
delivered again after a crash is a duplicate at the target (its dedupe window); and
marks the rows done (`SentOp`). A host taking a shard delivers what its senders left
(`pending_senders`). Delivered rows are deleted, except each run's newest, which keeps
the run's numbering going.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ._txn import Fence, Fenced, Txn

__all__ = ["OutboxRow", "Send", "SentOp", "pending_senders", "pending_sends", "send_message_id",
           "write_sends"]


@dataclass(frozen=True, slots=True)
class Send:
    """A message an entity sent, validated, not yet written: a signal (or, with
    `start`, a signal-with-start) to `target_type` `target_key`."""

    target_type: str
    target_key: str
    name: str
    payload: str
    start: str | None
    id_reuse: str


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
        return send_message_id(self.entity_type, self.key, self.run_id, self.seq)


def send_message_id(etype: str, key: str, run_id: int, seq: int) -> str:
    """The message id of a send: derived from its sender's run and number only."""
    return f"send:{etype}/{key}/{run_id}/{seq}"


async def write_sends(txn: Txn, shard: int, etype: str, key: str, run_id: int,
                      sends: Sequence[Send]) -> None:
    """Write `sends` to the outbox, numbered after the run's last one."""
    if not sends:
        return
    row = await txn.fetchone("SELECT max(seq) FROM outbox WHERE etype = ? AND key = ? "
                             "AND run_id = ?", etype, key, run_id)
    last = int(row[0]) if row is not None and row[0] is not None else 0
    now = time.time()
    await txn.executemany(
        "INSERT INTO outbox (etype, key, run_id, seq, shard, target_type, target_key, name, "
        "payload, start, id_reuse, delivered, error, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)",
        [(etype, key, run_id, last + i, shard, s.target_type, s.target_key, s.name,
          s.payload, s.start, s.id_reuse, False, now) for i, s in enumerate(sends, 1)])


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


async def pending_sends(q: Txn, etype: str, key: str, run_id: int) -> list[OutboxRow]:
    """The run's sends not delivered yet, in order."""
    rows = await q.fetchall(
        "SELECT seq, target_type, target_key, name, payload, start, id_reuse FROM outbox "
        "WHERE etype = ? AND key = ? AND run_id = ? AND NOT delivered ORDER BY seq",
        etype, key, run_id)
    return [OutboxRow(etype, key, run_id, int(r[0]), Send(r[1], r[2], r[3], r[4], r[5], r[6]))
            for r in rows]


async def pending_senders(q: Txn, shard: int) -> list[tuple[str, str, int]]:
    """The runs of `shard` with sends not delivered yet."""
    rows = await q.fetchall("SELECT DISTINCT etype, key, run_id FROM outbox WHERE shard = ? "
                            "AND NOT delivered", shard)
    return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]
