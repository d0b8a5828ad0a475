"""The host-wide window of a takeover's background activations (`_recovery_window`):
urgent activations take slots first, and the rest take none while a shard still holds
them back (its recovery read, then its urgent entities loading), whatever slots are free.
Order is asserted by which waiters hold a slot, never by times."""

from __future__ import annotations

import asyncio

from corral.runtime.host._recovery_window import RecoveryWindow


async def _hold(window: RecoveryWindow, urgent: bool, got: list[str], name: str,
                done: asyncio.Event) -> None:
    async with window.slot(urgent=urgent):
        got.append(name)
        await done.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_while_a_shard_holds_the_rest_back_only_urgent_activations_get_free_slots() -> None:
    window = RecoveryWindow(4)
    got: list[str] = []
    done = asyncio.Event()
    release = window.hold_back()  # a shard reading which of its entities are urgent
    tasks = [asyncio.create_task(_hold(window, False, got, "idle", done)),
             asyncio.create_task(_hold(window, True, got, "backlog", done))]
    await _settle()
    assert got == ["backlog"]  # three slots free, yet the idle one waits
    release()
    await _settle()
    assert got == ["backlog", "idle"]
    done.set()
    await asyncio.gather(*tasks)


async def test_the_rest_wait_until_every_shard_has_released_its_hold_and_a_hold_counts_once(
) -> None:
    window = RecoveryWindow(4)
    got: list[str] = []
    done = asyncio.Event()
    first, second = window.hold_back(), window.hold_back()
    calm = asyncio.create_task(window.wait_urgent_loaded())
    task = asyncio.create_task(_hold(window, False, got, "idle", done))
    first()
    first()  # released twice: still one hold left
    await _settle()
    assert got == []
    assert not calm.done()
    second()
    await _settle()
    assert got == ["idle"]
    assert calm.done()
    done.set()
    await task


async def test_a_waiter_cancelled_before_its_slot_leaves_the_slot_to_the_next() -> None:
    window = RecoveryWindow(1)
    got: list[str] = []
    done = asyncio.Event()
    holder = asyncio.create_task(_hold(window, True, got, "first", done))
    await _settle()
    gone = asyncio.create_task(_hold(window, True, got, "gone", done))
    last = asyncio.create_task(_hold(window, False, got, "last", done))
    await _settle()
    gone.cancel()
    done.set()
    await asyncio.gather(holder, last)
    assert got == ["first", "last"]
    assert gone.cancelled()
