"""`ref.start()`: start an entity without a message, idempotent by its start id and
following the type's `IdReusePolicy` like every start."""

from __future__ import annotations

import pytest

import corral
import corral.testing
from entities import Job, JobReject, Start, fresh_key
from stores import sql
from test_testing import DAY, Reminder


async def test_start_runs_an_entity_that_has_no_message_to_receive() -> None:
    async with corral.testing.open_test_runtime(entities=[Reminder]) as env:
        ref = env.runtime.ref(Reminder, "r-1")
        ack = await ref.start(start=None, start_id="created")
        assert (ack.status, ack.started, ack.run_id, ack.seq) == ("accepted", True, 1, 1)
        await ref.signal(Reminder.remind, {"text": "pay"})
        await env.advance(days=1)
        assert await ref.query(Reminder.sent) is not None


async def test_a_retried_start_is_a_duplicate_and_a_start_of_a_running_entity_starts_nothing(
    db_path: str,
) -> None:
    key = fresh_key("job")
    async with corral.open_runtime(db_path, entities=[Job]) as rt:
        ref = rt.ref(Job, key)
        first = await ref.start(start=Start(tenant="acme"), start_id="s-1")
        again = await ref.start(start=Start(tenant="acme"), start_id="s-1")
        other = await ref.start(start={"tenant": "other"}, start_id="s-2")
        assert (first.status, first.started) == ("accepted", True)
        assert (again.status, again.started, again.seq) == ("duplicate", False, first.seq)
        assert (other.status, other.started, other.run_id) == ("accepted", False, first.run_id)
        with pytest.raises(corral.IdempotencyConflictError):
            await ref.start(start=Start(tenant="changed"), start_id="s-1")
        await ref.signal(Job.finish, {"mode": "complete"})
        done = await ref.result(timeout=10)
    assert done.tenant == "acme"  # the second start's input was ignored
    assert sql(db_path, "SELECT count(*) FROM runs WHERE key=?", key) == [(1,)]


async def test_start_after_a_run_closed_follows_the_id_reuse_policy(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Job, JobReject]) as rt:
        for entity, reopens in ((Job, True), (JobReject, False)):
            ref = rt.ref(entity, fresh_key("job"))
            await ref.start(start=Start(tenant="a"))
            await ref.signal(entity.finish, {"mode": "complete"})
            await ref.result(timeout=10)
            if reopens:
                ack = await ref.start(start=Start(tenant="b"))
                assert (ack.started, ack.run_id) == (True, 2)
            else:
                with pytest.raises(corral.EntityClosedError):
                    await ref.start(start=Start(tenant="b"))


async def test_start_checks_its_input_and_id_at_the_boundary(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Job]) as rt:
        ref = rt.ref(Job, fresh_key("job"))
        with pytest.raises(corral.InvalidPayloadError, match="needs a start input"):
            await ref.start(start=None)  # type: ignore[arg-type]
        with pytest.raises(corral.InvalidKeyError, match="start id"):
            await ref.start(start=Start(tenant="a"), start_id="s\ud800")
    assert sql(db_path, "SELECT count(*) FROM runs") == [(0,)]


_ = DAY
