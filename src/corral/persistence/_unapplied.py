"""Messages a closed run accepted but never applied become dead letters of that run.

A run can end with messages it never applied: an activation that cannot be built
closes it as failed (`CloseRunOp(force=True)`), a terminate accepted while the entity
was not in memory closes it in the store at once, and `run()` may end leaving payloads
in its mailbox. None of them is discarded: each becomes a dead letter of that run with
the reason ("run 1 was terminated before applying it"), which an operator replays into
the next run (`replay_dead_letter`) or discards.

The watermark is the host's own when it closes the run (it knows what it applied);
otherwise (a terminated run found closed by the next activation) it is the run's
latest snapshot: an entry after it was never durably applied, so under corral's
recovery model it was not applied at all. Idempotent per run and seq. The decision
(`reason`, which rows) and its statements are written once here, for both engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from corral._common import RunStatus

from ._codec import storable_text
from ._progress import RECORD
from ._records import EntryKind, JournalEntry
from ._txn import DEAD_LETTERS, Fence, Fenced, Txn

__all__ = ["DEAD_LETTER_COLUMNS", "SettleRunOp", "settle_run", "unapplied_letters",
           "unapplied_reason"]

DEAD_LETTER_COLUMNS = ("etype, key, run_id, seq, message_id, name, payload, sender, error, "
                       "traceback, attempts, failed_at")

_PHRASE = {RunStatus.TERMINATED: "was terminated", RunStatus.FAILED: "failed",
           RunStatus.COMPLETED: "completed"}
MESSAGE_KINDS = (EntryKind.SIGNAL.value, EntryKind.UPDATE.value)
"""The journal entries that are messages (start marks, terminates and deliveries to
signal waits are not: a delivery to a closed run's wait is answered `stale`)."""


def unapplied_reason(run_id: int, status: RunStatus, *, mailbox: bool) -> str:
    """Why a message of a closed run is a dead letter, for an operator.

    Example:
        >>> unapplied_reason(1, RunStatus.TERMINATED, mailbox=False)
        'run 1 was terminated before applying it; replay it into the next run'
    """
    phrase = _PHRASE.get(status, f"ended as {status.value}")
    what = "run() took it from its mailbox" if mailbox else "applying it"
    return f"run {run_id} {phrase} before {what}; replay it into the next run"


def unapplied_letters(run_id: int, status: RunStatus, rows: Sequence[Sequence[Any]],
                      pending: Sequence[JournalEntry]) -> list[tuple[Any, ...]]:
    """The dead letters (seq, message id, name, payload, sender, reason) of closed run
    `run_id`: its journal `rows` (seq, message_id, name, payload, sender) after the
    watermark, then the mailbox entries `run()` never took."""
    letters = [(*row, unapplied_reason(run_id, status, mailbox=False)) for row in rows]
    letters += [(e.seq, e.message_id, e.name, e.payload, e.sender,
                 unapplied_reason(run_id, status, mailbox=True)) for e in pending]
    return letters


async def settle_run(txn: Txn, etype: str, key: str, run_id: int,
                     applied_seq: int | None, pending: Sequence[JournalEntry],
                     failed_at: float) -> int:
    """Dead-letter what closed run `run_id` never applied: its journal's messages after
    `applied_seq` (None: its latest snapshot's watermark, for a terminated run only:
    every other close is a host's, which settled the run with its own watermark) and
    the `pending` mailbox entries, and record the watermark as the entity's progress
    (operators read it once no host has the run in memory; mailbox depth 0: what it
    held is dead-lettered). Nothing for a run still running. Returns how many dead
    letters were added."""
    row = await txn.fetchone("SELECT status, first_seq FROM runs WHERE etype = ? AND key = ? "
                             "AND run_id = ?", etype, key, run_id)
    if row is None or row[0] == RunStatus.RUNNING.value:
        return 0
    status = RunStatus(row[0])
    if applied_seq is None and status is not RunStatus.TERMINATED:
        return 0  # other closes are the host's, which settled them with its watermark
    if applied_seq is None:
        snap = await txn.fetchone("SELECT max(applied_seq) FROM snapshots WHERE etype = ? "
                                  "AND key = ? AND run_id = ?", etype, key, run_id)
        applied_seq = int(snap[0]) if snap and snap[0] is not None else int(row[1]) - 1
    await txn.execute(RECORD, etype, key, applied_seq, 0, failed_at)
    rows = await txn.fetchall(
        "SELECT seq, message_id, name, payload, sender FROM journal WHERE etype = ? AND "
        "key = ? AND run_id = ? AND seq > ? AND kind IN (?, ?) ORDER BY seq",
        etype, key, run_id, applied_seq, *MESSAGE_KINDS)
    added = 0
    for seq, mid, name, payload, sender, reason in unapplied_letters(
            run_id, status, [tuple(r) for r in rows], pending):
        if await txn.fetchone("SELECT 1 FROM dead_letters WHERE etype = ? AND key = ? AND "
                              "run_id = ? AND seq = ?", etype, key, run_id, seq) is not None:
            continue
        await txn.execute(f"INSERT INTO dead_letters ({DEAD_LETTER_COLUMNS}) "
                          "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                          etype, key, run_id, seq, mid, name, payload, sender,
                          storable_text(reason), "", 0, failed_at)
        added += 1
    if added:
        txn.add_count(etype, DEAD_LETTERS, await txn.shard_of(etype, key), added)
    return added


@dataclass(frozen=True, slots=True)
class SettleRunOp(Fenced):
    """`settle_run` as a fenced write (see the module docstring)."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    applied_seq: int | None
    pending: tuple[JournalEntry, ...]
    failed_at: float
    locks_entity: ClassVar[bool] = True

    async def apply(self, txn: Txn) -> int:
        await txn.check(self.fence)
        return await settle_run(txn, self.entity_type, self.key, self.run_id,
                                self.applied_seq, self.pending, self.failed_at)
