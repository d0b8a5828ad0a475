"""Atomic signal-with-start, cold start and handler-safe order (guarantees 1 and 3)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

import corral
from corral.persistence import open_store
from entities import (
    ALL_ENTITIES,
    GatedStore,
    Inbox,
    Note,
    Notes,
    Reply,
    Start,
    Status,
    Ticket,
    assert_init_first,
    events_of,
    fresh_key,
    wait_applied,
)
from stores import sql


def no_corral_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("corral") and r.levelno >= logging.ERROR]


async def test_the_very_first_signal_reaches_a_handler_that_uses_state_made_in_init(
    db_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        ack = await ref.signal_with_start(Ticket.reply, Reply(text="hello"),
                                          start=Start(tenant="acme"), message_id="m-1")
        assert (ack.status, ack.run_id, ack.seq, ack.started) == ("accepted", 1, 1, True)
        await wait_applied(ref, 1)
        status = await ref.query(Ticket.status)
    assert status == Status(tenant="acme", inbox=["acme:hello"], assignments=[])
    assert assert_init_first(key) == {events_of(key)[0][0]: ["reply:hello"]}
    assert no_corral_errors(caplog) == []


async def test_a_start_input_given_as_a_dict_is_validated_and_used(db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        await ref.signal_with_start(Ticket.reply, {"text": "hi"}, start={"tenant": "globex"})
        await wait_applied(ref, 1)
        assert (await ref.query(Ticket.status)).inbox == ["globex:hi"]


async def test_500_concurrent_signal_with_start_calls_on_a_fresh_key_start_one_run(
    db_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = fresh_key()
    n = 500
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        acks = await asyncio.gather(*(
            ref.signal_with_start(Ticket.reply, Reply(text=str(i)),
                                  start=Start(tenant=f"tenant-{i}"), message_id=f"m-{i}")
            for i in range(n)
        ))
        await wait_applied(ref, n)
        status = await ref.query(Ticket.status)
        info = await ref.describe()

    assert sum(a.started for a in acks) == 1
    assert {a.run_id for a in acks} == {1}
    assert {a.status for a in acks} == {"accepted"}
    assert sorted(a.seq for a in acks) == list(range(1, n + 1))
    assert [r.run_id for r in info.runs] == [1]
    assert info.accepted_seq == n
    assert info.applied_seq == n

    # The start input of the call that started the run wins; the others are ignored.
    starter = next(i for i, a in enumerate(acks) if a.started)
    assert status.tenant == f"tenant-{starter}"
    # Every signal applied once, in acceptance (seq) order.
    by_seq = [f"tenant-{starter}:{i}" for i, _ in sorted(enumerate(acks), key=lambda p: p[1].seq)]
    assert status.inbox == by_seq
    handled = assert_init_first(key)
    assert len(handled) == 1, "the run was instantiated more than once"
    assert sorted(handled.popitem()[1]) == sorted(f"reply:{i}" for i in range(n))

    assert sql(db_path, "SELECT count(*) FROM runs WHERE key=?", key) == [(1,)]
    assert sql(db_path, "SELECT count(*) FROM journal WHERE key=?", key) == [(n,)]
    assert no_corral_errors(caplog) == []


async def test_a_mailbox_signal_reaches_run_through_self_mailbox_in_order(db_path: str) -> None:
    key = fresh_key("inbox")
    texts = [f"n{i}" for i in range(30)] + ["stop"]
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Inbox, key)
        first = await ref.signal_with_start(Inbox.note, Note(text=texts[0]), start=None)
        assert first.started
        for text in texts[1:]:
            ack = await ref.signal(Inbox.note, {"text": text})
            assert ack.run_id == 1
            assert not ack.started
        result = await ref.result(timeout=30)
        info = await ref.describe()
    assert result == Notes(texts=texts)
    assert info.status is corral.RunStatus.COMPLETED


async def test_concurrent_mailbox_signals_reach_run_in_acceptance_order(db_path: str) -> None:
    key = fresh_key("inbox")
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Inbox, key)
        acks = await asyncio.gather(*(
            ref.signal_with_start(Inbox.note, Note(text=f"n{i}"), start=None)
            for i in range(100)
        ))
        await ref.signal(Inbox.note, Note(text="stop"))
        result = await ref.result(timeout=30)
    by_seq = [f"n{i}" for i, _ in sorted(enumerate(acks), key=lambda p: p[1].seq)]
    assert result.texts == [*by_seq, "stop"]
    assert sum(a.started for a in acks) == 1


@pytest.mark.parametrize("held", ["latest_run", "journal"])
async def test_messages_arriving_while_an_activation_loads_are_buffered_not_run_early(
    db_path: str, held: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Reactivation after a restart: hold the activation inside its store reads (before
    `__init__`, or between `__init__` and the journal replay) while signals arrive."""
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        for i in range(5):
            await ref.signal_with_start(Ticket.reply, Reply(text=str(i)), start=Start(tenant="t"))
        await wait_applied(ref, 5)
    before = len(events_of(key))

    store = GatedStore(await open_store(db_path, shards=16))
    store.hold(held)
    try:
        async with corral.open_runtime(store, entities=ALL_ENTITIES, shards=16) as rt:
            ref = rt.ref(Ticket, key)
            await asyncio.wait_for(store.reached.wait(), 30)  # the restart is loading it
            acks = await asyncio.gather(*(
                ref.signal(Ticket.reply, Reply(text=str(i))) for i in range(5, 25)
            ))
            assert sorted(a.seq for a in acks) == list(range(6, 26))
            # Loading is held: no handler ran, and __init__ ran only if we hold the replay.
            assert [ev for _, ev in events_of(key)[before:]] == (
                [] if held == "latest_run" else ["init"])
            store.release()
            await wait_applied(ref, 25)
            status = await ref.query(Ticket.status)
    finally:
        await store.inner.close()
    assert status.inbox == [f"t:{i}" for i in range(25)]
    handled = assert_init_first(key)
    assert len(handled) == 2
    assert handled[max(handled)] == [f"reply:{i}" for i in range(25)]
    assert no_corral_errors(caplog) == []


async def test_reopening_the_store_rebuilds_state_by_replay_with_init_first(
    db_path: str,
) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        for i in range(10):
            await ref.signal_with_start(Ticket.reply, Reply(text=str(i)), start=Start(tenant="t"))
        await wait_applied(ref, 10)
        before = await ref.query(Ticket.status)
    first = assert_init_first(key)
    assert len(first) == 1

    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        await wait_applied(ref, 10)  # recovered at start-up, without any new message
        after = await ref.query(Ticket.status)
        ack = await ref.signal(Ticket.reply, Reply(text="late"))
        await wait_applied(ref, 11)
        last = await ref.query(Ticket.status)

    assert after == before
    assert ack.run_id == 1
    assert ack.seq == 11
    assert last.inbox == [*before.inbox, "t:late"]
    both = assert_init_first(key)
    (second,) = set(both) - set(first)
    assert both[second] == [f"reply:{i}" for i in range(10)] + ["reply:late"]


async def test_a_run_started_here_that_the_journal_tail_delivered_first_is_applied(
        db_path: str) -> None:
    """The journal tail can hand a host an entry it committed itself before the accept
    that committed it calls `route_started` (another process's commit woke the tail):
    the activation the tail created, still loading, must get the run."""
    from corral.persistence import Acceptance, EntryKind, canonical_json, payload_hash

    async with corral.open_runtime(db_path, entities=[Ticket]) as rt:
        ref = rt.ref(Ticket, fresh_key())
        host = rt.host
        assert host is not None
        shard = host.shards[ref.shard]
        payload, start = canonical_json({"text": "hi"}), canonical_json({"tenant": "acme"})
        acc = Acceptance("Ticket", ref.key, ref.shard, EntryKind.SIGNAL, "reply", "m-1",
                         payload, payload_hash("reply", payload), None, start,
                         Ticket._corral_definition.id_reuse, time.time())
        result = await rt.store.accept(acc)
        shard.route(result.entry)  # the tail, first
        shard.route_started(result.entry, acc.start)  # then the accept's fast path
        await asyncio.wait_for(wait_applied(ref, 1), 10)
        assert (await ref.query(Ticket.status)).inbox == ["acme:hi"]
