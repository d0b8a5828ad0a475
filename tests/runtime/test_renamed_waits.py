"""A renamed durable signal wait (issue 22, deliverable 3): a process still on the old
code delivers by the wait's old name and reaches the run waiting under today's name,
with one winner across both names; what it buffered before the run reached the wait is
adopted there; after the timeout its delivery is stale. Both stores (`db_path`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import corral
from entities import fresh_key
from procs import TESTS, Worker, spawner, wait_until
from rename_entities import Decision, OrderInput, OrderV1, OrderV2


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, TESTS / "rename_worker.py") as start:
        yield start


async def _open_waits(rt: corral.Runtime, key: str,
                      etype: type[corral.Entity] = OrderV2) -> list[str]:
    return [w.name for w in (await rt.signal_waits(etype)).items if w.key == key]


async def _old_code_delivers(db_path: str, key: str) -> str:
    """Release 1, a pure client in this process, delivers by the old name."""
    async with corral.open_runtime(db_path, entities=[OrderV1], shards=2, host=False) as rt:
        return (await rt.ref(OrderV1, key).deliver(
            OrderV1.decision, Decision(approved=True), key="old-1", sender="old")).status


async def test_a_process_on_the_old_code_delivers_by_the_old_name_to_a_run_waiting_under_the_new_one(  # noqa: E501
        db_path: str, tmp_path: Path, spawn: Callable[..., Worker]) -> None:
    key = fresh_key("order")
    async with corral.open_runtime(db_path, entities=[OrderV2], shards=2) as rt:
        ref = rt.ref(OrderV2, key)
        await ref.start(start=OrderInput())
        await wait_until(lambda: _is_waiting(rt, key), "run() waits under the new name")
        assert await _open_waits(rt, key) == ["approval"]  # the old name is no open wait
        done = tmp_path / "statuses"
        old = spawn("old", "deliver", "--db", db_path, "--key", key, "--count", "2",
                    "--done", str(done))
        await wait_until(done.exists, "the old process delivered twice", alive=[old])
        assert done.read_text() == "delivered,duplicate"
        assert await ref.result() == "approved"
        other = await ref.deliver(OrderV2.approval, Decision(approved=False), key="new-1",
                                  sender="new")
        assert (other.status, other.sender, other.payload) == (
            "already_delivered", "old", Decision(approved=True))


async def _is_waiting(rt: corral.Runtime, key: str) -> bool:
    return await _open_waits(rt, key) != []


async def test_a_delivery_by_the_old_name_buffered_before_the_run_reached_the_wait_is_adopted_there(
        db_path: str) -> None:
    key = fresh_key("order")
    async with corral.open_runtime(db_path, entities=[OrderV1], shards=2, host=False) as rt:
        await rt.ref(OrderV1, key).start(start=OrderInput())  # nothing hosts it yet
    assert await _old_code_delivers(db_path, key) == "buffered"
    async with corral.open_runtime(db_path, entities=[OrderV2], shards=2) as rt:
        ref = rt.ref(OrderV2, key)
        await wait_until(lambda: _completed(ref), "run() took the buffered delivery")
        assert await ref.result() == "approved"
        late = await ref.deliver(OrderV2.approval, Decision(approved=False), key="new-1")
        assert late.status == "already_delivered"
        assert late.payload == Decision(approved=True)
    assert await _old_code_delivers(db_path, key) == "duplicate"


async def _completed(ref: corral.EntityRef[OrderV2, OrderInput]) -> bool:
    return (await ref.describe()).status is corral.RunStatus.COMPLETED


async def test_a_delivery_by_the_old_name_after_the_renamed_wait_timed_out_is_stale(
        db_path: str) -> None:
    key = fresh_key("order")
    async with corral.open_runtime(db_path, entities=[OrderV2], shards=2) as rt:
        ref = rt.ref(OrderV2, key)
        await ref.start(start=OrderInput(timeout=0.05))
        await wait_until(lambda: _outcome(ref, "expired"), "the renamed wait timed out")
        assert await _old_code_delivers(db_path, key) == "stale"
        assert (await ref.describe()).status is corral.RunStatus.RUNNING
        assert await ref.query(OrderV2.result_so_far) == "expired"


async def _outcome(ref: corral.EntityRef[OrderV2, OrderInput], outcome: str) -> bool:
    return await ref.query(OrderV2.result_so_far) == outcome


async def test_a_wait_the_old_code_opened_is_taken_over_by_the_new_code_and_closed_by_the_old_name(
        db_path: str) -> None:
    key = fresh_key("order")
    async with corral.open_runtime(db_path, entities=[OrderV1], shards=2) as rt:
        await rt.ref(OrderV1, key).start(start=OrderInput(timeout=86400))
        await wait_until(lambda: _waits_as(rt, key, "decision", OrderV1),
                         "release 1's run() opened its wait")
        (opened,) = (await rt.signal_waits(OrderV1)).items
    async with corral.open_runtime(db_path, entities=[OrderV2], shards=2) as rt:
        ref = rt.ref(OrderV2, key)
        await wait_until(lambda: _waits_as(rt, key, "approval"), "release 2 took it over")
        (taken,) = (await rt.signal_waits(OrderV2)).items
        assert taken.deadline == opened.deadline  # kept from the first time, not re-armed
        assert await _old_code_delivers(db_path, key) == "delivered"
        await wait_until(lambda: _completed(ref), "run() took the old-name delivery")
        assert await ref.result() == "approved"


async def _waits_as(rt: corral.Runtime, key: str, name: str,
                    etype: type[corral.Entity] = OrderV2) -> bool:
    return await _open_waits(rt, key, etype) == [name]
