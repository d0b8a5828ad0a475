"""A schedule's data (`Schedule`) and when it ticks (`next_tick`): a leaf that the store
(which decides a tick inside its transaction) and the client both import.

A tick is a whole second since the epoch (UTC). Three specs:

- `Cron`: six fields, seconds first (`"0 0 9 * * mon-fri"`), read in a named time zone
  by croniter over wall-clock times. Across a DST change each wall-clock time fires at
  most once: a time the spring-forward gap skips fires at the same instant an hour
  later on the clock (02:30 -> 03:30, and once only if 03:30 also matches); a time the
  fall-back hour repeats fires at its first occurrence only.
- `Interval`: every `every` seconds, at `offset` seconds past each multiple of `every`
  since the epoch (`Interval(every=3600, offset=900)`: at a quarter past each hour, UTC).
- `Calendar`: the cron fields by name, in a time zone (`Calendar(hour="9",
  day_of_week="mon", time_zone="Europe/Paris")`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from enum import Enum
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, croniter
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["Calendar", "Cron", "Interval", "Overlap", "Schedule", "ScheduleAction", "Spec",
           "jitter_of", "next_tick", "tick_text"]

_MODEL = ConfigDict(frozen=True, extra="forbid", strict=True)
_SEARCH = 5_000  # wall-clock candidates a cron tick is looked for among (DST skips a few)


class Overlap(str, Enum):
    """What a tick does while the previous tick's signal is not applied yet.

    A tick's signal is *applied* once the entity's handler (or its mailbox) took it:
    the entity's applied sequence reached the signal's journal entry, in the run the
    tick delivered it to. A run that ended since counts as applied."""

    SKIP = "skip"  # the tick is recorded as skipped (overlap)
    BUFFER_ONE = "buffer_one"  # the newest such tick waits and fires once it is applied
    ALLOW = "allow"  # every tick fires whatever the previous one's state


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as err:
        raise ValueError(f"unknown time zone {name!r:.80}") from err


class Cron(BaseModel):
    """A cron expression with seconds (six fields: second minute hour day-of-month month
    day-of-week), in `time_zone` (an IANA name)."""

    model_config = _MODEL
    kind: Literal["cron"] = "cron"
    expression: str = Field(max_length=200)
    time_zone: str = Field(default="UTC", max_length=64)

    def __init__(self, expression: str, *, time_zone: str = "UTC", **data: Any) -> None:
        super().__init__(expression=expression, time_zone=time_zone, **data)

    @field_validator("expression")
    @classmethod
    def _six_fields(cls, value: str) -> str:
        if len(value.split()) != 6:
            raise ValueError("a cron expression here has six fields, seconds first "
                             f"(second minute hour day month weekday), got {value!r:.80}")
        try:
            croniter(value, dt.datetime(2000, 1, 1), second_at_beginning=True)
        except (CroniterBadCronError, ValueError, KeyError) as err:
            raise ValueError(f"invalid cron expression {value!r:.80}: {err}") from None
        return value

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        _zone(value)
        return value


class Calendar(BaseModel):
    """Cron fields by name (each a cron field: `"9"`, `"*/5"`, `"mon-fri"`), in
    `time_zone`; unset ones fire at second 0, minute 0, hour 0, every day."""

    model_config = _MODEL
    kind: Literal["calendar"] = "calendar"
    second: str = Field(default="0", max_length=60)
    minute: str = Field(default="0", max_length=60)
    hour: str = Field(default="0", max_length=60)
    day_of_month: str = Field(default="*", max_length=60)
    month: str = Field(default="*", max_length=60)
    day_of_week: str = Field(default="*", max_length=60)
    time_zone: str = Field(default="UTC", max_length=64)

    def as_cron(self) -> Cron:
        fields = (self.second, self.minute, self.hour, self.day_of_month, self.month,
                  self.day_of_week)
        if any(not f or len(f.split()) != 1 for f in fields):
            raise ValueError(f"each calendar field is one cron field, got {fields!r:.200}")
        return Cron(expression=" ".join(fields), time_zone=self.time_zone)


class Interval(BaseModel):
    """Every `every` seconds, `offset` seconds past each multiple of `every` since the
    epoch (UTC)."""

    model_config = _MODEL
    kind: Literal["interval"] = "interval"
    every: int = Field(ge=1, le=10 * 366 * 86400)
    offset: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _offset_within(self) -> Interval:
        if self.offset >= self.every:
            raise ValueError(f"offset ({self.offset}) must be less than every ({self.every})")
        return self


Spec = Annotated[Cron | Interval | Calendar, Field(discriminator="kind")]


class ScheduleAction(BaseModel):
    """What a tick delivers: the signal `signal` (its payload as canonical JSON) to the
    entity `key` of `entity_type`; with `start` (its start input's JSON) a
    signal-with-start, else a plain signal (refused while the entity is not running)."""

    model_config = _MODEL
    entity_type: str
    key: str
    signal: str
    payload: str
    start: str | None = None
    id_reuse: str = "allow_duplicate"


class Schedule(BaseModel):
    """A schedule, as stored: when it ticks, what a tick delivers, and its policies.

    `catchup_window`: after downtime, a missed tick at most this many seconds old fires
    on return; older ones are recorded as skipped. `jitter`: each tick fires up to this
    many seconds late, by an amount derived from the schedule and the tick (the same on
    every host). `end_at` (epoch seconds) and `max_ticks` end it: no tick after
    `end_at`, no more than `max_ticks` fired."""

    model_config = _MODEL
    spec: Spec
    action: ScheduleAction
    overlap: Overlap = Overlap.SKIP
    catchup_window: float = Field(default=300.0, ge=0.0, le=366 * 86400.0, allow_inf_nan=False)
    jitter: float = Field(default=0.0, ge=0.0, le=86400.0, allow_inf_nan=False)
    paused: bool = False
    end_at: float | None = Field(default=None, allow_inf_nan=False)
    max_ticks: int | None = Field(default=None, ge=1)
    note: str = Field(default="", max_length=1000)


def next_tick(spec: Cron | Interval | Calendar, after: int) -> int | None:
    """The first tick of `spec` strictly after `after` (epoch seconds); None: never."""
    if isinstance(spec, Interval):
        k = (after - spec.offset) // spec.every + 1
        return spec.offset + k * spec.every
    cron = spec.as_cron() if isinstance(spec, Calendar) else spec
    zone = _zone(cron.time_zone)
    wall = dt.datetime.fromtimestamp(after, zone).replace(tzinfo=None, fold=0)
    try:
        it = croniter(cron.expression, wall, second_at_beginning=True)
        for _ in range(_SEARCH):
            candidate: dt.datetime = it.get_next(dt.datetime)
            # fold=0: a repeated wall time is its first occurrence; a skipped one maps
            # to the instant an hour later on the clock.
            tick = int(candidate.replace(tzinfo=zone, fold=0).timestamp())
            if tick > after:
                return tick
    except CroniterBadDateError:
        return None
    return None


def jitter_of(schedule_id: str, tick: int, jitter: float) -> float:
    """Seconds the tick waits past its time: derived from the schedule and the tick, so
    every host (and a host after a restart) waits the same."""
    if jitter <= 0:
        return 0.0
    digest = hashlib.blake2b(f"{schedule_id}@{tick}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 * jitter


def tick_text(tick: int) -> str:
    """A tick as an ISO 8601 UTC time (`2026-12-06T09:00:00Z`): message ids and outcomes."""
    return dt.datetime.fromtimestamp(tick, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
