"""What operators read: `rt.entities()` page by page, `ref.describe()` in full; on both
stores (`db_path`)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

import corral
import corral.runtime.host._progress as progress
from corral.runtime.host._progress import share
from entities import Job, Start, fresh_key
from procs import wait_until
from test_signal_waits import ENTITIES as WAITING
from test_signal_waits import Order, OrderInput, waiting


class Item(BaseModel):
    id: str


class Counter(corral.Entity):
    """Counts items; an item "boom" raises (and is dead-lettered after two attempts)."""

    retry = corral.RetryPolicy(max_attempts=2, initial_backoff=0.01)

    def __init__(self, init: Start) -> None:
        self.items: list[str] = []

    @corral.signal
    def add(self, item: Item) -> None:
        if item.id == "boom":
            raise ValueError("boom")
        self.items.append(item.id)


ENTITIES: list[type[corral.Entity]] = [Counter, Job, *WAITING]


async def test_entities_are_listed_in_type_and_key_order_in_pages_with_filters(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        for i in range(7):
            await rt.ref(Counter, f"c-{i}").signal_with_start(
                Counter.add, Item(id=f"x{i}"), start=Start(tenant="t"), message_id=f"m{i}")
        for i in range(3):
            await rt.ref(Job, f"j-{i}").start(start=Start(tenant="t"))
        await rt.ref(Job, "j-1").terminate("done")

        pages, after = [], None
        while True:
            page = await rt.entities(limit=3, after=after)
            pages.append([(e.entity_type, e.key) for e in page.items])
            if page.next_cursor is None:
                break
            after = page.next_cursor
        counters = (await rt.entities(Counter, limit=100)).items
        terminated = (await rt.entities(status="terminated")).items
        running_jobs = (await rt.entities("Job", status=corral.RunStatus.RUNNING)).items
        for bad in ({"status": "asleep"}, {"status": "never_started"}, {"limit": 0},
                    {"after": "x"}, {"after": 5}):
            with pytest.raises(corral.InvalidArgumentError):
                await rt.entities(**bad)  # type: ignore[arg-type]
        with pytest.raises(corral.UnknownEntityTypeError):
            await rt.entities("Nope")
    listed = [item for page in pages for item in page]
    assert [len(p) for p in pages] == [3, 3, 3, 1]
    assert listed == sorted(listed)
    assert len(set(listed)) == 10
    assert [e.key for e in counters] == [f"c-{i}" for i in range(7)]
    first = counters[0]
    assert (first.status, first.run_id, first.accepted_seq, first.shard) == \
        (corral.RunStatus.RUNNING, 1, 1, rt.router.shard_of("Counter", "c-0"))
    assert first.updated_at is not None
    assert first.updated_at > 0
    assert first.applied_seq in (0, 1)  # hosted here: live
    assert [e.key for e in terminated] == ["j-1"]
    assert [e.key for e in running_jobs] == ["j-0", "j-2"]


async def test_a_listing_knows_passivated_entities_and_a_client_what_the_host_recorded(
        db_path: str) -> None:
    key = fresh_key("order")
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Order, key)
        await ref.start(start=OrderInput())
        await waiting(rt, ref)
        summary = (await rt.entities(Order)).items[0]
        assert (summary.key, summary.passivated, summary.mailbox_depth) == (key, False, 0)
    async with corral.open_runtime(db_path, entities=ENTITIES, host=False) as client:
        remote = (await client.entities(Order)).items[0]
    # The host recorded its progress as it closed: the start mark applied, nothing behind.
    assert (remote.applied_seq, remote.mailbox_depth, remote.passivated, remote.backlog,
            remote.oldest_unapplied_age) == (1, 0, False, 0, None)


async def test_a_pure_client_sees_applied_seq_and_backlog_change_as_a_host_applies(
        db_path: str) -> None:
    key = fresh_key("counter")
    async with corral.open_runtime(db_path, entities=ENTITIES, host=False) as client:
        ref = client.ref(Counter, key)
        for i in range(3):
            await ref.signal_with_start(Counter.add, Item(id=f"x{i}"), start=Start(tenant="t"),
                                        message_id=f"m{i}")
        behind = await ref.describe()  # no host yet: nothing applied
        listed = next(e for e in (await client.entities(Counter, limit=1000)).items
                      if e.key == key)
        assert (behind.applied_seq, behind.backlog, behind.hosted_here) == (0, 3, False)
        assert behind.oldest_unapplied_age is not None
        assert behind.oldest_unapplied_age >= 0
        assert behind.progress_age is None  # never recorded by a host
        assert (listed.key, listed.applied_seq, listed.backlog) == (key, 0, 3)
        async with corral.open_runtime(db_path, entities=ENTITIES) as host:
            assert host.host is not None
            async def caught_up() -> bool:
                d = await ref.describe()
                return (d.applied_seq, d.backlog, d.mailbox_depth) == (3, 0, 0)
            await wait_until(caught_up, "the host records that it applied all three")
            done = await ref.describe()
            assert done.oldest_unapplied_age is None
            assert done.progress_age is not None
            assert not done.hosted_here
            await ref.signal(Counter.add, Item(id="x3"), message_id="m3")

            async def fourth() -> bool:
                page = await client.entities(Counter, limit=1000)
                return [e.applied_seq for e in page.items if e.key == key] == [4]
            await wait_until(fourth, "the listing shows the fourth applied")


async def test_describe_shows_snapshots_timers_open_waits_and_dead_letters(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Order, fresh_key("order"))
        await ref.start(start=OrderInput(timeout=3600))
        await waiting(rt, ref)
        info = await ref.describe()
        assert [(w.name, w.run_id) for w in info.open_waits] == [("approval", 1)]
        assert len(info.timers) == 1
        assert info.timers[0] == pytest.approx(
            info.open_waits[0].deadline)
        assert (info.snapshot_seq, info.snapshot_age, info.dead_letters) == (None, None, 0)
        await ref.deliver(Order.approval, {"approved": True}, key="k")
        await ref.result(timeout=10)  # run() checkpoints, then completes
        done = await ref.describe()
        never = await rt.ref(Order, fresh_key("never")).describe()

        poisoned = rt.ref(Counter, fresh_key("poison"))
        await poisoned.signal_with_start(Counter.add, Item(id="boom"), start=Start(tenant="t"))
        await wait_until(lambda: _dead(poisoned), "the poison message is dead-lettered")
        dead = await poisoned.describe()
    assert (done.open_waits, done.timers) == ((), ())
    assert done.snapshot_seq is not None
    assert done.snapshot_age is not None
    assert 0 <= done.snapshot_age < 60
    assert (never.status, never.open_waits, never.dead_letters) == \
        (corral.RunStatus.NEVER_STARTED, (), 0)
    assert dead.dead_letters == 1


async def _dead(ref: corral.EntityRef[Counter, Start]) -> bool:
    return len(await ref.dead_letters()) == 1


def test_a_round_of_progress_shares_its_rows_among_the_shards_that_moved() -> None:
    assert share([0, 5, 1], 10) == [0, 5, 1]  # all fit
    assert share([10, 10, 1], 10) == [4, 5, 1]  # the rest split evenly
    assert share([3, 3], 0) == [0, 0]


async def test_with_more_entities_moving_than_a_round_records_each_is_recorded_in_turn(
        db_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "PROGRESS_ROWS", 3)
    monkeypatch.setattr(progress, "PROGRESS_INTERVAL", None)  # rounds run by the test
    keys = [fresh_key("turn") for _ in range(10)]
    async with corral.open_runtime(db_path, entities=ENTITIES, shards=1) as rt:
        assert rt.host is not None
        rounds = []
        for n in range(1, 5):  # every entity moves before each round
            for key in keys:
                await rt.ref(Counter, key).signal_with_start(
                    Counter.add, Item(id=f"x{n}"), start=Start(tenant="t"))
            for key in keys:
                act = rt.host.shards[0].get("Counter", key)
                assert act is not None
                await act.wait_applied(n)
            rounds.append(await rt.host.record_progress())
        async with corral.open_runtime(db_path, entities=ENTITIES, shards=1,
                                       host=False) as client:
            described = [await client.ref(Counter, key).describe() for key in keys]
    assert rounds == [3, 3, 3, 3]
    # Each recorded in turn (not the same three every round): k0-k2 at seq 1, k3-k5 at
    # 2, k6-k8 at 3, then k9, k0, k1 at 4.
    assert [d.applied_seq for d in described] == [4, 4, 1, 2, 2, 2, 3, 3, 3, 4]
    assert all(d.progress_age is not None for d in described)
