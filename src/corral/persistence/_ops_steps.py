"""Durable steps (`Entity.step`): the recorded outcome of each completed step of a run.

A step is identified by its name within its run (see `runtime.host._steps`). Its outcome is
written once, fenced, before `run()` goes on; a replay reads it back instead of calling
the step's function again. Records are bounded: a `checkpoint()` deletes the records
it covers (in the snapshot's transaction, `SnapshotOp.forget_steps`), and the end of a
run (closed, terminated, continued) deletes all of its records (`forget_run_steps`).

Steps in history (`step_history`): what operators read of a run's steps, kept apart
from the records a replay reads because those go at a checkpoint and at the run's end.
A step's row is written when an attempt fails and another follows (`RecordStepAttemptOp`:
it is visible while it retries, with its attempts so far and its last error) and with
its outcome (`RecordStepOp.history`, in the record's transaction); a step that
succeeds at its first attempt costs no write beyond its record's. One row per name in
a run: a name used again after a checkpoint replaces its row. Bounded: a checkpoint
and the run's end keep the run's newest `STEP_HISTORY_PER_RUN` rows; retention purges
the rest with the run. Texts are cut (`STEP_RESULT_CHARS`, `STEP_ERROR_CHARS`, the
traceback's last `STEP_TRACEBACK_CHARS`) and made storable (`storable_text`).
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ._ops_outbox import Send, write_sends
from ._rows import Row
from ._txn import Fence, Fenced, Txn

__all__ = ["STEP_ERROR_CHARS", "STEP_HISTORY_PER_RUN", "STEP_RESULT_CHARS",
           "STEP_TRACEBACK_CHARS", "RecordStepAttemptOp", "RecordStepOp", "StepAttempts",
           "StepRecord", "StepStatus", "forget_run_steps", "forget_steps", "run_steps",
           "step_history", "storable_text"]

STEP_HISTORY_PER_RUN = 1000
"""A run's newest steps kept in history (after each checkpoint and at the run's end)."""
STEP_RESULT_CHARS = 1000
"""Characters of a step's result JSON kept in history (its summary)."""
STEP_ERROR_CHARS = 2000
"""Characters of a step's last error kept in history (and in its record)."""
STEP_TRACEBACK_CHARS = 16_000
"""Characters of a step's last traceback kept in history: its end, where the error is."""

StepStatus = Literal["retrying", "completed", "failed", "interrupted"]
"""A step in history: an attempt failed and another follows; it succeeded; its
attempts ran out; its run ended while it retried (terminated, say)."""
_STATUSES = frozenset(typing.get_args(StepStatus))


def storable_text(text: str, limit: int, *, tail: bool = False) -> str:
    """`text` as both engines store it, at most about `limit` characters: lone
    surrogates and NUL written as escapes (neither UTF-8 nor PostgreSQL's text takes
    them), then cut, keeping its head (or with `tail`, its end), with a note saying how
    much was cut."""
    clean = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    if len(clean) <= limit:
        return clean
    cut = len(clean) - limit
    if tail:
        return f"[... {cut:,} characters cut]\n{clean[-limit:]}"
    return f"{clean[:limit]} [... {cut:,} characters cut]"


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
class StepAttempts:
    """One step of a run as its history keeps it (`step_history`).

    Attributes:
        run_id, name: the run and the step's name in it.
        status: "retrying" (an attempt failed, another follows), "completed", "failed"
            (its attempts ran out) or "interrupted" (its run ended while it retried).
        attempts: the attempts made so far (by the activation that made them: a host that
            dies while a step retries leaves its count, and its successor counts anew).
        started_at: when its first attempt began; updated_at: when the row was written
            (the outcome's time once it completed or failed).
        result: the start of its result's JSON (`STEP_RESULT_CHARS`), once completed.
        error, traceback: its last failed attempt's error ("Type: message") and the end
            of its traceback (`STEP_TRACEBACK_CHARS`); None if no attempt failed.
        ray_task: its last attempt ran as a Ray task; node: that task's Ray node id.
    """

    run_id: int
    name: str
    status: StepStatus
    attempts: int
    started_at: float
    updated_at: float
    result: str | None = None
    error: str | None = None
    traceback: str | None = None
    ray_task: bool = False
    node: str | None = None


_UPSERT_HISTORY = (
    "INSERT INTO step_history (etype, key, run_id, name, status, attempts, started_at, "
    "updated_at, result, error, traceback, ray_task, node) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (etype, key, run_id, name) DO UPDATE SET status = excluded.status, "
    "attempts = excluded.attempts, updated_at = excluded.updated_at, "
    # A step still retrying keeps its first start (a successor host retries it on);
    # a name used again after a checkpoint starts anew.
    "started_at = CASE WHEN step_history.status = 'retrying' "
    "THEN step_history.started_at ELSE excluded.started_at END, "
    "result = excluded.result, error = excluded.error, traceback = excluded.traceback, "
    "ray_task = excluded.ray_task, node = excluded.node")


async def write_step_history(txn: Txn, etype: str, key: str, h: StepAttempts) -> None:
    """Write (or replace) the history row of step `h.name` of run `h.run_id`."""
    await txn.execute(_UPSERT_HISTORY, etype, key, h.run_id, h.name, h.status, h.attempts,
                      h.started_at, h.updated_at, h.result, h.error, h.traceback,
                      h.ray_task, h.node)


@dataclass(frozen=True, slots=True)
class RecordStepAttemptOp(Fenced):
    """An attempt of a step failed and another follows: its history row says so, while
    its run is running (a run that ended meanwhile marked its steps interrupted, and a
    step retrying in it is about to be cancelled)."""

    fence: Fence
    entity_type: str
    key: str
    history: StepAttempts

    async def apply(self, txn: Txn) -> None:
        await txn.check(self.fence)
        if await txn.fetchone(
                "SELECT 1 FROM entities WHERE etype = ? AND key = ? AND run_id = ? "
                "AND status = 'running'", self.entity_type, self.key, self.history.run_id):
            await write_step_history(txn, self.entity_type, self.key, self.history)


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
    history: StepAttempts | None = None  # the step's row in history, with its outcome

    async def apply(self, txn: Txn) -> None:
        await txn.check(self.fence)
        r = self.record
        await txn.execute(
            "INSERT INTO steps (etype, key, run_id, name, ok, result, error, attempts, "
            "recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (etype, key, run_id, name) DO NOTHING",
            self.entity_type, self.key, self.run_id, r.name, r.ok, r.result, r.error,
            r.attempts, r.recorded_at)
        if self.history is not None:
            await write_step_history(txn, self.entity_type, self.key, self.history)
        await write_sends(txn, self.fence.shard, self.entity_type, self.key, self.run_id,
                          self.sends)


async def forget_steps(txn: Txn, etype: str, key: str, run_id: int,
                       names: Sequence[str]) -> None:
    """Delete the records of `names` (a checkpoint covers them); bound the run's
    history (`trim_step_history`)."""
    await txn.executemany(
        "DELETE FROM steps WHERE etype = ? AND key = ? AND run_id = ? AND name = ?",
        [(etype, key, run_id, name) for name in names])
    await trim_step_history(txn, etype, key, run_id)


async def forget_run_steps(txn: Txn, etype: str, key: str, run_id: int) -> None:
    """The run ended: delete its step records (and any older run's); its steps still
    retrying are interrupted; bound its history (`trim_step_history`)."""
    await txn.execute("DELETE FROM steps WHERE etype = ? AND key = ? AND run_id <= ?",
                      etype, key, run_id)
    # A step still retrying never will: its history says so, not "retrying" for ever.
    await txn.execute("UPDATE step_history SET status = 'interrupted' WHERE etype = ? "
                      "AND key = ? AND run_id = ? AND status = 'retrying'", etype, key, run_id)
    await trim_step_history(txn, etype, key, run_id)


async def trim_step_history(txn: Txn, etype: str, key: str, run_id: int,
                            keep: int = STEP_HISTORY_PER_RUN) -> None:
    """Keep the run's newest `keep` steps in history (by first start; ties at the
    boundary are kept): a read of the run's rows (by its key), a no-op below `keep`."""
    await txn.execute(
        "DELETE FROM step_history WHERE etype = ? AND key = ? AND run_id = ? "
        "AND started_at < (SELECT started_at FROM step_history WHERE etype = ? AND key = ? "
        "AND run_id = ? ORDER BY started_at DESC LIMIT 1 OFFSET ?)",
        etype, key, run_id, etype, key, run_id, keep - 1)


async def run_steps(q: Txn, etype: str, key: str, run_id: int) -> dict[str, StepRecord]:
    """The recorded steps of the run, by name."""
    rows = await q.fetchall(
        "SELECT name, ok, result, error, attempts, recorded_at FROM steps "
        "WHERE etype = ? AND key = ? AND run_id = ?", etype, key, run_id)
    return {str(r[0]): StepRecord(str(r[0]), bool(r[1]), r[2], r[3], int(r[4]), float(r[5]))
            for r in rows}


async def step_history(q: Txn, etype: str, key: str, limit: int) -> list[StepAttempts]:
    """The entity's newest `limit` steps in history, oldest first (by run, then start)."""
    rows = await q.fetchall(
        "SELECT run_id, name, status, attempts, started_at, updated_at, result, error, "
        "traceback, ray_task, node FROM step_history WHERE etype = ? AND key = ? "
        "ORDER BY run_id DESC, started_at DESC, name DESC LIMIT ?", etype, key, limit)
    return [_step_from_row(etype, key, r) for r in reversed(rows)]


def _step_from_row(etype: str, key: str, r: Sequence[object]) -> StepAttempts:
    """A `step_history` row, each column checked (`CorruptRowError` if damaged)."""
    run_id = r[0] if isinstance(r[0], int) else 0
    row = Row("step_history", etype, key, run_id, what=f"step {r[1]!r}")

    def text(column: str, value: object) -> str | None:
        return None if value is None else row.text(column, value)
    status = row.text("status", r[2])
    if status not in _STATUSES:
        raise row.corrupt("status", f"is {status!r}, not one of {', '.join(sorted(_STATUSES))}")
    return StepAttempts(
        row.integer("run_id", r[0]), row.text("name", r[1]), status,  # type: ignore[arg-type]
        row.integer("attempts", r[3]), row.seconds("started_at", r[4]),
        row.seconds("updated_at", r[5]), text("result", r[6]), text("error", r[7]),
        text("traceback", r[8]), bool(r[9]), text("node", r[10]))
