"""Failures stay where they belong (guarantee 14): one op that fails inside a group
commit fails only its own caller, and every error path leaves the connection clean.

The injected failing ops are written against each store's own transaction (`txn.db`,
a sqlite3 connection; `txn.conn`, an asyncpg one), and fail the same two ways on both."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

import corral
from entities import Reply, Start, Ticket, fresh_key, wait_applied
from stores import is_postgres, sql

START = Start(tenant="acme")


@dataclass(frozen=True)
class UnbindableOp:
    """Writes a value the driver cannot encode (a lone surrogate): fails at bind time."""

    def apply(self, txn: Any) -> None:
        txn.db.execute("INSERT INTO timers (etype, key, run_id, timer_id, shard, due_at) "
                       "VALUES (?, 'k', 1, 't', 0, 0)", ("\ud800",))


@dataclass(frozen=True)
class HalfWrittenOp:
    """Writes a row, then fails with a bug that is not a refusal."""

    def apply(self, txn: Any) -> None:
        txn.db.execute("INSERT INTO timers (etype, key, run_id, timer_id, shard, due_at) "
                       "VALUES ('Ghost', 'k', 1, 't', 0, 0)")
        raise RuntimeError("op bug after a write")


@dataclass(frozen=True)
class PgUnbindableOp:
    """`UnbindableOp` in a `PostgresStore` batch: asyncpg cannot encode the value."""

    buffered: ClassVar[bool] = False

    def plan(self, plan: Any) -> None:
        pass

    async def apply(self, txn: Any) -> None:
        await txn.conn.execute("INSERT INTO timers (etype, key, run_id, timer_id, shard, "
                               "due_at) VALUES ($1, 'k', 1, 't', 0, 0)", "\ud800")


@dataclass(frozen=True)
class PgHalfWrittenOp:
    """`HalfWrittenOp` in a `PostgresStore` batch."""

    buffered: ClassVar[bool] = False

    def plan(self, plan: Any) -> None:
        pass

    async def apply(self, txn: Any) -> None:
        await txn.conn.execute("INSERT INTO timers (etype, key, run_id, timer_id, shard, "
                               "due_at) VALUES ('Ghost', 'k', 1, 't', 0, 0)")
        raise RuntimeError("op bug after a write")


def caused_by(err: BaseException, kind: type[BaseException]) -> bool:
    """Whether `err`'s chain of causes holds a `kind` (asyncpg wraps the encoding error
    that sqlite3 raises bare)."""
    cause = err.__cause__
    while cause is not None and not isinstance(cause, kind):
        cause = cause.__cause__ or cause.__context__
    return cause is not None


def failing_ops(db_path: str) -> tuple[Any, Any]:
    """(an op that fails at bind time, an op that fails after a write), for this store."""
    if is_postgres(db_path):
        return PgUnbindableOp(), PgHalfWrittenOp()
    return UnbindableOp(), HalfWrittenOp()


async def test_a_failing_op_in_a_batch_of_valid_sends_fails_alone_with_its_own_error(
    db_path: str,
) -> None:
    keys = [fresh_key() for _ in range(20)]
    async with corral.open_runtime(db_path, entities=[Ticket]) as rt:
        store: Any = rt.store
        unbindable, half_written = failing_ops(db_path)
        sends = [rt.ref(Ticket, k).signal_with_start(Ticket.reply, Reply(text="ok"),
                                                     start=START, message_id=f"m-{k}")
                 for k in keys]
        results = await asyncio.gather(
            store.write(unbindable), *sends[:10], store.write(half_written),
            *sends[10:], return_exceptions=True)
        bad = [results[0], results[11]]
        acks = results[1:11] + results[12:]
        assert all(isinstance(a, corral.Ack) and a.status == "accepted" for a in acks), acks
        assert all(isinstance(e, corral.StoreError) for e in bad), bad
        assert bad[0] is not bad[1]
        assert caused_by(bad[0], UnicodeEncodeError)
        assert isinstance(bad[1].__cause__, RuntimeError)
        # The connection is clean: the next send commits.
        after = await rt.ref(Ticket, keys[0]).signal(Ticket.reply, Reply(text="next"))
        assert after.status == "accepted"
        await wait_applied(rt.ref(Ticket, keys[0]), 2)
    assert sql(db_path, "SELECT count(*) FROM timers WHERE etype='Ghost'") == [(0,)]
    assert sql(db_path, "SELECT count(*) FROM journal") == [(len(keys) + 1,)]


async def test_a_batch_that_fails_whole_gives_each_caller_a_distinct_error_with_a_cause(
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Ticket]) as rt:
        store: Any = rt.store
        unbindable, _ = failing_ops(db_path)
        errors = await asyncio.gather(*(store.write(unbindable) for _ in range(5)),
                                      return_exceptions=True)
        assert all(isinstance(e, corral.StoreError) for e in errors)
        assert len({id(e) for e in errors}) == 5
        assert all(caused_by(e, UnicodeEncodeError) for e in errors
                   if isinstance(e, BaseException))
        ack = await rt.ref(Ticket, fresh_key()).signal_with_start(
            Ticket.reply, Reply(text="ok"), start=START)
    assert ack.status == "accepted"


@pytest.mark.parametrize("bad", [
    {"message_id": "m-\ud800"}, {"sender": "\udc00"}, {"message_id": "m\x00"},
], ids=["surrogate message id", "surrogate sender", "NUL message id"])
async def test_a_bad_id_among_concurrent_valid_sends_is_refused_and_they_all_commit(
    db_path: str, bad: dict[str, str],
) -> None:
    keys = [fresh_key() for _ in range(20)]
    async with corral.open_runtime(db_path, entities=[Ticket]) as rt:
        calls = [rt.ref(Ticket, k).signal_with_start(Ticket.reply, Reply(text="ok"),
                                                     start=START) for k in keys]
        calls.insert(7, rt.ref(Ticket, keys[0]).signal_with_start(
            Ticket.reply, Reply(text="bad"), start=START, **bad))
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(results.pop(7), corral.InvalidKeyError)
        assert all(isinstance(a, corral.Ack) for a in results), results
        ack = await rt.ref(Ticket, keys[1]).signal(Ticket.reply, Reply(text="next"))
    assert ack.status == "accepted"
    assert sql(db_path, "SELECT count(*) FROM journal") == [(len(keys) + 1,)]


async def test_accept_many_answers_each_acceptance_and_a_refusal_stays_its_own(
    db_path: str,
) -> None:
    """`LocalBackend.accept_many` (what a Ray shard actor runs for a client's batch): one
    group commit; an acceptance the store refuses (a message id reused with another
    payload, a plain signal to an entity never started) gets its own error as its
    result, the others are accepted and applied."""
    from corral.persistence import Acceptance, EntryKind, canonical_json, payload_hash
    from corral.runtime.host._local_backend import LocalBackend

    async with corral.open_runtime(db_path, entities=[Ticket]) as rt:
        backend = rt.backend
        assert isinstance(backend, LocalBackend)
        ref, never = rt.ref(Ticket, fresh_key()), rt.ref(Ticket, fresh_key())
        await ref.signal_with_start(Ticket.reply, Reply(text="first"), start=START,
                                    message_id="m-0")
        start = canonical_json({"tenant": "acme"})

        def acc(target: Any, mid: str, text: str, *, with_start: bool = True) -> Acceptance:
            payload = canonical_json({"text": text})
            return Acceptance("Ticket", target.key, target.shard, EntryKind.SIGNAL, "reply",
                              mid, payload, payload_hash("reply", payload), None,
                              start if with_start else None,
                              Ticket._corral_definition.id_reuse, 1000.0)

        results = await backend.accept_many([
            acc(ref, "m-1", "one"), acc(ref, "m-0", "changed"),
            acc(never, "m-9", "lost", with_start=False), acc(ref, "m-2", "two"),
            acc(ref, "m-1", "one")])
        one, conflict, not_running, two, again = results
        assert isinstance(conflict, corral.IdempotencyConflictError)
        assert isinstance(not_running, corral.EntityNotRunningError)
        assert not isinstance(one, Exception)
        assert not isinstance(two, Exception)
        assert not isinstance(again, Exception)
        assert [(r.duplicate, r.entry.seq) for r in (one, two, again)] == \
            [(False, 2), (False, 3), (True, 2)]
        await wait_applied(ref, 3)
        assert (await ref.query(Ticket.status)).inbox == ["acme:first", "acme:one", "acme:two"]
    assert sql(db_path, "SELECT count(*) FROM journal") == [(3,)]


async def test_closing_a_store_commits_what_is_queued_and_refuses_every_later_write(
    db_path: str,
) -> None:
    """`close` lets the writer commit the batch already queued (each of its callers gets
    its ack), then refuses writes with a `StoreError`, on both stores."""
    keys = [fresh_key() for _ in range(5)]
    async with corral.open_runtime(db_path, entities=[Ticket]) as rt:
        store: Any = rt.store
        sends = [asyncio.ensure_future(rt.ref(Ticket, k).signal_with_start(
            Ticket.reply, Reply(text="ok"), start=START, message_id=f"m-{k}")) for k in keys]
        await asyncio.sleep(0)  # every send has joined the queued batch
        await store.close()
        acks = await asyncio.wait_for(asyncio.gather(*sends), 10)
        assert [a.status for a in acks] == ["accepted"] * len(keys)
        with pytest.raises(corral.StoreError, match="closed"):
            await asyncio.wait_for(
                rt.ref(Ticket, keys[0]).signal(Ticket.reply, Reply(text="late")), 10)
        with pytest.raises(corral.StoreError, match="closed"):
            await asyncio.wait_for(store.accept_many([]), 10)
    assert sql(db_path, "SELECT count(*) FROM journal") == [(len(keys),)]


async def test_an_op_queued_during_a_commit_joins_the_next_ops_of_the_callers_it_answered(
) -> None:
    """The writer takes its next batch only after the callers its last commit answered
    queued their next ops: an op queued while it committed (a snapshot, every
    `SnapshotPolicy.every` messages) shares their commit instead of taking one, and a
    sync, of its own while they wait."""
    from corral.persistence._batch import CommitQueue

    queue: CommitQueue[str] = CommitQueue("sqlite")
    taken: list[list[str]] = []
    first_commit: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def writer() -> None:
        async for batch in queue.batches():
            taken.append(list(batch.ops))
            if len(taken) == 1:
                await first_commit  # held until the test has queued the snapshot
            await asyncio.sleep(0)  # every commit takes a turn of the loop, at least
            batch.settle(batch.ops)

    async def caller(name: str) -> None:
        await queue.write(f"{name}-1")
        await queue.write(f"{name}-2")

    task = asyncio.create_task(writer())
    callers = asyncio.gather(*(caller(name) for name in "abc"))
    while not taken:  # a-1, b-1, c-1 are committing...
        await asyncio.sleep(0)
    snapshot = asyncio.ensure_future(queue.write("snapshot"))
    await asyncio.sleep(0)  # ...when the snapshot is queued
    first_commit.set_result(None)
    await asyncio.gather(callers, snapshot)
    await queue.close()
    await task
    assert taken == [["a-1", "b-1", "c-1"], ["snapshot", "a-2", "b-2", "c-2"]]
