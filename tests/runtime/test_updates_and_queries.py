"""Updates and queries (guarantee 12), and the non-durable `:memory:` store end to end."""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import ClassVar

import pytest

import corral
from entities import (
    ALL_ENTITIES,
    Assign,
    Assigned,
    Finish,
    Job,
    JobResult,
    Poke,
    Reply,
    Start,
    Status,
    Ticket,
    assert_init_first,
    events_of,
    fresh_key,
)
from stores import row_counts, sql

START = Start(tenant="acme")


async def test_an_update_returns_the_handlers_result_as_its_model(db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        await ref.signal_with_start(Ticket.reply, Reply(text="a"), start=START)
        first = await ref.update(Ticket.assign, Assign(agent="ann"))
        second = await ref.update(Ticket.assign, {"agent": "bo"}, timeout=30)
        status = await ref.query(Ticket.status)
    assert isinstance(first, Assigned)
    assert first == Assigned(agent="ann", number=1)
    assert second == Assigned(agent="bo", number=2)
    assert status.assignments == ["ann", "bo"]


async def test_updates_and_signals_apply_in_acceptance_order(db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        await ref.signal_with_start(Ticket.reply, Reply(text="1"), start=START)
        await asyncio.gather(
            ref.update(Ticket.assign, Assign(agent="a")),
            ref.signal(Ticket.reply, Reply(text="2")),
            ref.update(Ticket.assign, Assign(agent="b")),
        )
        await ref.query(Ticket.status)
    (handled,) = assert_init_first(key).values()
    journal = sql(db_path, "SELECT name, payload FROM journal WHERE key=? ORDER BY seq",
                  key)
    expected = [f"{name}:{json.loads(payload).get('text') or json.loads(payload)['agent']}"
                for name, payload in journal]
    assert handled == expected
    assert sorted(handled) == sorted(["reply:1", "assign:a", "reply:2", "assign:b"])


async def test_update_with_start_on_a_fresh_key_is_atomic_under_concurrency(
    db_path: str,
) -> None:
    key = fresh_key()
    n = 100
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        results = await asyncio.gather(*(
            ref.update_with_start(Ticket.assign, Assign(agent=f"a{i}"),
                                  start=Start(tenant=f"t{i}"), update_id=f"u-{i}")
            for i in range(n)
        ))
        info = await ref.describe()
        status = await ref.query(Ticket.status)

    assert [r.run_id for r in info.runs] == [1]
    assert info.accepted_seq == n
    # Each update applied exactly once, each caller saw its own update's result.
    assert sorted(r.number for r in results) == list(range(1, n + 1))
    assert all(r.agent == f"a{i}" for i, r in enumerate(results))
    assert sorted(status.assignments) == sorted(f"a{i}" for i in range(n))
    assert [status.assignments[r.number - 1] for r in results] == [f"a{i}" for i in range(n)]
    assert len(assert_init_first(key)) == 1


async def test_a_failing_update_raises_update_failed_for_the_caller_and_every_retry(
    db_path: str,
) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        with pytest.raises(corral.UpdateFailedError, match="no agent named zed"):
            await ref.update_with_start(Ticket.reject, Assign(agent="zed"), start=START,
                                        update_id="u-1")
        for _ in range(3):
            with pytest.raises(corral.UpdateFailedError, match="ValueError: no agent named zed"):
                await ref.update(Ticket.reject, Assign(agent="zed"), update_id="u-1")
        # The entity goes on: a later update works.
        ok = await ref.update(Ticket.assign, Assign(agent="ann"), update_id="u-2")
    assert ok == Assigned(agent="ann", number=1)
    assert [ev for _, ev in events_of(key)] == ["init", "reject:zed", "assign:ann"]


async def test_a_failing_update_is_still_failed_after_reopening_the_store(db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        with pytest.raises(corral.UpdateFailedError):
            await rt.ref(Ticket, key).update_with_start(Ticket.reject, Assign(agent="zed"),
                                                        start=START, update_id="u-1")
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        with pytest.raises(corral.UpdateFailedError, match="no agent named zed"):
            await rt.ref(Ticket, key).update(Ticket.reject, Assign(agent="zed"),
                                             update_id="u-1")


async def test_a_plain_update_to_a_never_started_entity_is_refused(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        counts = row_counts(db_path)
        with pytest.raises(corral.EntityNotRunningError):
            await rt.ref(Ticket, fresh_key()).update(Ticket.assign, Assign(agent="a"))
        assert row_counts(db_path) == counts


async def test_a_query_reads_state_without_changing_it(db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        await ref.signal_with_start(Ticket.reply, Reply(text="a"), start=START)
        first = await ref.query(Ticket.status)
        counts = row_counts(db_path)
        info = await ref.describe()
        first.inbox.append("tampered")  # the answer is a copy, not the live state
        again = [await ref.query(Ticket.status) for _ in range(5)]
        assert row_counts(db_path) == counts
        assert (await ref.describe()).applied_seq == info.applied_seq
    assert again == [Status(tenant="acme", inbox=["acme:a"], assignments=[])] * 5
    assert [ev for _, ev in events_of(key)] == ["init", "reply:a"]


async def test_a_query_sees_every_signal_accepted_before_it(db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        for i in range(20):
            await ref.signal_with_start(Ticket.reply, Reply(text=str(i)), start=START)
            status = await ref.query(Ticket.status)
            assert len(status.inbox) == i + 1


async def test_a_query_of_a_never_started_entity_is_refused(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        with pytest.raises(corral.EntityNotRunningError, match="never started"):
            await rt.ref(Ticket, fresh_key()).query(Ticket.status)


async def test_a_query_from_a_process_that_does_not_host_answers_from_the_store(
    db_path: str,
) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        await ref.signal_with_start(Ticket.reply, Reply(text="a"), start=START)
        await ref.update(Ticket.assign, Assign(agent="ann"))
        async with corral.open_runtime(db_path, entities=ALL_ENTITIES, host=False) as client:
            remote = await client.ref(Ticket, key).query(Ticket.status)
            counts = row_counts(db_path)
            assert await client.ref(Ticket, key).query(Ticket.status) == remote
            assert row_counts(db_path) == counts
        local = await ref.query(Ticket.status)
    assert remote == local == Status(tenant="acme", inbox=["acme:a"], assignments=["ann"])


async def test_the_memory_store_works_end_to_end() -> None:
    key = fresh_key("job")
    async with corral.open_runtime(":memory:", entities=ALL_ENTITIES) as rt:
        assert rt.store.durable is False
        ref = rt.ref(Job, key)
        acks = await asyncio.gather(*(
            ref.signal_with_start(Job.poke, Poke(n=i), start=START, message_id=f"m-{i}")
            for i in range(50)
        ))
        dup = await ref.signal(Job.poke, Poke(n=0), message_id="m-0")
        state = await ref.query(Job.state)
        await ref.signal(Job.finish, Finish(mode="complete"))
        result = await ref.result(timeout=30)
        again = await ref.signal_with_start(Job.poke, Poke(n=99), start=START)

        ticket = rt.ref(Ticket, fresh_key())
        assigned = await ticket.update_with_start(Ticket.assign, Assign(agent="ann"), start=START)
        with pytest.raises(corral.UpdateFailedError):
            await ticket.update(Ticket.reject, Assign(agent="zed"))
        with pytest.raises(corral.EntityNotRunningError):
            await rt.ref(Ticket, fresh_key()).signal(Ticket.reply, Reply(text="x"))
    assert sum(a.started for a in acks) == 1
    assert dup.status == "duplicate"
    assert sorted(state.pokes) == list(range(50))
    assert result == JobResult(run_id=1, tenant="acme", pokes=state.pokes)
    assert (again.run_id, again.started) == (2, True)
    assert assigned == Assigned(agent="ann", number=1)


async def test_each_memory_store_is_private_and_starts_empty() -> None:
    key = fresh_key()
    async with corral.open_runtime(":memory:", entities=ALL_ENTITIES) as rt:
        await rt.ref(Ticket, key).signal_with_start(Ticket.reply, Reply(text="a"), start=START)
    async with corral.open_runtime(":memory:", entities=ALL_ENTITIES) as rt:
        with pytest.raises(corral.EntityNotRunningError):
            await rt.ref(Ticket, key).query(Ticket.status)


class Stuck(corral.Entity):
    """A signal handler that blocks until `gate` opens."""

    gate: ClassVar[asyncio.Event | None] = None

    def __init__(self) -> None:
        self.seen: list[str] = []

    @corral.signal
    async def hold(self, reply: Reply) -> None:
        if Stuck.gate is not None:
            await Stuck.gate.wait()
        self.seen.append(reply.text)

    @corral.query
    def texts(self) -> list[str]:
        return self.seen


async def test_a_query_waiting_for_a_blocked_handler_times_out_retryably(
        db_path: str) -> None:
    Stuck.gate = asyncio.Event()
    try:
        async with corral.open_runtime(db_path, entities=[Stuck]) as rt:
            ref = rt.ref(Stuck, fresh_key())
            await ref.signal_with_start(Stuck.hold, Reply(text="a"), start=None)
            with pytest.raises(corral.QueryTimeoutError, match=r"within 0\.2 s") as late:
                await ref.query(Stuck.texts, timeout=0.2)  # "a" is not applied yet
            err = late.value
            assert isinstance(err, corral.WaitTimeoutError)
            assert (err.retryable, err.entity_type, err.key, err.waited) == (
                True, "Stuck", ref.key, 0.2)
            assert f"query 'texts' of EntityRef(Stuck, {ref.key!r})" in str(err)
            Stuck.gate.set()
            assert await ref.query(Stuck.texts, timeout=30) == ["a"]  # asked again
    finally:
        Stuck.gate = None


def test_a_query_waits_at_most_30_seconds_by_default() -> None:
    default = inspect.signature(corral.EntityRef.query).parameters["timeout"].default
    assert default == corral.runtime.QUERY_TIMEOUT == 30.0


async def test_a_query_timeout_must_be_seconds(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Stuck]) as rt:
        ref = rt.ref(Stuck, fresh_key())
        await ref.signal_with_start(Stuck.hold, Reply(text="a"), start=None)
        for bad in (-1, "5", float("inf"), True):
            with pytest.raises(corral.InvalidArgumentError, match="timeout"):
                await ref.query(Stuck.texts, timeout=bad)  # type: ignore[arg-type]
