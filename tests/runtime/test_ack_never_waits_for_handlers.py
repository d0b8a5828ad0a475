"""A signal's Ack never waits for user code: a message accepted for a running entity
is queued for its activation's worker task, never applied inside the caller's await.

The handler blocks the event loop's thread on a `threading.Event` (a sync handler does
that: it runs on the loop). A watcher thread, woken when the handler starts, notes
whether the caller already had its Ack, then releases the handler. Had the handler run
inside the caller's await, the Ack could not have come back yet.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import ClassVar

from pydantic import BaseModel

import corral


class Start(BaseModel):
    pass


class Hold(BaseModel):
    pass


class Holder(corral.Entity):
    """Its `hold` handler blocks until the test releases it."""

    entered: ClassVar[threading.Event] = threading.Event()
    release: ClassVar[threading.Event] = threading.Event()

    def __init__(self, init: Start) -> None:
        self.held = 0

    @corral.signal
    def hold(self, _: Hold) -> None:
        type(self).entered.set()
        type(self).release.wait(timeout=60)  # a bound in case the watcher died
        self.held += 1

    @corral.signal
    def warm(self) -> None:
        pass

    @corral.query
    def count(self) -> int:
        return self.held


async def acked_while_the_handler_blocks(send: Callable[[], Awaitable[corral.Ack]]
                                         ) -> tuple[corral.Ack, bool]:
    """Send with a watcher thread that releases the handler once it runs; whether the
    caller had its Ack by then."""
    Holder.entered, Holder.release = threading.Event(), threading.Event()
    acked, seen = threading.Event(), []

    def watch() -> None:
        Holder.entered.wait(timeout=60)
        seen.append(acked.is_set())
        Holder.release.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    ack = await send()
    acked.set()  # no await since the Ack: the worker task has not run yet, if it was queued
    await asyncio.to_thread(watcher.join)
    return ack, seen == [True]


async def test_a_running_entitys_blocked_sync_handler_never_holds_up_the_callers_ack(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Holder]) as rt:
        ref = rt.ref(Holder, "h")
        await ref.signal_with_start(Holder.warm, start=Start())
        assert await ref.query(Holder.count) == 0  # running, loaded, nothing waits

        ack, early = await acked_while_the_handler_blocks(
            lambda: ref.signal(Holder.hold, Hold()))
        assert (ack.status, ack.started) == ("accepted", False)
        assert early, "signal: the Ack came back only after the handler returned"
        assert await ref.query(Holder.count) == 1

        ack, early = await acked_while_the_handler_blocks(
            lambda: ref.signal_with_start(Holder.hold, Hold(), start=Start()))
        assert (ack.status, ack.started) == ("accepted", False)
        assert early, "signal_with_start: the Ack came back only after the handler returned"
        assert await ref.query(Holder.count) == 2  # each applied exactly once
