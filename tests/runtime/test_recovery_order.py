"""A host taking over a crashed host's shards activates their running entities by
priority (issue 42): the ones with something pending first, the rest in the
background through a bounded window (`_recovery_window`), and anything a message, a
timer or a query asks for at once. Crashes are real SIGKILLs; order is asserted by
counts (`corral_activations_total`), never by times."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import corral
from corral.runtime.host import _recovery_window
from procs import TESTS, Worker, spawner, sql, wait_until
from recovery_entities import SEEN_AT_APPLY, Idle, Ledger, idle_activations
from takeover_entities import Alarm
from wait_entities import Decision, Order

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL and flock")

IDLE = 2000


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, TESTS / "recovery_worker.py") as start:
        yield start


async def _crashed_with_a_backlog(db_path: str, tmp_path: Path,
                                  spawn: Callable[..., Worker], idle: int) -> None:
    """A host of `idle` idle entities and the ledger, SIGKILLed; then one signal for
    the ledger, accepted by a pure client: its one pending message."""
    ready = tmp_path / "ready"
    worker = spawn("host", "idle", db_path, str(ready), str(idle))
    await wait_until(ready.exists, "the worker's entities are resident", alive=[worker],
                     timeout=120)
    worker.sigkill()
    async with corral.open_runtime(db_path, entities=[Idle, Ledger], host=False) as client:
        await client.ref(Ledger, "ledger").signal(Ledger.note)
    SEEN_AT_APPLY.clear()


async def test_after_a_crash_the_entity_with_a_backlog_is_applied_before_the_idle_ones_are_all_activated(  # noqa: E501
    db_path: str, tmp_path: Path, spawn: Callable[..., Worker],
) -> None:
    await _crashed_with_a_backlog(db_path, tmp_path, spawn, IDLE)
    before = idle_activations()
    async with corral.open_runtime(db_path, entities=[Idle, Ledger]) as rt:
        await wait_until(lambda: bool(SEEN_AT_APPLY), "the ledger applies its signal")
        seen = SEEN_AT_APPLY[0] - before
        print(f"\n[recovery] {seen} of {IDLE} idle entities were activated when the "
              f"backlog was applied")
        # Activated all at once, or the backlog last, the ledger's signal waited for
        # most of them (about half, or all but a window's worth); with the idle ones
        # let into the window beside it, for those of the shards read before its own.
        # The idle ones wait until every shard's urgent entities loaded.
        assert seen == 0
        await wait_until(lambda: idle_activations() - before == IDLE,
                         "every idle running entity is activated in the background")
        assert await rt.ref(Ledger, "ledger").query(Ledger.count) == 1
    assert [SEEN_AT_APPLY[0]] == SEEN_AT_APPLY  # applied once


async def test_after_a_crash_every_idle_run_fires_its_timer_and_every_waiting_run_gets_its_signal(
    db_path: str, tmp_path: Path, spawn: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_recovery_window, "RECOVERY_WINDOW", 2)  # a long background line
    n = 20
    ready = tmp_path / "ready"
    worker = spawn("host", "waits", db_path, str(ready), str(n))
    await wait_until(ready.exists, "the worker's timers and waits are stored", alive=[worker])
    worker.sigkill()
    async with corral.open_runtime(db_path, entities=[Alarm, Order]) as rt:
        for i in range(n):
            await rt.ref(Order, f"order-{i}").deliver(
                Order.approval, Decision(approved=True, by="test"), key=f"approve-{i}")
        for i in range(n):
            outcome = await rt.ref(Order, f"order-{i}").result(timeout=30)
            assert outcome.approved
            assert outcome.by == "test"

        def rang() -> bool:
            return sql(db_path, "SELECT count(*) FROM timers WHERE etype = 'Alarm'") == [(0,)]
        await wait_until(rang, "every alarm's timer fired")
        for i in range(n):
            assert await rt.ref(Alarm, f"alarm-{i}").query(Alarm.rang) is not None


async def test_a_host_closing_mid_recovery_hands_its_shards_over_and_nothing_is_lost_or_doubled(
    db_path: str, tmp_path: Path, spawn: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_recovery_window, "RECOVERY_WINDOW", 1)  # recovery stays under way
    idle = 300
    await _crashed_with_a_backlog(db_path, tmp_path, spawn, idle)
    first = corral.open_runtime(db_path, entities=[Idle, Ledger])
    rt = await first.__aenter__()  # takes every shard from the dead holder
    closed = False
    try:
        assert rt.host is not None
        assert len(rt.host.shards) == 16
        async with corral.open_runtime(db_path, entities=[Idle, Ledger]) as heir:
            assert heir.host is not None
            left = sum(s.recovering for s in rt.host.shards.values())
            assert left > 0, "the background activations were done before the close"
            closed = True
            await first.__aexit__(None, None, None)  # hands its shards to the heir
            await wait_until(lambda: len(heir.host.shards) == 16,  # type: ignore[union-attr]
                             "the heir holds every shard")
            await wait_until(lambda: all(s.recovering == 0 for s in  # type: ignore[union-attr]
                                         heir.host.shards.values()),
                             "the heir activated every running entity")
            assert await heir.ref(Ledger, "ledger").query(Ledger.count) == 1
    finally:
        if not closed:
            await first.__aexit__(None, None, None)
    assert len(SEEN_AT_APPLY) in (1, 2)  # applied by the first host, the heir, or both
