"""Errors a program can act on: typed, with fields as well as a message, one object per
caller, and never a bare cancellation for a caller whose shard moved."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import corral
from entities import Assign, Job, Reply, Start, Ticket, fresh_key
from stores import sql

START = Start(tenant="acme")


async def test_a_refused_send_names_the_entity_run_and_message(db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=[Ticket, Job]) as rt:
        with pytest.raises(corral.EntityNotRunningError) as never:
            await rt.ref(Ticket, key).signal(Ticket.reply, Reply(text="x"), message_id="m-0")
        assert (never.value.entity_type, never.value.key, never.value.run_id,
                never.value.message_id) == ("Ticket", key, None, "m-0")
        ack = await rt.ref(Ticket, key).signal_with_start(Ticket.reply, Reply(text="x"),
                                                          start=START, message_id="m-1")
        with pytest.raises(corral.IdempotencyConflictError) as conflict:
            await rt.ref(Ticket, key).signal(Ticket.reply, Reply(text="y"), message_id="m-1")
        assert (conflict.value.entity_type, conflict.value.key, conflict.value.run_id,
                conflict.value.message_id) == ("Ticket", key, ack.run_id, "m-1")
        with pytest.raises(corral.UpdateFailedError) as failed:
            await rt.ref(Ticket, key).update(Ticket.reject, Assign(agent="z"), update_id="u-1")
        assert (failed.value.key, failed.value.run_id, failed.value.message_id) == (
            key, ack.run_id, "u-1")
        with pytest.raises(corral.InvalidPayloadError) as bad:
            await rt.ref(Ticket, key).signal(Ticket.reply, {"text": 1}, message_id="m-2")
        assert (bad.value.entity_type, bad.value.key, bad.value.message_id) == (
            "Ticket", key, "m-2")


@pytest.mark.parametrize("options", [
    {"entities": [Ticket], "backend": "nowhere"},
    {"entities": [Ticket], "shards": 0},
    {"entities": [Ticket], "backend": "ray", "clock": object()},
], ids=["unknown-backend", "no-shards", "clock-on-ray"])
async def test_open_runtime_refuses_an_option_that_does_not_fit_with_a_typed_error(
        tmp_path: Path, options: dict[str, Any]) -> None:
    """Before anything is opened (no Ray started, no file created), and still a
    `ValueError` for callers that catch that."""
    store = str(tmp_path / "never.db")
    with pytest.raises(corral.InvalidArgumentError) as refused:
        async with corral.open_runtime(store, **options):
            pass
    assert isinstance(refused.value, ValueError)
    assert not (tmp_path / "never.db").exists()


def test_an_error_keeps_its_fields_across_pickling() -> None:
    err = corral.EntityClosedError("closed", entity_type="Job", key="j-1", run_id=3,
                                   message_id="m-9")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is corral.EntityClosedError
    assert str(back) == "closed"
    assert (back.entity_type, back.key, back.run_id, back.message_id) == ("Job", "j-1", 3, "m-9")


async def test_result_timing_out_names_the_entity_run_and_timeout(db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=[Job]) as rt:
        ack = await rt.ref(Job, key).signal_with_start(Job.poke, {"n": 1}, start=START)
        with pytest.raises(corral.WaitTimeoutError) as caught:
            await rt.ref(Job, key).result(timeout=0.05)
    assert isinstance(caught.value, TimeoutError)
    assert str(caught.value) == f"EntityRef(Job, {key!r}): run {ack.run_id} did not close " \
                                "within 0.05 s"
    assert (caught.value.entity_type, caught.value.key, caught.value.run_id) == (
        "Job", key, ack.run_id)


class Gate(BaseModel):
    n: int


class Gated(corral.Entity):
    """An update that parks until `OPEN` is set, in whichever runtime applies it."""

    OPEN = asyncio.Event()
    PARKED = asyncio.Event()

    @corral.update
    async def enter(self, gate: Gate) -> int:
        Gated.PARKED.set()
        await Gated.OPEN.wait()
        return gate.n * 10


async def test_an_update_in_flight_across_a_lease_loss_gets_its_result_from_the_next_owner(
    db_path: str,
) -> None:
    Gated.OPEN, Gated.PARKED = asyncio.Event(), asyncio.Event()
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=[Gated], lease_ttl=0.6) as first:
        ref = first.ref(Gated, key)
        waiting = asyncio.create_task(ref.update_with_start(Gated.enter, Gate(n=4), start=None,
                                                            update_id="u-1"))
        await asyncio.wait_for(Gated.PARKED.wait(), 10)
        # Another process fences the first out: a newer epoch, and an expired lease.
        sql(db_path, "UPDATE leases SET owner='thief', epoch=epoch+1, expires_at=0 "
                     "WHERE shard=?", ref.shard)
        Gated.OPEN.set()  # the next owner's replay does not park
        async with corral.open_runtime(db_path, entities=[Gated], lease_ttl=0.6) as second:
            assert await asyncio.wait_for(waiting, 20) == 40
            assert await second.ref(Gated, key).update(Gated.enter, Gate(n=4),
                                                       update_id="u-1") == 40
    assert sql(db_path, "SELECT count(*) FROM journal WHERE key=?", key) == [(1,)]
