"""Schedules in the store (`corral.Schedule`): their rows, the writes clients make
(put, pause, delete, trigger, backfill) and the fenced firing of the host that holds
the target entity's shard (`FireOp`).

A tick's signal carries a message id derived from the schedule and the tick,
`schedule:<id>@<tick in UTC>` (`tick_message_id`), so whatever delivers it twice (a
round repeated after its commit's outcome was unknown, a backfill of a tick that had
fired) is a duplicate at the entity, by its dedupe window. Firing is one transaction:
the holder's fence is checked, the schedule's row is claimed at the version the holder
read (a client's write in between makes the round look again), the due ticks are
decided (`_schedule_plan.decide`), each is accepted into the entity (a refusal, such as
a plain signal to an entity that is not running, is recorded as the tick's outcome) and
the row moves to its next tick, so a crash either fires a tick and advances, or does
neither.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from corral._common import IdReusePolicy, RunStatus
from corral._errors import (
    BatchRefusedError,
    CorruptRowError,
    ScheduleExistsError,
    ScheduleNotFoundError,
)
from corral._schedule_spec import Overlap, Schedule, next_tick, tick_text

from ._codec import payload_hash
from ._ops_accept import AcceptAllOp
from ._records import Acceptance, AcceptResult, EntryKind
from ._schedule_plan import BUFFER_RECHECK, decide, due_at
from ._txn import Fence, Fenced, LockPlan, Txn

__all__ = ["OUTCOMES_KEPT", "BackfillOp", "DeleteScheduleOp", "DueSchedule", "FireOp", "Fired",
           "PauseScheduleOp", "PutScheduleOp", "ScheduleRow", "TriggerOp", "due_schedules",
           "first_tick", "next_schedule_due", "schedule_row", "schedule_rows",
           "tick_message_id", "trigger_message_id"]

log = logging.getLogger("corral.schedules")
OUTCOMES_KEPT = 20  # a schedule's newest outcomes, kept on its row
_FIELDS = ("id, shard, target_type, target_key, definition, next_tick, due_at, buffered, "
           "fired, skipped, last_tick, last_run, last_seq, outcomes, version, created_at, "
           "updated_at")


def tick_message_id(sid: str, tick: int) -> str:
    """The message id of the schedule's tick: the same on every host and every retry."""
    return f"schedule:{sid}@{tick_text(tick)}"


def trigger_message_id(sid: str, token: str) -> str:
    """The message id of a manual trigger of the schedule (`token`: its idempotency key)."""
    return f"schedule:{sid}!{token}"


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """A schedule as stored: its definition and progress (see `_tables`, "schedules")."""

    id: str
    shard: int
    schedule: Schedule
    next_tick: int | None
    due_at: float | None
    buffered: int | None
    fired: int
    skipped: int
    last_tick: int | None
    last_run: int | None
    last_seq: int | None
    outcomes: tuple[dict[str, Any], ...]
    version: int
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class DueSchedule:
    """A schedule due on a shard, as its holder's round reads it."""

    id: str
    shard: int
    entity_type: str
    key: str
    version: int


@dataclass(frozen=True, slots=True)
class Fired:
    """What a firing did: the acceptances it made (for the host to route), the ticks it
    fired with their lateness (seconds past the tick), the ticks skipped; `raced`: the
    row changed since the round read it (nothing done)."""

    accepted: tuple[tuple[AcceptResult, str | None], ...] = ()
    late: tuple[float, ...] = ()
    outcomes: tuple[str, ...] = ()
    missed: int = 0
    overlapped: int = 0
    raced: bool = False


def _row(r: Sequence[Any]) -> ScheduleRow:
    """A schedule's row; `CorruptRowError` naming it if it does not decode (damaged or
    written by hand), so one bad row fails only its own op, never its batch."""
    try:
        return _decoded(r)
    except (ValueError, TypeError, RecursionError, orjson.JSONDecodeError) as err:
        raise CorruptRowError(f"schedule {str(r[0])!r:.200}: its row does not decode "
                              f"({type(err).__name__}: {str(err)[:200]}); fix or delete it",
                              table="schedules", column="definition") from None


def _decoded(r: Sequence[Any]) -> ScheduleRow:
    return ScheduleRow(
        str(r[0]), int(r[1]), Schedule.model_validate_json(r[4]),
        None if r[5] is None else int(r[5]), None if r[6] is None else float(r[6]),
        None if r[7] is None else int(r[7]), int(r[8]), int(r[9]),
        None if r[10] is None else int(r[10]), None if r[11] is None else int(r[11]),
        None if r[12] is None else int(r[12]), tuple(orjson.loads(r[13])), int(r[14]),
        float(r[15]), float(r[16]))


async def schedule_row(q: Txn, sid: str) -> ScheduleRow | None:
    r = await q.fetchone(f"SELECT {_FIELDS} FROM schedules WHERE id = ?", sid)
    return None if r is None else _row(r)


async def schedule_rows(q: Txn, after: str, limit: int) -> list[ScheduleRow]:
    """Schedules by id, from the first after `after` (a page); a row that does not
    decode is left out, with a warning naming it (`describe` raises for it)."""
    rows = await q.fetchall(f"SELECT {_FIELDS} FROM schedules WHERE id > ? ORDER BY id "
                            "LIMIT ?", after, limit)
    found = []
    for r in rows:
        try:
            found.append(_row(r))
        except CorruptRowError as err:
            log.warning("%s", err)
    return found


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" * len(values))


async def due_schedules(q: Txn, shards: frozenset[int], now: float, limit: int
                        ) -> list[DueSchedule]:
    """The schedules of `shards` due by `now`, earliest first: a seek of `schedules_due`."""
    if not shards:
        return []
    rows = await q.fetchall(
        f"SELECT id, shard, target_type, target_key, version FROM schedules WHERE shard IN "
        f"({_marks(sorted(shards))}) AND due_at <= ? ORDER BY due_at LIMIT ?",
        *sorted(shards), now, limit)
    return [DueSchedule(str(r[0]), int(r[1]), str(r[2]), str(r[3]), int(r[4])) for r in rows]


async def next_schedule_due(q: Txn, shards: frozenset[int]) -> float | None:
    """When the earliest schedule of `shards` is due (None: none is)."""
    if not shards:
        return None
    row = await q.fetchone(f"SELECT min(due_at) FROM schedules WHERE shard IN "
                           f"({_marks(sorted(shards))})", *sorted(shards))
    return None if row is None or row[0] is None else float(row[0])


def _outcome(tick: int | None, at: float, outcome: str, detail: str = "",
             message_id: str | None = None) -> dict[str, Any]:
    return {"tick": None if tick is None else tick_text(tick), "at": at, "outcome": outcome,
            "detail": detail, "message_id": message_id}


def _kept(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> str:
    return orjson.dumps([*old, *new][-OUTCOMES_KEPT:]).decode()


def first_tick(s: Schedule, after: float) -> int | None:
    """The schedule's first tick after `after` (a new, updated or resumed schedule's)."""
    return next_tick(s.spec, math.floor(after))


@dataclass(frozen=True, slots=True)
class PutScheduleOp:
    """Create the schedule `sid` (`create`: refused with `ScheduleExistsError` if it
    exists) or replace its definition (`ScheduleNotFoundError` if it does not). Its next
    tick is the first after `now` (a replaced one's, after its last tick too): the ticks
    in between are not caught up."""

    sid: str
    shard: int
    schedule: Schedule
    now: float
    create: bool
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        pass

    async def apply(self, txn: Txn) -> ScheduleRow:
        s, text = self.schedule, self.schedule.model_dump_json()
        try:
            old = await schedule_row(txn, self.sid)
        except CorruptRowError:
            if self.create:
                raise ScheduleExistsError(f"schedule {self.sid!r} exists (its row does not "
                                          "decode): update it or delete it",
                                          schedule_id=self.sid) from None
            await txn.execute("DELETE FROM schedules WHERE id = ?", self.sid)  # replaced
            return await PutScheduleOp(self.sid, self.shard, s, self.now, True).apply(txn)
        if self.create and old is not None:
            raise ScheduleExistsError(f"schedule {self.sid!r} exists; update it or delete it "
                                      "first", schedule_id=self.sid)
        if not self.create and old is None:
            raise ScheduleNotFoundError(f"no schedule {self.sid!r}", schedule_id=self.sid)
        after = self.now if old is None or old.last_tick is None else max(self.now,
                                                                          old.last_tick)
        nxt = first_tick(s, after)
        due = due_at(self.sid, s, nxt, None, self.now)
        if old is None:
            await txn.execute(
                f"INSERT INTO schedules ({_FIELDS}) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, NULL, 0, 0, NULL, NULL, NULL, '[]', 1, ?, ?)",
                self.sid, self.shard, s.action.entity_type, s.action.key, text, nxt, due,
                self.now, self.now)
        else:
            same = (old.schedule.action.entity_type, old.schedule.action.key) == (
                s.action.entity_type, s.action.key)
            await txn.execute(
                "UPDATE schedules SET shard = ?, target_type = ?, target_key = ?, definition = ?, "
                "next_tick = ?, due_at = ?, buffered = NULL, last_run = ?, last_seq = ?, "
                "version = version + 1, updated_at = ? WHERE id = ?",
                self.shard, s.action.entity_type, s.action.key, text, nxt, due,
                old.last_run if same else None, old.last_seq if same else None,
                self.now, self.sid)
        row = await schedule_row(txn, self.sid)
        assert row is not None
        return row


@dataclass(frozen=True, slots=True)
class PauseScheduleOp:
    """Pause the schedule (`paused`: no tick fires; ticks due meanwhile are skipped, not
    caught up) or resume it (its next tick is the first after `now`)."""

    sid: str
    paused: bool
    now: float
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        pass

    async def apply(self, txn: Txn) -> ScheduleRow:
        row = await _claim(txn, self.sid)
        s = row.schedule.model_copy(update={"paused": self.paused})
        nxt = row.next_tick if self.paused else first_tick(s, self.now)
        await txn.execute("UPDATE schedules SET definition = ?, next_tick = ?, due_at = ?, "
                          "buffered = NULL, updated_at = ? WHERE id = ?",
                          s.model_dump_json(), nxt, due_at(self.sid, s, nxt, None, self.now),
                          self.now, self.sid)
        updated = await schedule_row(txn, self.sid)
        assert updated is not None
        return updated


@dataclass(frozen=True, slots=True)
class DeleteScheduleOp:
    """Delete the schedule (its ticks already delivered stay delivered); whether it was."""

    sid: str
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        pass

    async def apply(self, txn: Txn) -> bool:
        return await txn.execute("DELETE FROM schedules WHERE id = ?", self.sid) > 0


async def _pending(txn: Txn, row: ScheduleRow, applied: int | None) -> bool | None:
    """Whether the previous tick's signal is not applied yet: its run still runs and
    neither the host's activation (`applied`) nor the run's latest snapshot is past it.
    None: not known yet (the entity is not resident and no snapshot covers the tick:
    after a takeover, before the shard's recovery loads it)."""
    if row.last_seq is None or row.last_run is None \
            or row.schedule.overlap is Overlap.ALLOW:
        return False
    a = row.schedule.action
    entity = await txn.entity(a.entity_type, a.key)
    if entity is None or entity.status is not RunStatus.RUNNING \
            or entity.run_id != row.last_run:
        return False
    snap = await txn.fetchone("SELECT max(applied_seq) FROM snapshots WHERE etype = ? AND "
                              "key = ? AND run_id = ?", a.entity_type, a.key, row.last_run)
    seen = max(applied or 0, int(snap[0]) if snap is not None and snap[0] is not None else 0)
    if seen >= row.last_seq:
        return False
    return True if applied is not None else None


@dataclass
class _Delivery:
    """The acceptances of one write, and their outcomes."""

    row: ScheduleRow
    now: float
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    accepted: list[tuple[AcceptResult, str | None]] = field(default_factory=list)
    last: tuple[int, int] | None = None  # (run, seq) of the last tick delivered

    async def deliver(self, txn: Txn, tick: int | None, message_id: str) -> str:
        """Accept the action with `message_id`; its outcome (`accepted`, `started`,
        `duplicate`, or `refused`, recorded with the reason)."""
        acc = _acceptance(self.row, message_id, self.now)
        try:
            result = (await AcceptAllOp([acc]).apply(txn))[0]
        except BatchRefusedError as refused:
            err = refused.error or refused
            self.outcomes.append(_outcome(tick, self.now, "refused",
                                          f"{type(err).__name__}: {err}", message_id))
            return "refused"
        what = "duplicate" if result.duplicate else "started" if result.started else "accepted"
        self.outcomes.append(_outcome(tick, self.now, what, "", message_id))
        self.accepted.append((result, acc.start))
        self.last = (result.entry.run_id, result.entry.seq)
        return what


def _acceptance(row: ScheduleRow, message_id: str, now: float) -> Acceptance:
    a = row.schedule.action
    kind = EntryKind.SIGNAL
    return Acceptance(a.entity_type, a.key, row.shard, kind, a.signal, message_id, a.payload,
                      payload_hash(a.signal, a.payload), f"schedule:{row.id}", a.start,
                      IdReusePolicy(a.id_reuse), now)


def _plan_target(plan: LockPlan, shard: int, etype: str, key: str) -> None:
    plan.ticks.add(shard)
    plan.entities.add((etype, key))


@dataclass(frozen=True, slots=True)
class FireOp(Fenced):
    """The holder's round for one due schedule (see the module's docstring): `version`
    as its round read it; `applied`: the target's applied seq as the holder knows it
    (0: not resident; None: not known until the shard's recovery loads it)."""

    fence: Fence
    sid: str
    version: int
    entity_type: str
    key: str
    applied: int | None
    now: float

    def plan(self, plan: LockPlan) -> None:
        Fenced.plan(self, plan)
        _plan_target(plan, self.fence.shard, self.entity_type, self.key)

    async def apply(self, txn: Txn) -> Fired:
        await txn.check(self.fence)
        try:
            row = await schedule_row(txn, self.sid)
        except CorruptRowError as err:  # parked (due_at NULL) until `update` replaces it
            log.warning("%s; it fires no more until updated", err)
            await txn.execute("UPDATE schedules SET due_at = NULL, version = version + 1 "
                              "WHERE id = ? AND version = ?", self.sid, self.version)
            return Fired(raced=True)
        # Claimed at the version read: a write since (a client's, another round's) made
        # it another version, and this round looks again.
        claimed = row is not None and await txn.execute(
            "UPDATE schedules SET version = version + 1 WHERE id = ? AND version = ? "
            "AND shard = ? AND due_at IS NOT NULL", self.sid, self.version, self.fence.shard)
        if row is None or not claimed:
            return Fired(raced=True)
        s = row.schedule
        pending = await _pending(txn, row, self.applied)
        if pending is None:  # look again soon: neither skip nor fire on a guess
            await txn.execute("UPDATE schedules SET due_at = ? WHERE id = ?",
                              self.now + BUFFER_RECHECK, self.sid)
            return Fired()
        d = decide(self.sid, s, next_=row.next_tick, buffered=row.buffered, fired=row.fired,
                   now=self.now, pending=pending)
        run = _Delivery(row, self.now)
        outcomes = [await run.deliver(txn, t, tick_message_id(self.sid, t)) for t in d.fire]
        if d.missed:
            run.outcomes.append(_outcome(None, self.now, "skipped",
                                         f"{d.missed} tick(s) missed, older than the "
                                         f"catch-up window ({s.catchup_window:g}s)"))
        if d.overlapped:
            run.outcomes.append(_outcome(None, self.now, "skipped",
                                         f"{d.overlapped} tick(s) overlapped the previous "
                                         f"tick's signal (overlap {s.overlap.value})"))
        last_run, last_seq = run.last or (row.last_run, row.last_seq)
        await txn.execute(
            "UPDATE schedules SET next_tick = ?, due_at = ?, buffered = ?, fired = ?, "
            "skipped = ?, last_tick = ?, last_run = ?, last_seq = ?, outcomes = ?, "
            "updated_at = ? WHERE id = ?",
            d.next_tick, d.due_at, d.buffered, row.fired + len(d.fire),
            row.skipped + d.missed + d.overlapped,
            d.fire[-1] if d.fire else row.last_tick, last_run, last_seq,
            _kept(row.outcomes, run.outcomes), self.now, self.sid)
        return Fired(tuple(run.accepted), tuple(self.now - t for t in d.fire),
                     tuple(outcomes), d.missed, d.overlapped)


@dataclass(frozen=True, slots=True)
class TriggerOp:
    """Fire the schedule's action now, once per `token` (its message id is derived from
    it), whatever its spec, pause or overlap policy; the outcome is recorded."""

    sid: str
    shard: int
    entity_type: str
    key: str
    token: str
    now: float
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        _plan_target(plan, self.shard, self.entity_type, self.key)

    async def apply(self, txn: Txn) -> Fired:
        row = await _claim(txn, self.sid)
        run = _Delivery(row, self.now)
        outcome = await run.deliver(txn, None, trigger_message_id(self.sid, self.token))
        await _record(txn, run)
        return Fired(tuple(run.accepted), (), (outcome,))


@dataclass(frozen=True, slots=True)
class BackfillOp:
    """Deliver the schedule's ticks from `start` to `end` (epoch seconds, both included),
    each with its own tick's message id: a tick that fired already is a duplicate, so a
    backfill never delivers a tick twice. At most `limit` ticks; overlap is not checked."""

    sid: str
    shard: int
    entity_type: str
    key: str
    start: float
    end: float
    limit: int
    now: float
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        _plan_target(plan, self.shard, self.entity_type, self.key)

    async def apply(self, txn: Txn) -> Fired:
        row = await _claim(txn, self.sid)
        run = _Delivery(row, self.now)
        outcomes: list[str] = []
        t = next_tick(row.schedule.spec, math.ceil(self.start) - 1)
        while t is not None and t <= self.end and len(outcomes) < self.limit:
            outcomes.append(await run.deliver(txn, t, tick_message_id(self.sid, t)))
            t = next_tick(row.schedule.spec, t)
        await _record(txn, run)
        return Fired(tuple(run.accepted), (), tuple(outcomes))


async def _claim(txn: Txn, sid: str) -> ScheduleRow:
    """The schedule's row, its version bumped first (PostgreSQL: the row locked, so a
    concurrent round or client write waits, then sees the new version)."""
    claimed = await txn.execute("UPDATE schedules SET version = version + 1 WHERE id = ?", sid)
    row = await schedule_row(txn, sid) if claimed else None
    if row is None:
        raise ScheduleNotFoundError(f"no schedule {sid!r}", schedule_id=sid)
    return row


async def _record(txn: Txn, run: _Delivery) -> None:
    await txn.execute("UPDATE schedules SET outcomes = ?, updated_at = ? WHERE id = ?",
                      _kept(run.row.outcomes, run.outcomes), run.now, run.row.id)

