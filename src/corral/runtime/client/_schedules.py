"""`rt.schedules`: create, change and read schedules (`corral.Schedule`).

A schedule is store data: creating one writes a row, and whichever host holds the
target entity's shard fires its ticks (`host._schedules`). Every call is checked at the
boundary like a signal (the target's handler, payload and start input, through the
entity's models) and asked of the `authorize` hook as kind "schedule" with the
operation as `name` ("create", "update", "pause", "resume", "delete", "trigger",
"backfill"); reads are kind "read", name "schedules". Nothing is stored when a check
fails.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ValidationError

from corral._errors import InvalidArgumentError, ScheduleNotFoundError
from corral._schedule_spec import (
    Calendar,
    Cron,
    Interval,
    Overlap,
    Schedule,
    ScheduleAction,
    next_tick,
)
from corral.actors import Entity, HandlerKind
from corral.actors._definition import MailboxHandler
from corral.persistence import ScheduleRow

from .._clock import Clock
from ._backend import Backend
from ._boundary import Boundary, check_limit, new_message_id
from ._ref import EntityRef
from ._requests import ScheduleCall

__all__ = ["BackfillResult", "ScheduleInfo", "ScheduleOutcome", "Schedules"]

E = TypeVar("E", bound=Entity)
S = TypeVar("S")
P = TypeVar("P", bound=BaseModel)
_SIGNAL = (HandlerKind.SIGNAL,)
_MAX_ID = 200  # characters of a schedule id (its ticks' message ids add ~30)
_NEXT_TICKS = 5  # upcoming ticks `describe` lists
BACKFILL_LIMIT = 10_000
"""Ticks one `backfill` call delivers at most."""


class _NoStart:
    """`start` not given: the schedule sends a plain signal."""

    def __repr__(self) -> str:
        return "NO_START"


NO_START = _NoStart()


@dataclass(frozen=True, slots=True)
class ScheduleOutcome:
    """What became of a tick (or of ticks skipped together): `outcome` is "accepted",
    "started" (the signal started a run), "duplicate" (delivered before), "refused"
    (with the reason in `detail`) or "skipped" (`detail` says how many and why).
    `tick` is None for a trigger or a skip record."""

    tick: str | None
    at: float
    outcome: str
    detail: str
    message_id: str | None


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule as stored, with its progress: `next_ticks` (epoch seconds, jitter
    not included), the counts of ticks fired and skipped, and the newest outcomes.

    Another record than the store's `ScheduleRow`: it leaves out the firing's
    bookkeeping (shard, due time with jitter, version, the previous tick's run and
    seq), types the outcomes (`ScheduleOutcome`) and adds the next ticks."""

    id: str
    schedule: Schedule
    next_ticks: tuple[float, ...]
    buffered: float | None
    fired: int
    skipped: int
    last_tick: float | None
    outcomes: tuple[ScheduleOutcome, ...]
    created_at: float
    updated_at: float

    @property
    def paused(self) -> bool:
        return self.schedule.paused


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """A backfill's or trigger's outcome per tick, in order ("accepted", "started",
    "duplicate" or "refused")."""

    outcomes: tuple[str, ...]

    @property
    def delivered(self) -> int:
        """Ticks delivered by this call (duplicates were delivered before)."""
        return sum(o in ("accepted", "started") for o in self.outcomes)


def info(row: ScheduleRow, *, upcoming: int = _NEXT_TICKS) -> ScheduleInfo:
    """The row as `ScheduleInfo`, with its next `upcoming` ticks."""
    s = row.schedule
    ticks: list[float] = []
    t = None if s.paused else row.next_tick
    while t is not None and len(ticks) < upcoming and (s.end_at is None or t <= s.end_at) \
            and (s.max_ticks is None or row.fired + len(ticks) < s.max_ticks):
        ticks.append(float(t))
        t = next_tick(s.spec, t)
    return ScheduleInfo(
        row.id, s, tuple(ticks), None if row.buffered is None else float(row.buffered),
        row.fired, row.skipped, None if row.last_tick is None else float(row.last_tick),
        tuple(ScheduleOutcome(o.get("tick"), float(o.get("at", 0.0)), str(o.get("outcome")),
                              str(o.get("detail", "")), o.get("message_id"))
              for o in reversed(row.outcomes)),
        row.created_at, row.updated_at)


class Schedules:
    """The schedules of a deployment (`Runtime.schedules`).

    Example:
        await rt.schedules.create(
            "escalate-ticket-9104", rt.ref(Ticket, "ticket-9104"), Ticket.escalate,
            Escalate(level=1), spec=corral.Cron("0 0 9 * * mon-fri",
                                                time_zone="Europe/Paris"))
    """

    def __init__(self, backend: Backend, boundary: Boundary, clock: Clock) -> None:
        self._backend = backend
        self._boundary = boundary
        self._clock = clock

    async def _call(self, method: str, *args: Any, target: ScheduleRow | None = None
                    ) -> Any:
        """`method` of the store (`ScheduleStore`) through the backend: in this process
        (local), or by a host actor (Ray). A `target` row's shard answers (its holder
        routes what a trigger or backfill accepted)."""
        a = None if target is None else target.schedule.action
        return await self._backend.handle(ScheduleCall(
            method, args, None if target is None else target.shard,
            None if a is None else a.entity_type, None if a is None else a.key))

    # -- writes -----------------------------------------------------------------------

    @overload
    async def create(self, schedule_id: str, ref: EntityRef[E, S],
                     handler: Callable[[E], object], payload: None = None, *,
                     spec: Cron | Interval | Calendar, start: S | dict[str, Any] | _NoStart = ...,
                     overlap: Overlap = ..., catchup_window: float = ..., jitter: float = ...,
                     end_at: float | dt.datetime | None = ..., max_ticks: int | None = ...,
                     note: str = ..., paused: bool = ..., sender: str | None = ...
                     ) -> ScheduleInfo: ...
    @overload
    async def create(self, schedule_id: str, ref: EntityRef[E, S],
                     handler: Callable[[E, P], object], payload: P | dict[str, Any], *,
                     spec: Cron | Interval | Calendar, start: S | dict[str, Any] | _NoStart = ...,
                     overlap: Overlap = ..., catchup_window: float = ..., jitter: float = ...,
                     end_at: float | dt.datetime | None = ..., max_ticks: int | None = ...,
                     note: str = ..., paused: bool = ..., sender: str | None = ...
                     ) -> ScheduleInfo: ...
    @overload
    async def create(self, schedule_id: str, ref: EntityRef[E, S],
                     handler: MailboxHandler[E, P], payload: P | dict[str, Any], *,
                     spec: Cron | Interval | Calendar, start: S | dict[str, Any] | _NoStart = ...,
                     overlap: Overlap = ..., catchup_window: float = ..., jitter: float = ...,
                     end_at: float | dt.datetime | None = ..., max_ticks: int | None = ...,
                     note: str = ..., paused: bool = ..., sender: str | None = ...
                     ) -> ScheduleInfo: ...
    async def create(self, schedule_id: str, ref: EntityRef[Any, Any], handler: Any,
                     payload: Any = None, *, spec: Cron | Interval | Calendar,
                     start: Any = NO_START, overlap: Overlap = Overlap.SKIP,
                     catchup_window: float = 300.0, jitter: float = 0.0,
                     end_at: float | dt.datetime | None = None, max_ticks: int | None = None,
                     note: str = "", paused: bool = False, sender: str | None = None
                     ) -> ScheduleInfo:
        """Create the schedule `schedule_id`: on each tick of `spec`, signal `handler`
        with `payload` to `ref`'s entity (with `start`: signal-with-start, else a plain
        signal, refused and recorded while the entity is not running). Its first tick
        is the first after now. `ScheduleExistsError` if the id is taken."""
        return await self._put("create", schedule_id, ref, handler, payload, spec, start,
                               overlap, catchup_window, jitter, end_at, max_ticks, note,
                               paused, sender)

    @overload
    async def update(self, schedule_id: str, ref: EntityRef[E, S],
                     handler: Callable[[E], object], payload: None = None, *,
                     spec: Cron | Interval | Calendar, start: S | dict[str, Any] | _NoStart = ...,
                     overlap: Overlap = ..., catchup_window: float = ..., jitter: float = ...,
                     end_at: float | dt.datetime | None = ..., max_ticks: int | None = ...,
                     note: str = ..., paused: bool = ..., sender: str | None = ...
                     ) -> ScheduleInfo: ...
    @overload
    async def update(self, schedule_id: str, ref: EntityRef[E, S],
                     handler: Callable[[E, P], object], payload: P | dict[str, Any], *,
                     spec: Cron | Interval | Calendar, start: S | dict[str, Any] | _NoStart = ...,
                     overlap: Overlap = ..., catchup_window: float = ..., jitter: float = ...,
                     end_at: float | dt.datetime | None = ..., max_ticks: int | None = ...,
                     note: str = ..., paused: bool = ..., sender: str | None = ...
                     ) -> ScheduleInfo: ...
    @overload
    async def update(self, schedule_id: str, ref: EntityRef[E, S],
                     handler: MailboxHandler[E, P], payload: P | dict[str, Any], *,
                     spec: Cron | Interval | Calendar, start: S | dict[str, Any] | _NoStart = ...,
                     overlap: Overlap = ..., catchup_window: float = ..., jitter: float = ...,
                     end_at: float | dt.datetime | None = ..., max_ticks: int | None = ...,
                     note: str = ..., paused: bool = ..., sender: str | None = ...
                     ) -> ScheduleInfo: ...
    async def update(self, schedule_id: str, ref: EntityRef[Any, Any], handler: Any,
                     payload: Any = None, *, spec: Cron | Interval | Calendar,
                     start: Any = NO_START, overlap: Overlap = Overlap.SKIP,
                     catchup_window: float = 300.0, jitter: float = 0.0,
                     end_at: float | dt.datetime | None = None, max_ticks: int | None = None,
                     note: str = "", paused: bool = False, sender: str | None = None
                     ) -> ScheduleInfo:
        """Replace the schedule's definition (as `create` takes it); its counts and
        outcomes stay, its next tick is the first after now. `ScheduleNotFoundError`."""
        return await self._put("update", schedule_id, ref, handler, payload, spec, start,
                               overlap, catchup_window, jitter, end_at, max_ticks, note,
                               paused, sender)

    async def pause(self, schedule_id: str, *, sender: str | None = None) -> ScheduleInfo:
        """Stop firing; ticks due while paused are skipped, never caught up."""
        return await self._pause(schedule_id, True, sender)

    async def resume(self, schedule_id: str, *, sender: str | None = None) -> ScheduleInfo:
        """Fire again, from the first tick after now."""
        return await self._pause(schedule_id, False, sender)

    async def delete(self, schedule_id: str, *, sender: str | None = None) -> bool:
        """Delete the schedule (ticks delivered stay delivered); whether it existed."""
        row = await self._row(schedule_id)
        await self._authorize(row, "delete", sender)
        return bool(await self._call("delete_schedule", row.id))

    async def trigger(self, schedule_id: str, *, token: str | None = None,
                      sender: str | None = None) -> BackfillResult:
        """Deliver the schedule's action now, whatever its spec, pause and overlap
        policy. `token` makes it idempotent: the same token delivers once (its message
        id is derived from it); a new one is made when None."""
        row = await self._row(schedule_id)
        await self._authorize(row, "trigger", sender)
        b = self._boundary
        mark = new_message_id() if token is None else b.check_identifier(token, "token")
        fired = await self._call("trigger_schedule", row, mark, self._now(), target=row)
        return BackfillResult(fired.outcomes)

    async def backfill(self, schedule_id: str, start: float | dt.datetime,
                       end: float | dt.datetime, *, sender: str | None = None
                       ) -> BackfillResult:
        """Deliver the schedule's ticks from `start` to `end` (both included; at most
        `BACKFILL_LIMIT`), each with its tick's own message id: a tick delivered before
        (fired, or backfilled) is answered duplicate, never delivered twice."""
        row = await self._row(schedule_id)
        await self._authorize(row, "backfill", sender)
        first, last = _epoch(start, "start"), _epoch(end, "end")
        if last < first:
            raise InvalidArgumentError(f"backfill end ({last}) is before its start ({first})")
        fired = await self._call("backfill_schedule", row, first, last, BACKFILL_LIMIT,
                                 self._now(), target=row)
        return BackfillResult(fired.outcomes)

    # -- reads ------------------------------------------------------------------------

    async def describe(self, schedule_id: str, *, sender: str | None = None) -> ScheduleInfo:
        """The schedule, its next ticks and newest outcomes; `ScheduleNotFoundError`."""
        await self._boundary.permit(sender, "", "", "read", "schedules")
        return info(await self._row(schedule_id))

    async def list(self, *, after: str = "", limit: int = 100,
                   sender: str | None = None) -> list[ScheduleInfo]:
        """Schedules by id, from the first after `after` (pages of `limit`)."""
        await self._boundary.permit(sender, "", "", "read", "schedules")
        if after:
            after = self._boundary.check_identifier(after, "after")
        rows = await self._call("schedules", after, check_limit(limit))
        return [info(r) for r in rows]

    # -- the boundary -----------------------------------------------------------------

    def _now(self) -> float:
        return self._clock.time()

    def _check_id(self, schedule_id: object) -> str:
        sid = self._boundary.check_identifier(schedule_id, "schedule id")
        if len(sid) > _MAX_ID:
            raise InvalidArgumentError(f"a schedule id has at most {_MAX_ID} characters, "
                                       f"got {len(sid)}")
        return sid

    async def _row(self, schedule_id: object) -> ScheduleRow:
        sid = self._check_id(schedule_id)
        row: ScheduleRow | None = await self._call("schedule", sid)
        if row is None:
            raise ScheduleNotFoundError(f"no schedule {sid!r}", schedule_id=sid)
        return row

    async def _authorize(self, row: ScheduleRow, operation: str, sender: str | None) -> None:
        a = row.schedule.action
        await self._boundary.permit(sender, a.entity_type, a.key, "schedule", operation)

    async def _pause(self, schedule_id: str, paused: bool, sender: str | None
                     ) -> ScheduleInfo:
        row = await self._row(schedule_id)
        await self._authorize(row, "pause" if paused else "resume", sender)
        return info(await self._call("pause_schedule", row.id, paused, self._now()))

    async def _put(self, operation: str, schedule_id: str, ref: EntityRef[Any, Any],
                   handler: Any, payload: Any, spec: Any, start: Any, overlap: Any,
                   catchup_window: Any, jitter: Any, end_at: Any, max_ticks: Any, note: Any,
                   paused: Any, sender: str | None) -> ScheduleInfo:
        sid = self._check_id(schedule_id)
        if not isinstance(ref, EntityRef):
            raise InvalidArgumentError(f"a schedule's target is an EntityRef "
                                       f"(rt.ref(Type, key)), got {type(ref).__name__}")
        b, d = self._boundary, ref.definition
        h = b.handler(d, handler, _SIGNAL)
        text = b.payload(h, payload)
        start_text = None if isinstance(start, _NoStart) else b.start_input(d, start)
        if isinstance(note, str) and any(
                (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0 for c in note):
            raise InvalidArgumentError(f"schedule {sid!r}: its note has a control character")
        await b.permit(sender, d.name, ref.key, "schedule", operation)
        action = ScheduleAction(entity_type=d.name, key=ref.key, signal=h.name, payload=text,
                                start=start_text, id_reuse=d.id_reuse.value)
        try:
            schedule = Schedule(
                spec=spec, action=action, overlap=Overlap(overlap),
                catchup_window=catchup_window, jitter=jitter,
                end_at=None if end_at is None else _epoch(end_at, "end_at"),
                max_ticks=max_ticks, note=note, paused=paused)
        except (ValidationError, ValueError) as err:
            raise InvalidArgumentError(f"schedule {sid!r}: {err}") from None
        if next_tick(schedule.spec, math.floor(self._now())) is None:
            raise InvalidArgumentError(f"schedule {sid!r}: its spec never ticks")
        return info(await self._call("put_schedule", sid, ref.shard, schedule, self._now(),
                                     operation == "create"))


def _epoch(when: object, what: str) -> float:
    if isinstance(when, dt.datetime):
        if when.tzinfo is None:
            raise InvalidArgumentError(f"{what}: a datetime with a time zone, got a naive one")
        return when.timestamp()
    if isinstance(when, bool) or not isinstance(when, int | float) or not math.isfinite(when):
        raise InvalidArgumentError(f"{what}: epoch seconds or a datetime, got {when!r:.80}")
    return float(when)

