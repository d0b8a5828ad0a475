"""Whose clock judges a wait's deadline when a delivery arrives: the store's, never the
caller's.

A caller on another machine may run hours ahead of or behind the hosts; its clock must
neither time a wait out early nor let a delivery beat a deadline that has passed. Each
test runs on both stores (`db_path`); the skewed caller is a pure client
(`host=False`) given its own clock, the way `corral.testing` injects one, so its
`deliver` is made on that clock while the host and the store keep the machine's.
"""

from __future__ import annotations

import time

import corral
import corral.testing
from corral.runtime._clock import SystemClock
from entities import fresh_key
from procs import wait_until
from stores import sql
from wait_entities import Decision, Order, OrderInput

ENTITIES: list[type[corral.Entity]] = [Order]
HOURS = 3600.0


class SkewedClock(SystemClock):
    """The system clock, shifted by `offset` seconds: a machine whose clock is off."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def time(self) -> float:
        return time.time() + self.offset


async def open_wait_deadline(rt: corral.Runtime, key: str) -> float:
    """Once `run()` of `Order` `key` waits: its deadline, as operators list it."""
    async def listed() -> bool:
        return any(w.key == key for w in (await rt.signal_waits(Order)).items)
    await wait_until(listed, f"Order {key!r} waits")
    [deadline] = [w.deadline for w in (await rt.signal_waits(Order)).items if w.key == key]
    assert deadline is not None
    return deadline


async def test_a_client_whose_clock_runs_2_hours_ahead_still_wins_a_wait_due_in_1_hour(
        db_path: str) -> None:
    key = fresh_key("order")
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Order, key)
        await ref.start(start=OrderInput(timeout=1 * HOURS))
        await open_wait_deadline(rt, key)
        async with corral.open_runtime(db_path, entities=ENTITIES, host=False,
                                       clock=SkewedClock(2 * HOURS)) as ahead:
            won = await ahead.ref(Order, key).deliver(
                Order.approval, Decision(approved=True, by="ahead"), key="k", sender="ana")
        answered = time.time()
        assert (won.status, won.run_id) == ("delivered", 1), \
            "judged on the caller's clock, 2 h ahead: the wait due in 1 h looked timed out"
        outcome = await ref.result(timeout=30)
    assert (outcome.approved, outcome.by, outcome.timed_out) == (True, "ahead", False)
    # Recorded on the store's clock (this machine's), not the caller's.
    assert won.delivered_at is not None
    assert won.delivered_at <= answered
    assert sql(db_path, "SELECT status, delivered_at FROM signal_waits WHERE key=?", key) == \
        [("delivered", won.delivered_at)]


async def test_a_client_whose_clock_runs_2_hours_behind_cannot_beat_a_deadline_that_passed(
        db_path: str) -> None:
    key = fresh_key("order")
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        await rt.ref(Order, key).start(start=OrderInput(timeout=0.2))
        deadline = await open_wait_deadline(rt, key)
    # No host is alive to time the wait out: only the delivery can judge the deadline.
    await wait_until(lambda: time.time() > deadline, "the wait's deadline passes")
    async with corral.open_runtime(db_path, entities=ENTITIES, host=False,
                                   clock=SkewedClock(-2 * HOURS)) as behind:
        late = await behind.ref(Order, key).deliver(
            Order.approval, Decision(approved=True, by="behind"), key="k", sender="ana")
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        outcome = await rt.ref(Order, key).result(timeout=30)
    assert (late.status, late.payload, late.run_id) == ("stale", None, 1), \
        "judged on the caller's clock, 2 h behind: a delivery beat a deadline that had passed"
    assert outcome.timed_out
    assert sql(db_path, "SELECT status, delivery_key FROM signal_waits WHERE key=?", key) == \
        [("timed_out", None)]


async def test_under_corral_testing_deliveries_are_judged_on_the_virtual_clock() -> None:
    start = 1_000_000.0  # 1970: every deadline is long past on the machine's clock
    async with corral.testing.open_test_runtime(entities=ENTITIES, start=start) as env:
        early, late = env.runtime.ref(Order, "early"), env.runtime.ref(Order, "late")
        for ref in (early, late):
            await ref.start(start=OrderInput(timeout=1 * HOURS))
        await env.advance(seconds=1)  # run() reaches both waits
        won = await early.deliver(Order.approval, Decision(approved=True), key="k")
        await env.advance(hours=2)  # the other wait's deadline passes, virtually
        stale = await late.deliver(Order.approval, Decision(approved=True), key="k")
        assert (await late.result()).timed_out
    assert (won.status, won.delivered_at) == ("delivered", start + 1)
    assert (stale.status, stale.payload) == ("stale", None)
