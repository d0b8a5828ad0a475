"""Testing helpers for users' own entities: a runtime on a virtual clock.

`open_test_runtime` runs the real host and store code (an in-memory SQLite store by
default, or a file) with a clock that moves only when the test says so. Durable
timers, `wait_for(timeout=...)` deadlines, `idle_timeout` passivation and
`Entity.now()` all follow it, so a test covers a week-long timer in milliseconds, the
way Temporal's time-skipping test environment does for workflows.

Example:
    async def test_the_reminder_fires_after_a_day() -> None:
        async with corral.testing.open_test_runtime(entities=[Reminder]) as env:
            ref = env.runtime.ref(Reminder, "r-1")
            await ref.signal_with_start(Reminder.remind, Note(text="call"), start=None)
            await env.advance(hours=23)
            assert not await ref.query(Reminder.sent)
            await env.advance(hours=1)
            assert await ref.query(Reminder.sent)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from corral._errors import InvalidArgumentError
from corral.actors import Entity, EntityDefinition
from corral.persistence import (
    Store,
    is_postgres_url,
    open_sqlite_store,
    open_store,
    stored_shards,
)
from corral.runtime import Runtime, open_runtime
from corral.runtime._clock import VirtualClock
from corral.runtime.host._check import SnapshotCheck, SnapshotFailure, TypeCheck, check_store
from corral.runtime.host._host import LocalHost
from corral.runtime.host._local_backend import LocalBackend

__all__ = ["SnapshotCheck", "SnapshotFailure", "TestRuntime", "TypeCheck", "check_snapshots",
           "open_test_runtime"]

_SETTLE_ROUNDS = 20_000


class TestRuntime:
    """A `Runtime` whose clock moves only through `advance`.

    Attributes:
        runtime: the runtime to address entities with (`runtime.ref(...)`).
        clock: the virtual clock (its `time()` is what `Entity.now()` returns).
    """

    __test__ = False  # not a pytest test class

    def __init__(self, runtime: Runtime, clock: VirtualClock, store: Store,
                 host: LocalHost) -> None:
        self.runtime = runtime
        self.clock = clock
        self._store = store
        self._host = host

    def now(self) -> float:
        """The virtual wall-clock time, in seconds since the epoch."""
        return self.clock.time()

    async def advance(self, seconds: float = 0.0, *, minutes: float = 0.0, hours: float = 0.0,
                      days: float = 0.0) -> int:
        """Move the clock forward, firing every timer and schedule due by then in order.

        Time jumps from one due moment to the next (an in-memory deadline, a durable
        timer of a passivated entity, an entity's idle timeout) and at each the runtime
        is left to settle: the woken entities run until they wait again and every write
        is committed. Returns how many timers and schedule ticks fired.
        """
        total = seconds + 60 * minutes + 3600 * hours + 86400 * days
        if total < 0:
            raise ValueError(f"time only moves forward; got {total} seconds")
        target = self.clock.time() + total
        fired = 0
        await self.settle()
        while True:
            step = min(t for t in (await self._next_due(), target) if t is not None)
            self.clock.set_time(step)
            await self._host.passivate_idle()
            fired += self.clock.fire_due() + await self._host.fire_due_timers()
            fired += await self._host.schedules.fire_due()
            await self.settle()
            if step >= target and not await self._due_now():
                return fired

    async def settle(self) -> None:
        """Wait until no entity is loading, applying or working, no send is being
        delivered, and nothing is queued for the store (woken entities have run until
        they wait again, and what they sent has reached its target's mailbox)."""
        quiet = 0
        for _ in range(_SETTLE_ROUNDS):
            await asyncio.sleep(0)
            if self._store.idle and not self._host.postman.busy and not any(
                    a.busy for s in self._host.shards.values() for a in s.resident()):
                quiet += 1
                if quiet >= 3:
                    return
            else:
                quiet = 0
                await asyncio.sleep(0.0005)  # a write or a thread hop is under way
        raise RuntimeError("the test runtime did not settle: an entity keeps working "
                           "without waiting (a loop without an await on corral?)")

    async def _next_due(self) -> float | None:
        """The wall time of the next thing due: a deadline, a timer, a passivation."""
        idle = [a.idle_deadline for s in self._host.shards.values() for a in s.resident()]
        start = self.clock.time() - self.clock.monotonic()
        candidates = [
            self.clock.next_deadline(),
            await self._store.next_timer(frozenset(self._host.shards)),
            await self._store.next_schedule_due(frozenset(self._host.shards)),
            *(start + d for d in idle if d is not None),
        ]
        due = [t for t in candidates if t is not None]
        return min(due) if due else None

    async def _due_now(self) -> bool:
        nxt = await self._next_due()
        return nxt is not None and nxt <= self.clock.time()


@contextlib.asynccontextmanager
async def open_test_runtime(*, entities: Sequence[type[Entity]], store: str = ":memory:",
                            start: float | None = None, shards: int = 4,
                            **options: Any) -> AsyncIterator[TestRuntime]:
    """Open a runtime on a virtual clock for a test.

    Args:
        entities: the entity types under test.
        store: a SQLite path, `":memory:"` (the default: nothing on disk), or a
            PostgreSQL URL (its database's clock is not virtual: only what corral
            decides by the host's clock follows `advance`).
        start: the virtual clock's initial wall time (default: now).
        shards: shard count of the store (few: one process hosts them all).
        **options: passed to `open_runtime` (`authorize`, `limits`, ...).
    """
    clock = VirtualClock(start)
    the_store = await open_store(store, shards=shards) if is_postgres_url(store) \
        else await open_sqlite_store(store, shards=shards, clock=clock.time)
    try:
        async with open_runtime(the_store, entities=entities, shards=shards, clock=clock,
                                **options) as rt:
            assert isinstance(rt.backend, LocalBackend)
            host = rt.backend.host
            assert host is not None
            env = TestRuntime(rt, clock, the_store, host)
            await env.settle()
            yield env
    finally:
        await the_store.close()


async def check_snapshots(store: str | Store, *, entities: Sequence[type[Entity]],
                          entity_type: str | None = None, sample: int | None = None,
                          seed: int | None = None) -> SnapshotCheck:
    """Whether the entities in `store` restore with the code of `entities`.

    For each entity of those types (or `sample` chosen at random per type), running
    or finished (a finished entity's latest snapshot is its final state, which queries
    on it restore), the latest snapshot is decoded, brought forward by the
    `@corral.upgrade` hooks and restored, and the journal after it is replayed through
    the handlers, as a read-only replica does: `run()` never runs and nothing is
    written. Point it at a copy of production in CI, with the code about to be deployed; `corral
    check-snapshots` is the same from the command line.

    Args:
        store: an open `Store`, or where one is (a SQLite path or a PostgreSQL URL);
            an existing corral store, opened and closed here.
        entities: the entity classes of the release to check.
        entity_type: only this type (its name).
        sample: at most this many entities per type.

    Example:
        async def test_production_snapshots_restore_with_this_release() -> None:
            report = await corral.testing.check_snapshots("prod-copy.db",
                                                          entities=[Ticket])
            assert report.ok, report.summary()
    """
    definitions = _definitions(entities, entity_type)
    if not isinstance(store, str):
        return await check_store(store, definitions, sample=sample, seed=seed)
    opened = await open_store(store, shards=await stored_shards(store))
    try:
        return await check_store(opened, definitions, sample=sample, seed=seed)
    finally:
        await opened.close()


def _definitions(entities: Sequence[type[Entity]], entity_type: str | None
                 ) -> list[EntityDefinition]:
    found = [e._corral_definition for e in entities]
    if entity_type is None:
        return found
    chosen = [d for d in found if d.name == entity_type]
    if not chosen:
        raise InvalidArgumentError(
            f"no entity type {entity_type!r} among {sorted(d.name for d in found)}")
    return chosen
