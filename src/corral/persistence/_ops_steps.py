"""Durable steps (`Entity.step`): the recorded outcome of each completed step of a run.

A step is identified by its name within its run (see `runtime.host._steps`). Its outcome is
written once, fenced, before `run()` goes on; a replay reads it back instead of calling
the step's function again. Records are bounded: a `checkpoint()` deletes the records
it covers (in the snapshot's transaction, `SnapshotOp.forget_steps`), and the end of a
run (closed, terminated, continued) deletes all of its records (`forget_run_steps`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._ops_outbox import Send, write_sends
from ._txn import Fence, Fenced, Txn

__all__ = ["RecordStepOp", "StepRecord", "forget_run_steps", "forget_steps", "run_steps"]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """The outcome of one completed step of a run.

    `result` is the JSON of `fn`'s return value when `ok`, else None and `error` says
    why the step failed for good (after `attempts` attempts).
    """

    name: str
    ok: bool
    result: str | None
    error: str | None
    attempts: int
    recorded_at: float


@dataclass(frozen=True, slots=True)
class RecordStepOp(Fenced):
    """Record a step's outcome, with the sends made before it (`_ops_outbox`); the
    first record of a name in a run wins."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    record: StepRecord
    sends: tuple[Send, ...] = ()

    async def apply(self, txn: Txn) -> None:
        await txn.check(self.fence)
        r = self.record
        await txn.execute(
            "INSERT INTO steps (etype, key, run_id, name, ok, result, error, attempts, "
            "recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (etype, key, run_id, name) DO NOTHING",
            self.entity_type, self.key, self.run_id, r.name, r.ok, r.result, r.error,
            r.attempts, r.recorded_at)
        await write_sends(txn, self.fence.shard, self.entity_type, self.key, self.run_id,
                          self.sends)


async def forget_steps(txn: Txn, etype: str, key: str, run_id: int,
                       names: Sequence[str]) -> None:
    """Delete the records of `names` (a checkpoint covers them)."""
    await txn.executemany(
        "DELETE FROM steps WHERE etype = ? AND key = ? AND run_id = ? AND name = ?",
        [(etype, key, run_id, name) for name in names])


async def forget_run_steps(txn: Txn, etype: str, key: str, run_id: int) -> None:
    """The run ended: delete its step records (and any older run's)."""
    await txn.execute("DELETE FROM steps WHERE etype = ? AND key = ? AND run_id <= ?",
                      etype, key, run_id)


async def run_steps(q: Txn, etype: str, key: str, run_id: int) -> dict[str, StepRecord]:
    """The recorded steps of the run, by name."""
    rows = await q.fetchall(
        "SELECT name, ok, result, error, attempts, recorded_at FROM steps "
        "WHERE etype = ? AND key = ? AND run_id = ?", etype, key, run_id)
    return {str(r[0]): StepRecord(str(r[0]), bool(r[1]), r[2], r[3], int(r[4]), float(r[5]))
            for r in rows}
