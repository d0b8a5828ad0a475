"""The approval-gate example (`examples/approval_gate.py`) runs and tells the truth.

Deadlines run on `corral.testing`'s virtual clock: a four-hour decision window takes
no real time.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import corral
import corral.testing
from example_modules import load_example

HOURS = 3600.0


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("approval_gate.py", "approval_gate_example")


def _open(example: ModuleType, **options: Any
          ) -> contextlib.AbstractAsyncContextManager[corral.testing.TestRuntime]:
    return corral.testing.open_test_runtime(entities=[example.Order],
                                            authorize=example.authorize, **options)


async def test_one_of_two_simultaneous_decisions_wins_and_a_late_one_is_stale(
    example: ModuleType,
) -> None:
    async with _open(example) as env:
        start = env.now()
        report = await example.demo(env.runtime, window=4 * HOURS, let_time_pass=env.advance)
    assert [(g.key, g.name, g.deadline - g.waiting_since) for g in report.gates] == [
        ("o-1", "approval", example.DAY), ("o-2", "approval", 4 * HOURS)]
    # Exactly one click won; the other was told whose decision it lost to.
    statuses = sorted(d.status for d in report.race.values())
    assert statuses == ["already_delivered", "delivered"]
    (won,) = (d for d in report.race.values() if d.status == "delivered")
    (lost,) = (d for d in report.race.values() if d.status == "already_delivered")
    assert (lost.payload, lost.sender, lost.delivered_at, lost.run_id) == (
        won.payload, won.sender, won.delivered_at, won.run_id)
    # The sender recorded is the manager the hook found, never the token claimed.
    winner = next(k for k, d in report.race.items() if d is won)
    payload, token = example.CLICKS[winner]
    assert won.payload == payload
    assert won.sender == example.SESSIONS[token] != token
    assert report.decided == example.Outcome(
        order="o-1", status="approved" if payload.approved else "rejected", note=payload.note)
    # The browser's retry of the winning click changed nothing.
    assert report.retry is not None
    assert (report.retry.status, report.retry.payload, report.retry.sender) == (
        "duplicate", won.payload, won.sender)
    assert isinstance(report.refused, corral.UnauthorizedError)
    # o-2 timed out after its window of virtual time; ana's click came too late.
    assert report.timed_out == example.Outcome(order="o-2", status="timed_out")
    assert env.now() - start == pytest.approx(4 * HOURS, abs=1)
    assert report.late is not None
    assert (report.late.status, report.late.payload) == ("stale", None)
    assert report.gates_after == []


async def test_the_deadline_is_the_one_fixed_when_run_first_reached_the_gate(
    example: ModuleType, tmp_path: Path,
) -> None:
    store = str(tmp_path / "orders.db")
    order = example.OrderInput(item="pallets", amount_cents=90_000, decide_within=4 * HOURS)
    async with _open(example, store=store) as env:
        ref = env.runtime.ref(example.Order, "o-7")
        await ref.start(start=order, start_id="order-o-7-created")
        (gate,) = await example.wait_at_gate(env.runtime, {"o-7"})
        assert gate.deadline == gate.waiting_since + 4 * HOURS
        await env.advance(hours=3)
        stopped_at = env.now()
    # The host is down for half an hour; its restart runs run() again from the top,
    # which waits with timeout=4 h again: the deadline stays the first one.
    async with _open(example, store=store, start=stopped_at + 0.5 * HOURS) as env:
        ref = env.runtime.ref(example.Order, "o-7")
        assert await example.wait_at_gate(env.runtime, {"o-7"}) == [gate]
        await env.advance(0.5 * HOURS - 1)
        assert (await ref.describe()).status is corral.RunStatus.RUNNING
        await env.advance(1)
        assert await ref.result(timeout=5) == example.Outcome(order="o-7", status="timed_out")
        late = await ref.deliver(example.Order.approval, example.Decision(approved=True),
                                 key="click-late", sender=example.ANA)
        assert late.status == "stale"
        assert await example.open_gates(env.runtime) == []


async def test_only_a_known_session_decides_and_a_manager_name_claimed_is_refused(
    example: ModuleType,
) -> None:
    async with _open(example) as env:
        ref = env.runtime.ref(example.Order, "o-3")
        await ref.start(start=example.OrderInput(item="desk", amount_cents=30_000,
                                                 decide_within=example.DAY))
        await example.wait_at_gate(env.runtime, {"o-3"})
        for claimed in ("sess-000000", "ana"):  # a made-up token; a name, not a token
            with pytest.raises(corral.UnauthorizedError):
                await ref.deliver(example.Order.approval, example.Decision(approved=True),
                                  key=f"click-{claimed}", sender=claimed)
        assert [g.key for g in await example.open_gates(env.runtime)] == ["o-3"]  # untouched
        d = await ref.deliver(example.Order.approval, example.Decision(approved=False),
                              key="click-ben-3", sender=example.BEN)
        assert (d.status, d.sender) == ("delivered", "ben")
        assert (await ref.result(timeout=5)).status == "rejected"


async def test_a_click_is_retried_safely_but_never_changed_or_replayed_by_another_manager(
    example: ModuleType,
) -> None:
    async with _open(example) as env:
        ref = env.runtime.ref(example.Order, "o-4")
        await ref.start(start=example.OrderInput(item="van", amount_cents=3_000_000,
                                                 decide_within=example.DAY))
        await example.wait_at_gate(env.runtime, {"o-4"})
        yes, no = example.Decision(approved=True), example.Decision(approved=False)
        first = await ref.deliver(example.Order.approval, yes, key="click-1", sender=example.ANA)
        assert first.status == "delivered"
        with pytest.raises(corral.IdempotencyConflictError):  # same click, other decision
            await ref.deliver(example.Order.approval, no, key="click-1", sender=example.ANA)
        with pytest.raises(corral.IdempotencyConflictError):  # same click, other manager
            await ref.deliver(example.Order.approval, yes, key="click-1", sender=example.BEN)
        again = await ref.deliver(example.Order.approval, yes, key="click-1",
                                  sender=example.ANA)
        assert (again.status, again.sender) == ("duplicate", "ana")
        # A losing click kept nothing: its retry loses again, it is no duplicate.
        for _ in range(2):
            lost = await ref.deliver(example.Order.approval, no, key="click-2",
                                     sender=example.BEN)
            assert (lost.status, lost.payload, lost.sender) == ("already_delivered", yes, "ana")
        assert (await ref.result(timeout=5)).status == "approved"


async def test_the_script_runs_the_demo_on_a_sqlite_file(
    example: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    store = tmp_path / "orders.db"
    report = await example.main(store, window=0.5)  # real time: o-2 times out in 0.5 s
    out = capsys.readouterr().out
    assert store.exists()
    assert sorted(d.status for d in report.race.values()) == ["already_delivered", "delivered"]
    assert "again: duplicate" in out
    assert "an unknown session token: refused" in out
    assert "o-2: timed_out; ana's click after the deadline: stale" in out
    assert "orders still waiting: 0" in out
    assert example.ANA not in out
    assert example.BEN not in out  # the managers' names are recorded, never their tokens
