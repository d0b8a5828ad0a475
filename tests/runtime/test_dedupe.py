"""Deduplication by message id and update id (guarantee 4)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import corral
from corral.runtime.client._boundary import new_message_id
from entities import (
    ALL_ENTITIES,
    Assign,
    Assigned,
    Finish,
    Job,
    Poke,
    Reply,
    Start,
    Ticket,
    assert_init_first,
    fresh_key,
    wait_applied,
)
from stores import row_counts, sql

START = Start(tenant="acme")


async def test_the_same_message_id_100_times_concurrently_is_applied_once(db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        acks = await asyncio.gather(*(
            ref.signal_with_start(Ticket.reply, Reply(text="once"), start=START,
                                  message_id="m-1")
            for _ in range(100)
        ))
        await ref.signal(Ticket.reply, Reply(text="after"), message_id="m-2")
        status = await ref.query(Ticket.status)

    accepted = [a for a in acks if a.status == "accepted"]
    duplicates = [a for a in acks if a.status == "duplicate"]
    assert len(accepted) == 1
    assert len(duplicates) == 99
    assert accepted[0].started
    assert not any(a.started for a in duplicates)
    assert {(a.run_id, a.seq) for a in acks} == {(1, 1)}  # the original acceptance
    assert status.inbox == ["acme:once", "acme:after"]
    assert list(assert_init_first(key).values()) == [["reply:once", "reply:after"]]
    assert sql(db_path, "SELECT count(*) FROM journal WHERE key=?", key) == [(2,)]
    assert sql(db_path, "SELECT count(*) FROM dedupe WHERE key=?", key) == [(2,)]


async def test_the_same_message_id_100_times_in_sequence_is_applied_once(db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        await ref.signal_with_start(Ticket.reply, Reply(text="first"), start=START,
                                    message_id="m-0")
        acks = []
        for i in range(100):
            # Both forms of send, and a dict payload equal to the model, are the same message.
            if i % 2:
                acks.append(await ref.signal(Ticket.reply, {"text": "x"}, message_id="m-1"))
            else:
                acks.append(await ref.signal_with_start(
                    Ticket.reply, Reply(text="x"), start=Start(tenant="ignored"),
                    message_id="m-1"))
        status = await ref.query(Ticket.status)

    assert [a.status for a in acks] == ["accepted"] + ["duplicate"] * 99
    assert {(a.run_id, a.seq, a.started) for a in acks} == {(1, 2, False)}
    assert status.inbox == ["acme:first", "acme:x"]


async def test_a_duplicate_ack_carries_the_original_seq_and_run_after_later_messages(
    db_path: str,
) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        originals = [await ref.signal_with_start(Ticket.reply, Reply(text=str(i)), start=START,
                                                 message_id=f"m-{i}") for i in range(5)]
        again = [await ref.signal(Ticket.reply, Reply(text=str(i)), message_id=f"m-{i}")
                 for i in reversed(range(5))]
        status = await ref.query(Ticket.status)
    assert [(a.run_id, a.seq) for a in reversed(again)] == [(a.run_id, a.seq) for a in originals]
    assert {a.status for a in again} == {"duplicate"}
    assert status.inbox == [f"acme:{i}" for i in range(5)]


async def test_the_same_message_id_with_a_changed_payload_is_an_idempotency_conflict(
    db_path: str,
) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        await ref.signal_with_start(Ticket.reply, Reply(text="a"), start=START, message_id="m-1")
        counts = row_counts(db_path)
        with pytest.raises(corral.IdempotencyConflictError, match="different payload"):
            await ref.signal(Ticket.reply, Reply(text="b"), message_id="m-1")
        with pytest.raises(corral.IdempotencyConflictError, match="different payload"):
            await ref.signal_with_start(Ticket.reply, Reply(text="b"), start=START,
                                        message_id="m-1")
        # The same id for another signal of the same entity is a different message too.
        with pytest.raises(corral.IdempotencyConflictError):
            await ref.signal(Ticket.attach, {"value": "a"}, message_id="m-1")
        assert row_counts(db_path) == counts
        status = await ref.query(Ticket.status)
    assert status.inbox == ["acme:a"]


async def test_the_same_message_id_from_another_sender_is_an_idempotency_conflict(
    db_path: str,
) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        await ref.signal_with_start(Ticket.reply, Reply(text="a"), start=START,
                                    message_id="m-1", sender="alice")
        counts = row_counts(db_path)
        for other in ("bob", None):
            with pytest.raises(corral.IdempotencyConflictError, match="sender"):
                await ref.signal(Ticket.reply, Reply(text="a"), message_id="m-1", sender=other)
        assert row_counts(db_path) == counts
        same = await ref.signal(Ticket.reply, Reply(text="a"), message_id="m-1", sender="alice")
        status = await ref.query(Ticket.status)
    assert same.status == "duplicate"
    assert same.seq == 1
    assert status.inbox == ["acme:a"]


async def test_message_ids_are_scoped_to_one_entity(db_path: str) -> None:
    a, b = fresh_key(), fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ack_a = await rt.ref(Ticket, a).signal_with_start(Ticket.reply, Reply(text="1"),
                                                          start=START, message_id="shared")
        ack_b = await rt.ref(Ticket, b).signal_with_start(Ticket.reply, Reply(text="2"),
                                                          start=START, message_id="shared")
    assert ack_a.status == ack_b.status == "accepted"


async def test_an_update_id_reused_returns_the_original_result_without_rerunning(
    db_path: str,
) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        first = await ref.update_with_start(Ticket.assign, Assign(agent="ann"), start=START,
                                            update_id="u-1")
        again = [await ref.update(Ticket.assign, Assign(agent="ann"), update_id="u-1")
                 for _ in range(3)]
        together = await asyncio.gather(*(
            ref.update_with_start(Ticket.assign, {"agent": "ann"}, start=START, update_id="u-1")
            for _ in range(20)
        ))
        second = await ref.update(Ticket.assign, Assign(agent="bo"), update_id="u-2")
        with pytest.raises(corral.IdempotencyConflictError):
            await ref.update(Ticket.assign, Assign(agent="cy"), update_id="u-1")
        status = await ref.query(Ticket.status)

    assert first == Assigned(agent="ann", number=1)
    assert again == [first] * 3
    assert together == [first] * 20
    assert second == Assigned(agent="bo", number=2)
    assert status.assignments == ["ann", "bo"]
    assert list(assert_init_first(key).values()) == [["assign:ann", "assign:bo"]]


async def test_dedupe_survives_reopening_the_store(db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        original = await ref.signal_with_start(Ticket.reply, Reply(text="a"), start=START,
                                               message_id="m-1", sender="alice")
        result = await ref.update(Ticket.assign, Assign(agent="ann"), update_id="u-1")

    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        dup = await ref.signal_with_start(Ticket.reply, Reply(text="a"), start=START,
                                          message_id="m-1", sender="alice")
        with pytest.raises(corral.IdempotencyConflictError):
            await ref.signal(Ticket.reply, Reply(text="changed"), message_id="m-1",
                             sender="alice")
        again = await ref.update(Ticket.assign, Assign(agent="ann"), update_id="u-1")
        status = await ref.query(Ticket.status)

    assert dup.status == "duplicate"
    assert (dup.run_id, dup.seq) == (original.run_id, original.seq)
    assert again == result
    assert status.inbox == ["acme:a"]
    assert status.assignments == ["ann"]
    per_instance = assert_init_first(key)
    assert len(per_instance) == 2  # the reopened host replayed; nothing ran twice live
    assert all(events == ["reply:a", "assign:ann"] for events in per_instance.values())


async def test_a_duplicate_of_a_message_to_a_closed_run_starts_no_new_run(db_path: str) -> None:
    key = fresh_key("job")
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Job, key)
        await ref.signal_with_start(Job.poke, Poke(n=1), start=START, message_id="m-1")
        await ref.signal(Job.finish, Finish(mode="complete"), message_id="m-2")
        await ref.result(timeout=30)
        dup = await ref.signal_with_start(Job.poke, Poke(n=1), start=START, message_id="m-1")
        info = await ref.describe()
    assert (dup.status, dup.run_id, dup.seq, dup.started) == ("duplicate", 1, 1, False)
    assert info.status is corral.RunStatus.COMPLETED
    assert [r.run_id for r in info.runs] == [1]


async def test_generated_message_ids_never_collide(db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        ref = rt.ref(Ticket, key)
        acks = await asyncio.gather(*(
            ref.signal_with_start(Ticket.reply, Reply(text="same"), start=START)
            for _ in range(50)
        ))
        await wait_applied(ref, 50)
        status = await ref.query(Ticket.status)
    assert {a.status for a in acks} == {"accepted"}
    assert len(status.inbox) == 50


# Python 3.12+ warns of fork() while threads run (a session's Ray or metrics threads); the
# child here only draws ids and writes them to a pipe.
@pytest.mark.filterwarnings("ignore:This process.*multi-threaded:DeprecationWarning")
def test_a_forked_child_never_repeats_its_parents_message_ids() -> None:
    # The random bits are drawn from a buffer: a child that kept its parent's buffer
    # would make the very ids the parent makes next.
    new_message_id()  # the buffer is filled
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, then out at once
        os.write(write, "\n".join(new_message_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    parent = {new_message_id().split("-")[1] for _ in range(100)}
    with os.fdopen(read) as pipe:
        child = {line.split("-")[1] for line in pipe.read().splitlines()}
    os.waitpid(pid, 0)
    assert len(child) == 100
    assert parent.isdisjoint(child)


def test_threads_never_draw_the_same_message_id() -> None:
    # Threads switched every microsecond, all drawing at once: a buffer read and then
    # advanced in two steps hands two of them the same bits (this catches it).
    start = threading.Barrier(8)

    def draw(_: int) -> list[str]:
        start.wait()
        return [new_message_id().split("-")[1] for _ in range(20_000)]

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(8) as pool:
            drawn = [bits for part in pool.map(draw, range(8)) for bits in part]
    finally:
        sys.setswitchinterval(interval)
    assert len(set(drawn)) == len(drawn) == 160_000
