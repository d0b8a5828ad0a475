"""What an entity's `run()` awaits never loses the cancellation of a host stopping it.

A host stopping an entity (a hand-off, a graceful close, a lost lease) cancels `run()`
and awaits it. On Python < 3.12 `asyncio.wait_for` returned the awaited result instead
of raising when the cancellation came just after the awaited call finished: `run()`
went on, and the stop (and the host's close) waited on it. `run()` waits through the
host's clock (`wait_for(..., timeout=)`, timers: `_clock`) and through steps with a
`timeout=` (`_steps`); both now wait with `corral._deadline.within`. Each round here
finishes the awaited call, then cancels one loop turn later than the round before,
across that window.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from corral.runtime._clock import SystemClock, VirtualClock
from corral.runtime.host._steps import _call


async def cancelled_across_the_window(wait: Callable[[asyncio.Event], Awaitable[object]]
                                      ) -> None:
    """`wait(event)` in a task; set the event; cancel the task 0, 1, ... loop turns
    later: each cancellation that came before the task returned ends it cancelled."""
    inside = 0  # rounds whose cancellation came while the task had not returned yet
    for turns in range(6):
        event = asyncio.Event()
        waiting = asyncio.ensure_future(wait(event))
        await asyncio.sleep(0)  # it waits
        event.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        if waiting.done():
            continue  # it returned first: no cancellation to lose
        inside += 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    assert inside  # some cancellation came while it waited: the window was not missed


@pytest.mark.parametrize("clock", [SystemClock(), VirtualClock()], ids=["system", "virtual"])
async def test_a_clock_wait_cancelled_as_its_event_is_set_ends_cancelled(
    clock: SystemClock | VirtualClock,
) -> None:
    await cancelled_across_the_window(lambda event: clock.wait(event, 60.0))


async def test_a_step_attempt_cancelled_as_it_finishes_ends_cancelled() -> None:
    async def attempt(event: asyncio.Event) -> str:
        await event.wait()
        return "done"

    await cancelled_across_the_window(lambda event: _call(attempt, (event,), "T/k/1/s",
                                                          60.0, None))


async def test_the_system_clocks_wait_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert not await SystemClock().wait(event, 0.01)
    event.set()
    assert await SystemClock().wait(event, 60.0)
    assert await SystemClock().wait(event, None)


async def test_a_step_attempt_past_its_timeout_is_a_timeout_error() -> None:
    async def attempt() -> None:
        await asyncio.Event().wait()

    with pytest.raises(TimeoutError, match=r"within 0\.01 s"):
        await _call(attempt, (), "T/k/1/s", 0.01, None)
