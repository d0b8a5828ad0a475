"""A store outage never strands an entity nor fails its run, on both stores.

Real outages (`tests/support/outages.py`): a full disk under the SQLite file, a PostgreSQL
database closed to connections with its sessions terminated, and a crash restart of
the PostgreSQL server. An activation evicted by a store error while it applied an
entry comes back by itself (a retried update is a duplicate, which delivers nothing,
so nothing else would bring it back); the store calls `run()` makes through the
context (timers, snapshots, signal waits) wait the outage out instead of failing the
run. Every acknowledged message and update is applied exactly once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

import corral
from entities import Start, fresh_key
from outages import Outage, outage_for
from stores import is_postgres

CALL_TIMEOUT = 60.0  # seconds: a call that takes longer is stranded


async def let_the_tail_pass(db_path: str) -> None:
    """On PostgreSQL, let the host's journal tail read past the entry in flight (its
    safety poll runs every second): a tail still behind it would hand it back after
    the outage and re-activate the entity by luck, hiding a stranded activation. Not
    a synchronisation: a shorter wait only makes the test weaker, never flaky."""
    if is_postgres(db_path):
        await asyncio.sleep(2.5)


class Count(BaseModel):
    value: int


class Item(BaseModel):
    n: int


class Nudge(BaseModel):
    text: str


# The test holds a handler in flight while it starts an outage: the handler sets the
# key's `entered` event, then waits for its `gate`.
ENTERED: dict[str, asyncio.Event] = {}
GATES: dict[str, asyncio.Event] = {}


async def hold(key: str) -> None:
    if key in ENTERED:
        ENTERED[key].set()
    if key in GATES:
        await GATES[key].wait()


FAST_RETRY = corral.RetryPolicy(initial_backoff=0.01, max_backoff=0.1)


class Desk(corral.Entity):
    """An update whose outcome is recorded after its handler returns."""

    retry = FAST_RETRY

    def __init__(self, init: Start) -> None:
        self.count = 0

    @corral.update
    async def bump(self) -> Count:
        self.count += 1
        await hold(self.key)
        return Count(value=self.count)

    @corral.query
    def value(self) -> Count:
        return Count(value=self.count)


class Tally(corral.Entity):
    """A snapshot falls due after every signal; `run()` ends at the third."""

    retry = FAST_RETRY
    snapshots = corral.SnapshotPolicy(every=1)

    def __init__(self, init: Start) -> None:
        self.seen: list[int] = []

    @corral.signal
    async def add(self, item: Item) -> None:
        self.seen.append(item.n)
        if item.n == 3:
            await hold(self.key)

    async def run(self) -> Count:
        await self.wait_for(lambda: len(self.seen) >= 3)
        return Count(value=sum(self.seen))


class Sleeper(corral.Entity):
    """`run()` reaches the store through every context call: durable sleeps,
    checkpoints, a timed `wait_for` and a timed signal wait."""

    retry = FAST_RETRY
    nudge = corral.wait(Nudge)

    def __init__(self, init: Start) -> None:
        self.naps = 0
        self.timeouts = 0

    async def run(self) -> Count:
        while self.naps < 6:
            await self.sleep(0.02)
            self.naps += 1
            await self.checkpoint()
        if not await self.wait_for(lambda: False, timeout=0.01):
            self.timeouts += 1
        try:
            await self.wait_for_signal(Sleeper.nudge, timeout=0.01)
        except corral.SignalTimeoutError:
            self.timeouts += 1
        return Count(value=self.naps * 10 + self.timeouts)


class LogEvents(logging.Handler):
    """Counts log records whose message contains a phrase, waking waiters."""

    def __init__(self, phrase: str) -> None:
        super().__init__(logging.DEBUG)
        self.phrase = phrase
        self.count = 0
        self._changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.phrase in record.getMessage():
            self.count += 1
            self._changed.set()

    async def wait(self, count: int) -> None:
        async def reached() -> None:
            while self.count < count:
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(reached(), CALL_TIMEOUT)


@pytest.fixture
def outage(db_path: str, tmp_path: Path) -> Iterator[Outage]:
    with outage_for(db_path, tmp_path) as found:
        yield found


@pytest.fixture
def logged() -> Iterator[dict[str, LogEvents]]:
    """Log phrases a test synchronises on: an activation suspended, a `run()` store
    call retried."""
    handlers = {"suspended": LogEvents("activation suspended"),
                "waits": LogEvents("run() waits, retrying")}
    names = {"suspended": "corral.lifecycle", "waits": "corral.activation"}
    saved = {n: logging.getLogger(n).level for n in names.values()}
    for phrase, handler in handlers.items():
        logger = logging.getLogger(names[phrase])
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        yield handlers
    finally:
        for phrase, handler in handlers.items():
            logging.getLogger(names[phrase]).removeHandler(handler)
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


async def test_an_update_whose_outcome_could_not_be_recorded_is_applied_once_when_the_store_is_back(
    db_path: str, outage: Outage, logged: dict[str, LogEvents],
) -> None:
    """The handler ran, the store failed before its outcome was recorded: the entity
    is evicted and comes back by itself. A retry of the same update id (a duplicate,
    which delivers nothing) gets the outcome, and the update counted once."""
    key = fresh_key("desk")
    ENTERED[key], GATES[key] = asyncio.Event(), asyncio.Event()
    async with corral.open_runtime(db_path, entities=[Desk]) as rt:
        ref = rt.ref(Desk, key)
        first = asyncio.ensure_future(ref.update_with_start(
            Desk.bump, start=Start(tenant="acme"), update_id="u-1"))
        await asyncio.wait_for(ENTERED[key].wait(), CALL_TIMEOUT)
        await let_the_tail_pass(db_path)
        await outage.begin()
        GATES[key].set()  # the handler returns; recording its outcome fails
        await logged["suspended"].wait(1)
        await asyncio.sleep(0.6)  # the caller's wait polls the store at least once meanwhile
        await outage.end()
        # The outage is not the update's failure: the caller's own wait rides through it.
        answer = await asyncio.wait_for(first, CALL_TIMEOUT)
        assert answer == Count(value=1)
        again = await asyncio.wait_for(ref.update(Desk.bump, update_id="u-1"), CALL_TIMEOUT)
        assert again == Count(value=1)
        assert await asyncio.wait_for(ref.update(Desk.bump, update_id="u-2"),
                                      CALL_TIMEOUT) == Count(value=2)


async def test_a_signal_whose_snapshot_could_not_be_written_is_applied_and_the_run_ends(
    db_path: str, outage: Outage, logged: dict[str, LogEvents],
) -> None:
    """The snapshot due after a signal fails: the entity comes back by itself with no
    further message, applies the signal once and `run()` returns."""
    key = fresh_key("tally")
    ENTERED[key], GATES[key] = asyncio.Event(), asyncio.Event()
    async with corral.open_runtime(db_path, entities=[Tally]) as rt:
        ref = rt.ref(Tally, key)
        for n in (1, 2, 3):
            await ref.signal_with_start(Tally.add, Item(n=n), start=Start(tenant="acme"),
                                        message_id=f"m-{n}")
        await asyncio.wait_for(ENTERED[key].wait(), CALL_TIMEOUT)
        await let_the_tail_pass(db_path)
        await outage.begin()
        GATES[key].set()  # the third handler returns; the snapshot after it fails
        await logged["suspended"].wait(1)
        await outage.end()
        assert await ref.result(timeout=CALL_TIMEOUT) == Count(value=6)


async def test_runs_waiting_on_the_store_through_an_outage_complete_and_none_fails(
    db_path: str, outage: Outage, logged: dict[str, LogEvents],
) -> None:
    """Twenty runs sleeping on durable timers, checkpointing and waiting with timeouts
    through an outage (and, on PostgreSQL, a crash restart of the server in it): every
    run completes with its full count, and none is closed as failed."""
    keys = [fresh_key("sleeper") for _ in range(20)]
    async with corral.open_runtime(db_path, entities=[Sleeper]) as rt:
        for key in keys:
            await rt.ref(Sleeper, key).start(start=Start(tenant="acme"))
        await outage.begin()
        if is_postgres(db_path):
            from test_postgres_faults import restart_immediately
            await asyncio.to_thread(restart_immediately, db_path)
        await logged["waits"].wait(20)  # many runs met the outage inside a store call
        await outage.end()
        results = [await rt.ref(Sleeper, key).result(timeout=CALL_TIMEOUT) for key in keys]
    assert results == [Count(value=62)] * len(keys)
