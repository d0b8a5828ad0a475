"""Closing is ordered and total, wherever the runtime's tasks are when it happens.

A host's journal tail, lease keeper and housekeeping (durable timers) each await the
store in a loop; a close may come while any of them is at any of its awaits, or past
its last one. These tests close runtimes (and stores under running hosts) after random
delays, many times, with sends and timers in flight and with the event loop slowed by
callbacks that hold it: closing never raises, leaves no corral task behind and no
exception unretrieved, and every store method called after close raises `StoreError`.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
import warnings
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel

import corral
from entities import Reply, Start, Ticket, fresh_key

ROUNDS = 12
CALL_TIMEOUT = 30.0


class Nap(BaseModel):
    seconds: float


class Napper(corral.Entity):
    """`run()` sleeps on durable timers forever: its timer rows keep housekeeping busy."""

    def __init__(self, init: Start) -> None:
        self.naps = 0

    async def run(self) -> None:
        while True:
            await self.sleep(0.003)
            self.naps += 1


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What the event loop's exception handler saw (an exception never retrieved, a
    callback that raised): the test fails on any of it."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        yield seen
    finally:
        loop.set_exception_handler(previous)


def corral_tasks() -> list[str]:
    return sorted(t.get_name() for t in asyncio.all_tasks()
                  if t.get_name().startswith("corral-") and not t.done())


async def slow_the_loop(stop: asyncio.Event) -> None:
    """Hold the event loop for a millisecond at a time: every other callback (a task's
    next step, a store future's result) comes later than it would."""
    while not stop.is_set():
        time.sleep(0.001)  # noqa: ASYNC251 (holding the loop is the point)
        await asyncio.sleep(0)


async def traffic(rt: corral.Runtime) -> None:
    """Sends and started runs, until cancelled (or refused by a closed store)."""
    n = 0
    while True:
        n += 1
        await rt.ref(Ticket, fresh_key()).signal_with_start(
            Ticket.reply, Reply(text=str(n)), start=Start(tenant="acme"))
        await rt.ref(Napper, fresh_key("napper")).start(start=Start(tenant="acme"))


async def one_round(db_path: str, rng: random.Random, *, store_first: bool) -> None:
    """Open a runtime with fast loops, let traffic run for a random moment, then close:
    the store first (under the running host) or the runtime as a user does."""
    async with corral.open_runtime(db_path, entities=[Ticket, Napper], lease_ttl=0.06,
                                   poll_interval=0.001) as rt:
        sending = asyncio.ensure_future(traffic(rt))
        await asyncio.sleep(rng.uniform(0, 0.03))
        if store_first:
            store: Any = rt.store
            await store.close()
            await asyncio.sleep(rng.uniform(0, 0.03))  # the host's loops meet it closed
            with pytest.raises(corral.StoreError, match="closed"):
                await store.journal_tail(0, frozenset({0}))
            with pytest.raises(corral.StoreError, match="closed"):
                await store.foreign_commit_seen()
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)


@pytest.mark.parametrize("store_first", [True, False], ids=["store-closed-first", "runtime"])
async def test_closing_at_random_moments_under_a_slowed_loop_raises_nothing_and_leaves_nothing(
    db_path: str, loop_errors: list[dict[str, Any]], store_first: bool,
) -> None:
    rng = random.Random(30)
    stop = asyncio.Event()
    slow = asyncio.ensure_future(slow_the_loop(stop))
    try:
        for _ in range(ROUNDS):
            await asyncio.wait_for(one_round(db_path, rng, store_first=store_first),
                                   CALL_TIMEOUT)
            assert corral_tasks() == []
    finally:
        stop.set()
        await slow
    assert loop_errors == []


async def test_an_activation_stopped_before_its_worker_ran_leaves_no_coroutine_unawaited(
    db_path: str,
) -> None:
    """A worker task cancelled before its first step (an entry queued, then the host
    closing in the same moment: a CI run under load met it) never made its job's
    coroutine, so none is collected un-awaited."""
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=[Ticket]) as rt:
        assert rt.host is not None
        ref = rt.ref(Ticket, key)
        await ref.signal_with_start(Ticket.reply, Reply(text="1"), start=Start(tenant="acme"))
        act = rt.host.shards[ref.shard].get("Ticket", key)
        assert act is not None
        await asyncio.wait_for(act.wait_applied(1), CALL_TIMEOUT)
        [entry] = await rt.store.journal("Ticket", key, run_id=1, after_seq=0)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            act.queue(entry._replace(seq=entry.seq + 2))  # out of order: a worker task
            await act.stop()  # cancels it before it ever ran
            gc.collect()
    assert [str(w.message) for w in seen] == []
