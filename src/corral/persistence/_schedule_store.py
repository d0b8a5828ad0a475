"""What a store does with schedules (`_ops_schedules`): the `ScheduleStore` protocol and
`ScheduleOps`, its implementation on a store's two primitives (`write`, `query`),
which both engines inherit through `StoreCore`. Arguments are positional: a client's
`ScheduleCall` carries them to whichever host answers it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from corral._schedule_spec import Schedule

from ._ops_schedules import (
    BackfillOp,
    DeleteScheduleOp,
    DueSchedule,
    Fired,
    FireOp,
    PauseScheduleOp,
    PutScheduleOp,
    ScheduleRow,
    TriggerOp,
    due_schedules,
    next_schedule_due,
    schedule_row,
    schedule_rows,
)
from ._txn import WriteOp

__all__ = ["ScheduleOps", "ScheduleStore"]

T = TypeVar("T")


class ScheduleStore(Protocol):
    """Schedules: clients' writes and reads, and their holders' rounds."""

    async def put_schedule(self, sid: str, shard: int, schedule: Schedule, now: float,
                           create: bool) -> ScheduleRow:
        """Create (`create`) or replace the schedule; `ScheduleExistsError` /
        `ScheduleNotFoundError` otherwise."""
        ...

    async def pause_schedule(self, sid: str, paused: bool, now: float) -> ScheduleRow: ...

    async def delete_schedule(self, sid: str) -> bool: ...

    async def trigger_schedule(self, row: ScheduleRow, token: str, now: float) -> Fired:
        """Deliver the schedule's action now, once per `token`."""
        ...

    async def backfill_schedule(self, row: ScheduleRow, start: float, end: float,
                                limit: int, now: float) -> Fired:
        """Deliver its ticks from `start` to `end`, each once whatever fired already."""
        ...

    async def fire_schedules(self, ops: Sequence[FireOp]) -> list[Fired | Exception]:
        """A holder's round: each due schedule's firing, in one batch."""
        ...

    async def schedule(self, sid: str) -> ScheduleRow | None: ...

    async def schedules(self, after: str = "", limit: int = 100) -> list[ScheduleRow]: ...

    async def due_schedules(self, shards: frozenset[int], now: float, *, limit: int
                            ) -> list[DueSchedule]: ...

    async def next_schedule_due(self, shards: frozenset[int]) -> float | None: ...


class ScheduleOps:
    """`ScheduleStore` on `write` / `write_many` / `query`."""

    __slots__ = ()

    def write(self, op: WriteOp) -> Coroutine[Any, Any, Any]:
        raise NotImplementedError

    def write_many(self, ops: Sequence[WriteOp]) -> Coroutine[Any, Any, list[Any]]:
        raise NotImplementedError

    async def query(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        raise NotImplementedError

    async def put_schedule(self, sid: str, shard: int, schedule: Schedule, now: float,
                           create: bool) -> ScheduleRow:
        return await self.write(  # type: ignore[no-any-return]
            PutScheduleOp(sid, shard, schedule, now, create))

    async def pause_schedule(self, sid: str, paused: bool, now: float) -> ScheduleRow:
        return await self.write(PauseScheduleOp(sid, paused, now))  # type: ignore[no-any-return]

    async def delete_schedule(self, sid: str) -> bool:
        return await self.write(DeleteScheduleOp(sid))  # type: ignore[no-any-return]

    async def trigger_schedule(self, row: ScheduleRow, token: str, now: float) -> Fired:
        a = row.schedule.action
        return await self.write(  # type: ignore[no-any-return]
            TriggerOp(row.id, row.shard, a.entity_type, a.key, token, now))

    async def backfill_schedule(self, row: ScheduleRow, start: float, end: float,
                                limit: int, now: float) -> Fired:
        a = row.schedule.action
        return await self.write(  # type: ignore[no-any-return]
            BackfillOp(row.id, row.shard, a.entity_type, a.key, start, end, limit, now))

    async def fire_schedules(self, ops: Sequence[FireOp]) -> list[Fired | Exception]:
        return await self.write_many(ops)

    async def schedule(self, sid: str) -> ScheduleRow | None:
        return await self.query(schedule_row, sid)

    async def schedules(self, after: str = "", limit: int = 100) -> list[ScheduleRow]:
        return await self.query(schedule_rows, after, limit)

    async def due_schedules(self, shards: frozenset[int], now: float, *, limit: int
                            ) -> list[DueSchedule]:
        return await self.query(due_schedules, shards, now, limit)

    async def next_schedule_due(self, shards: frozenset[int]) -> float | None:
        return await self.query(next_schedule_due, shards)
