"""Closed runs, id reuse policies, results and termination (guarantee 5)."""

from __future__ import annotations

import asyncio

import pytest

import corral
from corral.persistence import open_store
from entities import (
    ALL_ENTITIES,
    Finish,
    GatedStore,
    Job,
    JobFailedOnly,
    JobReject,
    JobResult,
    Poke,
    Reply,
    Start,
    Ticket,
    events_of,
    fresh_key,
)
from procs import wait_until
from stores import row_counts

START = Start(tenant="acme")


async def close_run(ref: corral.EntityRef[Job], how: str, db_path: str | None = None
                    ) -> None:
    """Close the running run of `ref` as completed, failed or terminated (and with
    `db_path`, wait for the snapshot its host writes at a terminate it applies)."""
    if how == "terminated":
        await ref.terminate(reason="operator said so")
        with pytest.raises(corral.EntityTerminatedError, match="operator said so"):
            await ref.result(timeout=30)
        if db_path is not None:
            await wait_until(lambda: (row_counts(db_path)["snapshots"],
                                      row_counts(db_path)["progress"]) == (1, 1),
                             "the terminated run's last snapshot and watermark are written")
        return
    await ref.signal(Job.finish, Finish(mode="complete" if how == "completed" else "fail"))
    if how == "completed":
        await ref.result(timeout=30)
    else:
        with pytest.raises(corral.EntityFailedError, match="job failed on purpose"):
            await ref.result(timeout=30)


STARTS_AGAIN = {
    (Job, "completed"): True,
    (Job, "failed"): True,
    (Job, "terminated"): True,
    (JobFailedOnly, "completed"): False,
    (JobFailedOnly, "failed"): True,
    (JobFailedOnly, "terminated"): True,
    (JobReject, "completed"): False,
    (JobReject, "failed"): False,
    (JobReject, "terminated"): False,
}


@pytest.mark.parametrize(("etype", "how"), list(STARTS_AGAIN),
                         ids=[f"{t.id_reuse.name}-{h}" for t, h in STARTS_AGAIN])
async def test_signal_with_start_after_a_closed_run_follows_the_id_reuse_policy(
    db_path: str, etype: type[Job], how: str
) -> None:
    key = fresh_key("job")
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(etype, key)
        first = await ref.signal_with_start(etype.poke, Poke(n=1), start=START)
        assert (first.run_id, first.started) == (1, True)
        await close_run(ref, how, db_path)

        if STARTS_AGAIN[(etype, how)]:
            ack = await ref.signal_with_start(etype.poke, Poke(n=2), start=Start(tenant="new"))
            assert (ack.status, ack.run_id, ack.started) == ("accepted", 2, True)
            again = await ref.signal_with_start(etype.poke, Poke(n=3), start=START)
            assert (again.run_id, again.started) == (2, False)
            state = await ref.query(etype.state)
            assert state == JobResult(run_id=2, tenant="new", pokes=[2, 3])
            info = await ref.describe()
            assert [r.run_id for r in info.runs] == [1, 2]
            assert info.status is corral.RunStatus.RUNNING
            assert ack.seq > first.seq  # seq numbers an entity's messages across runs
        else:
            counts = row_counts(db_path)
            with pytest.raises(corral.EntityClosedError, match=etype.id_reuse.name):
                await ref.signal_with_start(etype.poke, Poke(n=2), start=START)
            assert row_counts(db_path) == counts
            info = await ref.describe()
            assert [r.run_id for r in info.runs] == [1]
            assert info.status.value == how


@pytest.mark.parametrize("how", ["completed", "failed", "terminated"])
async def test_a_plain_signal_to_a_closed_entity_is_refused_not_dropped(
    db_path: str, how: str
) -> None:
    key = fresh_key("job")
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Job, key)
        await ref.signal_with_start(Job.poke, Poke(n=1), start=START)
        await close_run(ref, how, db_path)
        counts = row_counts(db_path)
        with pytest.raises(corral.EntityNotRunningError, match=f"is {how}"):
            await ref.signal(Job.poke, Poke(n=2))
        with pytest.raises(corral.EntityNotRunningError):
            await ref.terminate(reason="again")
        assert row_counts(db_path) == counts


async def test_a_plain_signal_to_a_never_started_entity_is_refused(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, fresh_key())
        counts = row_counts(db_path)
        with pytest.raises(corral.EntityNotRunningError, match="never started"):
            await ref.signal(Ticket.reply, Reply(text="hi"))
        with pytest.raises(corral.EntityNotRunningError, match="never started"):
            await ref.terminate()
        with pytest.raises(corral.EntityNotRunningError):
            await ref.result(timeout=5)
        info = await ref.describe()
        assert (info.status, info.run_id, info.accepted_seq, info.runs) == (
            corral.RunStatus.NEVER_STARTED, 0, 0, ())
        assert not info.status.is_closed
        assert row_counts(db_path) == counts


async def test_result_returns_what_run_returned_as_its_model(db_path: str) -> None:
    key = fresh_key("job")
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Job, key)
        await ref.signal_with_start(Job.poke, Poke(n=7), start=START)
        await ref.signal(Job.poke, Poke(n=8))
        waiter = asyncio.ensure_future(ref.result(timeout=30))
        await ref.signal(Job.finish, Finish(mode="complete"))
        result = await waiter
        assert await ref.result(timeout=30) == result  # and again, from the store
        info = await ref.describe()
    assert isinstance(result, JobResult)
    assert result == JobResult(run_id=1, tenant="acme", pokes=[7, 8])
    assert info.status is corral.RunStatus.COMPLETED
    assert info.runs[0].closed_at is not None


async def test_result_of_a_failed_run_raises_with_the_error(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Job, fresh_key("job"))
        await ref.signal_with_start(Job.finish, Finish(mode="fail"), start=START)
        with pytest.raises(corral.EntityFailedError) as caught:
            await ref.result(timeout=30)
        info = await ref.describe()
    assert "FailRun: job failed on purpose" in str(caught.value)
    assert info.status is corral.RunStatus.FAILED
    assert "job failed on purpose" in (info.runs[0].error or "")


async def test_result_times_out_while_the_run_is_still_running(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Job, fresh_key("job"))
        await ref.signal_with_start(Job.poke, Poke(n=1), start=START)
        with pytest.raises(TimeoutError):
            await ref.result(timeout=0.05)
        assert (await ref.describe()).status is corral.RunStatus.RUNNING


async def test_terminate_closes_a_running_entity_and_stops_its_run(db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        await ref.signal_with_start(Ticket.reply, Reply(text="a"), start=START)
        ack = await ref.terminate(reason="spam", message_id="t-1")
        assert (ack.status, ack.run_id, ack.seq, ack.started) == ("accepted", 1, 2, False)
        dup = await ref.terminate(reason="spam", message_id="t-1")
        assert dup.status == "duplicate"
        assert dup.seq == 2
        with pytest.raises(corral.EntityTerminatedError, match="spam"):
            await ref.result(timeout=30)
        with pytest.raises(corral.EntityNotRunningError):
            await ref.signal(Ticket.reply, Reply(text="b"))

        async def gone() -> bool:
            return not (await ref.describe()).hosted_here

        await wait_until(gone, "the terminated activation leaves memory")
        info = await ref.describe()
        # ALLOW_DUPLICATE: a new run may start after a termination.
        restarted = await ref.signal_with_start(Ticket.reply, Reply(text="c"), start=START)
        status = await ref.query(Ticket.status)
    assert info.status is corral.RunStatus.TERMINATED
    assert (restarted.run_id, restarted.started) == (2, True)
    assert status.inbox == ["acme:c"]


async def test_a_signal_accepted_just_before_run_returns_is_applied_before_the_run_closes(
    db_path: str,
) -> None:
    """Another process accepts a signal after `run()` returned but before the close
    committed, and this host has not seen it yet: the close must wait for it."""
    key = fresh_key("job")
    store = GatedStore(await open_store(db_path, shards=16))
    late: list[corral.Ack] = []
    try:
        # The longest poll interval (60 s, far past this test): only the close finds it.
        async with corral.open_runtime(store, entities=ALL_ENTITIES, shards=16,
                                       poll_interval=60) as rt, \
                corral.open_runtime(db_path, entities=ALL_ENTITIES, shards=16,
                                    host=False) as client:
            ref = rt.ref(Job, key)
            await ref.signal_with_start(Job.poke, Poke(n=1), start=START)

            async def accept_elsewhere() -> None:
                late.append(await client.ref(Job, key).signal(Job.poke, Poke(n=99)))

            store.before_close = accept_elsewhere
            await ref.signal(Job.finish, Finish(mode="complete"))
            result = await ref.result(timeout=30)
            info = await ref.describe()
    finally:
        await store.inner.close()

    assert late
    assert late[0].status == "accepted"
    assert late[0].run_id == 1
    assert result == JobResult(run_id=1, tenant="acme", pokes=[1])  # run() returned first
    assert ("poke:99" in [ev for _, ev in events_of(key)]), "the late signal was never applied"
    assert info.status is corral.RunStatus.COMPLETED
