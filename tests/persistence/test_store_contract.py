"""The store contract: every `Store` op answers the same on both engines.

Each test here runs twice, on SQLite and on PostgreSQL (`db_path`: a fresh SQLite file,
or the session's PostgreSQL database emptied; `tests/conftest.py`), through the public
`Store` protocol only (and `commits`, the count of group commits both stores keep):
`open_store` opens either, ops are built as the runtime builds them (`acceptances.py`),
rows are read with `stores.sql`, which takes either location.
Two store objects on one location are two writers, as two processes are. What only one
engine has (SQLite's file locks and WAL, PostgreSQL's NOTIFY, advisory locks, server
faults, each engine's schema migrations) is tested in that engine's own files:
`test_postgres_store.py`, `test_postgres_faults.py`, `test_sqlite_lock_files.py`,
`test_schema.py`; `test_postgres_parity.py` walks both side by side at random.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator

import pytest

import corral
from acceptances import acc, fence_for, opened, tail_all
from corral import WaitStatus
from corral.persistence import (
    AcceptResult,
    BuildRecord,
    DeliveryRequest,
    EntryKind,
    Fence,
    Purged,
    Send,
    StepAttempts,
    StepRecord,
    Store,
    Suspension,
    UpdateOutcome,
    open_store,
)
from corral.persistence._tables import TABLES
from procs import wait_until
from stores import sql

SHARDS = 16


@pytest.fixture
async def store(db_path: str) -> AsyncIterator[Store]:
    """The store under test, on the engine of this test's `db_path` parameter."""
    async with opened(db_path, SHARDS) as s:
        yield s


@pytest.fixture
async def other(db_path: str) -> AsyncIterator[Store]:
    """A second store on the same location: another writer, as another process has."""
    async with opened(db_path, SHARDS) as s:
        yield s


# -- acceptance: atomic start, dedupe, linearised seqs -------------------------------


async def test_a_message_id_is_accepted_once_then_answered_duplicate_or_conflicting(
    store: Store,
) -> None:
    first = await store.accept(acc("k", "m1"))
    assert (first.duplicate, first.started, first.entry.seq, first.entry.run_id) == (
        False, True, 1, 1)
    again = await store.accept(acc("k", "m1"))
    assert (again.duplicate, again.entry.seq, again.started) == (True, 1, False)
    assert again.entry.accepted_at == first.entry.accepted_at  # the original acceptance
    with pytest.raises(corral.IdempotencyConflictError, match="different payload"):
        await store.accept(acc("k", "m1", payload='{"v":2}'))
    with pytest.raises(corral.IdempotencyConflictError, match="sender"):
        await store.accept(acc("k", "m1", sender="mallory"))
    second = await store.accept(acc("k", "m2", start=None))
    assert (second.duplicate, second.started, second.entry.seq) == (False, False, 2)
    assert [e.message_id for e in await store.journal("E", "k", run_id=1, after_seq=0)] == [
        "m1", "m2"]

async def test_one_message_id_twice_in_one_batch_is_one_acceptance_and_one_duplicate(
    store: Store,
) -> None:
    before = store.commits
    a, b, c = await asyncio.gather(store.accept(acc("k", "m")), store.accept(acc("k", "m")),
                                   store.accept(acc("k", "m", payload='{"v":9}')),
                                   return_exceptions=True)
    assert store.commits == before + 1  # one group commit
    assert isinstance(a, AcceptResult)
    assert (a.duplicate, a.started) == (False, True)
    assert isinstance(b, AcceptResult)
    assert b.duplicate
    assert isinstance(c, corral.IdempotencyConflictError)
    assert len(await store.journal("E", "k", run_id=1, after_seq=0)) == 1

async def test_two_stores_sending_at_once_start_one_run_and_never_repeat_a_seq(
    store: Store, other: Store,
) -> None:
    sends = [s.accept(acc("hot", f"{i}-{n}")) for n in range(150)
             for i, s in enumerate((store, other))]
    results = await asyncio.gather(*sends)
    assert sum(r.started for r in results) == 1
    assert {r.entry.run_id for r in results} == {1}
    assert sorted(r.entry.seq for r in results) == list(range(1, 301))
    stored = await store.journal("E", "hot", run_id=1, after_seq=0)
    assert {e.seq: e.message_id for e in stored} == {
        r.entry.seq: r.entry.message_id for r in results}

async def test_accept_many_answers_each_acceptance_and_a_refusal_stays_its_own(
    store: Store,
) -> None:
    results = await store.accept_many([
        acc("k", "m1"), acc("k", "m1", payload='{"v":2}'), acc("never", "x", start=None),
        acc("k", "m2", start=None)])
    first, conflict, not_running, second = results
    assert isinstance(first, AcceptResult)
    assert (first.started, first.entry.seq) == (True, 1)
    assert isinstance(conflict, corral.IdempotencyConflictError)
    assert isinstance(not_running, corral.EntityNotRunningError)
    assert isinstance(second, AcceptResult)
    assert (second.started, second.entry.seq) == (False, 2)
    assert [e.message_id for e in await store.journal("E", "k", run_id=1, after_seq=0)] == [
        "m1", "m2"]
    assert await store.latest_run("E", "never") is None


async def test_the_journal_tail_reads_each_entry_once_in_order_for_the_shards_asked(
    store: Store, other: Store,
) -> None:
    """In acceptance order within a shard; across shards no order is promised (SQLite
    tails by one global position, PostgreSQL by one position per shard)."""
    start = await store.journal_end()
    for i in range(6):
        await other.accept(acc(f"k{i}", "m", shard=1 + i % 2))
    _, odd = await store.journal_tail(start, frozenset({1}))
    assert [e.key for e in odd] == ["k0", "k2", "k4"]
    pos, page = await store.journal_tail(start, frozenset({1, 2}), limit=2)
    assert len(page) == 2
    pos, rest = await store.journal_tail(pos, frozenset({1, 2}))
    tailed = page + rest
    assert sorted(e.key for e in tailed) == [f"k{i}" for i in range(6)]  # each once
    for shard in (1, 2):
        assert [e.key for e in tailed if int(e.key[1:]) % 2 == shard - 1] == [
            f"k{i}" for i in range(shard - 1, 6, 2)]
    assert {(e.seq, e.run_id) for e in tailed} == {(1, 1)}
    assert await store.journal_tail(pos, frozenset({1, 2})) == (pos, [])
    end = await store.journal_end()
    assert await store.journal_tail(end, frozenset({1, 2})) == (end, [])


async def test_the_journal_tail_moves_past_a_page_of_other_shards_entries(
    store: Store, other: Store,
) -> None:
    """A host of shard 1 is never stuck behind a page that holds only shard 2's entries."""
    pos = await store.journal_end()
    for i in range(3):
        await other.accept(acc(f"theirs{i}", "m", shard=2))
    await other.accept(acc("mine", "m", shard=1))
    mine: list[str] = []
    for _ in range(10):
        pos, page = await store.journal_tail(pos, frozenset({1}), limit=2)
        mine += [e.key for e in page]
        if mine:
            break
    assert mine == ["mine"]
    assert await store.journal_tail(pos, frozenset({1})) == (pos, [])


async def test_the_journal_tail_never_leaves_out_another_stores_entry_between_its_own(
    store: Store, other: Store,
) -> None:
    """A store may leave its own commits out of its tail (its process had them in hand
    when it committed them), never another's: entries of another writer, committed
    between its own single and grouped commits, each come back once, in order."""
    pos = await store.journal_end()
    await store.accept(acc("warm", "m", shard=1))
    theirs = []
    for i in range(12):
        await other.accept(acc(f"theirs{i}", "m", shard=1))
        theirs.append(f"theirs{i}")
        if i % 3 == 0:
            await store.accept_many([acc(f"own{i}-{j}", "m", shard=1) for j in range(3)])
        elif i % 3 == 1:
            await store.accept(acc(f"own{i}", "m", shard=1))
    pos, keys = await tail_all(store, pos, frozenset({1}))
    assert [k for k in keys if k.startswith("theirs")] == theirs
    assert len(keys) == len(set(keys))
    await other.accept(acc("last", "m", shard=1))
    assert (await tail_all(store, pos, frozenset({1})))[1] == ["last"]


async def test_another_stores_commit_on_a_held_shard_is_seen(store: Store, other: Store) -> None:
    await store.acquire_leases("h", [5], 60.0)
    await other.accept(acc("k", "theirs", shard=5))
    await wait_until(lambda: store.wait_foreign_commit(0.5), "the foreign commit is seen")


async def test_a_closed_store_refuses_the_commit_poll_even_right_after_its_last_batch(
        db_path: str) -> None:
    """A host's journal tail may poll a store closed under it. SQLite answered that poll
    without asking the file when a batch had just read its version (the last commit
    before the close), so a closed store returned False instead of refusing: the
    flake of `test_close.py` under load."""
    async with opened(db_path, SHARDS) as store:
        await store.acquire_leases("h", [1], 60.0)
        await store.accept(acc("k", "m1", shard=1))  # a batch reads the data version
        await store.close()
        with pytest.raises(corral.StoreError, match="closed"):
            await store.foreign_commit_seen()
        with pytest.raises(corral.StoreError, match="closed"):
            await store.wait_foreign_commit(0)


# -- closed runs, id reuse, continue-as-new ------------------------------------------


async def test_closed_runs_follow_the_id_reuse_policy(store: Store) -> None:
    fence = await fence_for(store, 1)
    await store.accept(acc("k", "a"))
    assert await store.close_run(fence, "E", "k", 1, applied_seq=0, status=corral.RunStatus
                                 .COMPLETED, result=None, error=None) is False  # unapplied
    assert await store.close_run(fence, "E", "k", 1, applied_seq=1,
                                 status=corral.RunStatus.COMPLETED, result='"ok"', error=None)
    with pytest.raises(corral.EntityNotRunningError, match="is completed"):
        await store.accept(acc("k", "b", start=None))
    for policy in (corral.IdReusePolicy.REJECT_DUPLICATE,
                   corral.IdReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY):
        with pytest.raises(corral.EntityClosedError, match=policy.name):
            await store.accept(acc("k", "b", reuse=policy))
    second = await store.accept(acc("k", "b"))
    assert (second.started, second.entry.run_id, second.entry.seq) == (True, 2, 2)
    await store.accept(acc("k", "c", start=None))
    assert await store.close_run(fence, "E", "k", 2, applied_seq=2, status=corral.RunStatus
                                 .FAILED, result=None, error="boom", force=True)
    third = await store.accept(acc("k", "d", reuse=corral.IdReusePolicy
                                   .ALLOW_DUPLICATE_FAILED_ONLY))
    assert (third.started, third.entry.run_id, third.entry.seq) == (True, 3, 4)
    await store.accept(acc("k", "t", kind=EntryKind.TERMINATE, start=None, payload='"bye"'))
    with pytest.raises(corral.EntityNotRunningError, match="nothing to terminate"):
        await store.accept(acc("k", "t2", kind=EntryKind.TERMINATE, start=None))
    runs = await store.runs("E", "k")
    assert [(r.run_id, r.status.value, r.first_seq) for r in runs] == [
        (1, "completed", 1), (2, "failed", 2), (3, "terminated", 4)]
    assert (runs[1].error, runs[2].error) == ("boom", '"bye"')

async def test_continue_as_new_carries_unapplied_and_untaken_entries_and_the_dedupe_window(
    store: Store,
) -> None:
    fence = await fence_for(store, 1)
    for mid in ("m1", "m2", "m3", "m4"):
        await store.accept(acc("k", mid))
    old = await store.journal("E", "k", run_id=1, after_seq=0)
    floor = await store.write_snapshot(fence, "E", "k", 1, applied_seq=2, state=b"s", keep=1)
    assert floor == 2  # m1 and m2 left the journal
    # Applied up to 3; m2 was applied into the mailbox but never taken: carried (re-inserted).
    new = await store.continue_as_new(fence, "E", "k", 1, applied_seq=3, next_input='{"n":2}',
                                      carried=[old[1]])
    assert new == 2
    carried = await store.journal("E", "k", run_id=2, after_seq=0)
    assert [(e.seq, e.message_id, e.run_id) for e in carried] == [(2, "m2", 2), (4, "m4", 2)]
    assert await store.latest_snapshot("E", "k", 1) is None
    late = await store.accept(acc("k", "m5", start=None))
    assert (late.entry.run_id, late.entry.seq) == (2, 5)
    assert (await store.accept(acc("k", "m1"))).duplicate  # the window carried over
    runs = await store.runs("E", "k")
    assert [(r.status.value, r.continued_from, r.first_seq) for r in runs] == [
        ("continued", None, 1), ("running", 1, 4)]
    assert runs[1].start_input == '{"n":2}'
    with pytest.raises(corral.EntityNotRunningError, match="no longer running"):
        await store.continue_as_new(fence, "E", "k", 1, applied_seq=3, next_input="{}",
                                    carried=[])

# -- bounded storage ------------------------------------------------------------------


async def test_snapshots_keep_the_newest_and_truncate_the_journal_and_the_window(
    store: Store, db_path: str,
) -> None:
    fence = await fence_for(store, 1)
    for n in range(1, 11):
        await store.accept(acc("k", f"m{n}"))
    assert await store.write_snapshot(fence, "E", "k", 1, applied_seq=4, state=b"4", keep=2) == 4
    assert await store.write_snapshot(fence, "E", "k", 1, applied_seq=6, state=b"6", keep=2) == 4
    assert await store.write_snapshot(fence, "E", "k", 1, applied_seq=8, state=b"8", keep=2,
                                      forget_seq=5) == 6
    assert await store.latest_snapshot("E", "k", 1) == (8, b"8")
    kept = sql(db_path, "SELECT applied_seq FROM snapshots ORDER BY 1")
    assert [r[0] for r in kept] == [6, 8]
    assert [e.seq for e in await store.journal("E", "k", run_id=1, after_seq=0)] == [
        7, 8, 9, 10]
    ids = sql(db_path, "SELECT message_id FROM dedupe ORDER BY seq")
    assert [r[0] for r in ids] == [f"m{n}" for n in range(6, 11)]  # m1..m5 forgotten
    assert not (await store.accept(acc("k", "m1", start=None))).duplicate
    assert (await store.accept(acc("k", "m6"))).duplicate  # still in the window
    # Passivated with everything applied: not recovered at startup until a message comes.
    await store.write_snapshot(fence, "E", "k", 1, applied_seq=11, state=b"11", keep=1,
                               passivate=True)
    assert await _recovery(store, 1, 0.0) == []
    await store.accept(acc("k", "wake", start=None))
    assert await _recovery(store, 1, 0.0) == [("E", "k", True)]  # a backlog

async def _recovery(store: Store, shard: int, now: float) -> list[tuple[str, str, bool]]:
    """The shard's running entities as a host taking it reads them: (type, key, urgent)."""
    urgent = set((await store.urgent_entities([shard], now))[shard])
    return [(etype, key, (etype, key) in urgent)
            for etype, key in (await store.running_entities([shard]))[shard]]


async def test_reads_list_entities_page_by_page_and_count_the_running_per_shard(
    store: Store,
) -> None:
    fence = await fence_for(store, 1)
    for key in ("b", "a", "c"):
        await store.accept(acc(key, "m"))
    await store.accept(acc("x", "m", shard=2, etype="T"))
    await store.close_run(fence, "E", "c", 1, applied_seq=1, status=corral.RunStatus.COMPLETED,
                          result='"done"', error=None)
    page = await store.entities(None, None, limit=2)
    assert [(e.entity_type, e.key, e.shard, e.run_id) for e in page] == [
        ("E", "a", 1, 1), ("E", "b", 1, 1)]
    rest = await store.entities(None, None, limit=10, after=("E", "b"))
    assert [(e.entity_type, e.key) for e in rest] == [("E", "c"), ("T", "x")]
    assert [e.key for e in await store.entities("T", None, limit=10)] == ["x"]
    closed = await store.entities(None, corral.RunStatus.COMPLETED, limit=10)
    assert [(e.key, e.status, e.accepted_seq) for e in closed] == [
        ("c", corral.RunStatus.COMPLETED, 1)]
    latest = await store.latest_run("E", "c")
    assert latest is not None
    run, next_seq = latest
    assert (run.run_id, run.status, run.result, next_seq) == (
        1, corral.RunStatus.COMPLETED, '"done"', 2)
    assert (await store.count_running(1), await store.count_running(2)) == (2, 1)
    assert sorted(await _recovery(store, 1, 0.0)) == [
        ("E", "a", True), ("E", "b", True)]  # nothing applied yet: a backlog each


async def test_the_recovery_read_marks_urgent_a_backlog_and_a_due_timer_of_the_shard(
    store: Store,
) -> None:
    fence = await fence_for(store, 1)
    for key in ("a", "b", "c"):
        await store.accept(acc(key, "m"))
    await store.accept(acc("b", "m", shard=2, etype="T"))
    await store.record_progress(fence, [("E", key, 1, 0) for key in "abc"], at=1.0)
    assert sorted(await _recovery(store, 1, 30.0)) == [
        ("E", "a", False), ("E", "b", False), ("E", "c", False)]  # all applied
    await store.set_timer(fence, "E", "a", 1, "t", 50.0)
    await store.set_timer(fence, "E", "b", 1, "t", 20.0)
    await store.set_timer(await fence_for(store, 2), "T", "b", 1, "t", 10.0)
    await store.accept(acc("c", "again"))
    assert sorted(await _recovery(store, 1, 30.0)) == [
        ("E", "a", False), ("E", "b", True), ("E", "c", True)]  # due; a backlog
    assert await _recovery(store, 2, 30.0) == [("T", "b", True)]
    running = await store.running_entities([3, 2, 1])  # one read, each shard its own
    urgent = await store.urgent_entities([3, 2, 1], 30.0)
    assert {shard: sorted(found) for shard, found in running.items()} == {
        1: [("E", "a"), ("E", "b"), ("E", "c")], 2: [("T", "b")], 3: []}
    assert {shard: sorted(found) for shard, found in urgent.items()} == {
        1: [("E", "b"), ("E", "c")], 2: [("T", "b")], 3: []}


async def test_a_passivated_entity_is_marked_and_an_activation_unmarks_it(
    store: Store,
) -> None:
    fence = await fence_for(store, 1)
    await store.accept(acc("k", "m"))
    await store.write_snapshot(fence, "E", "k", 1, applied_seq=1, state=b"1", keep=1,
                               passivate=True)
    [record] = await store.entities("E", None, limit=10)
    assert record.passivated_seq == 1
    assert await store.count_running(1) == 1  # passivated, still running
    await store.mark_activated(fence, "E", "k")
    [record] = await store.entities("E", None, limit=10)
    assert record.passivated_seq is None


async def test_an_update_outcome_is_recorded_once_under_its_message_id(
    store: Store,
) -> None:
    fence = await fence_for(store, 1)
    await store.accept(acc("k", "u1", kind=EntryKind.UPDATE, name="ask"))
    assert await store.update_outcome("E", "k", "u1") is None  # not applied yet
    await store.record_update(fence, "E", "k", "u1", UpdateOutcome('{"answer":42}', None))
    assert await store.update_outcome("E", "k", "u1") == UpdateOutcome('{"answer":42}', None)
    assert await store.update_outcome("E", "k", "u2") is None
    with pytest.raises(corral.LeaseLostError):
        await store.record_update(Fence(1, "host", 99), "E", "k", "u1",
                                  UpdateOutcome(None, "late"))
    assert await store.update_outcome("E", "k", "u1") == UpdateOutcome('{"answer":42}', None)


async def test_durable_timers_are_due_by_shard_and_a_cleared_one_is_gone(store: Store) -> None:
    fence = await fence_for(store, 1)
    for key in ("a", "b"):
        await store.accept(acc(key, "m"))
    await store.set_timer(fence, "E", "a", 1, "t", 50.0)
    await store.set_timer(fence, "E", "b", 1, "t", 20.0)
    assert await store.next_timer(frozenset({1})) == 20.0
    assert await store.next_timer(frozenset({2})) is None
    assert await store.due_timers(frozenset({1}), 30.0) == [("E", "b")]
    assert await store.due_timers(frozenset({2}), 60.0) == []
    assert sorted(await store.due_timers(frozenset({1}), 60.0)) == [("E", "a"), ("E", "b")]
    await store.set_timer(fence, "E", "b", 1, "t", None)
    assert await store.due_timers(frozenset({1}), 60.0) == [("E", "a")]
    assert (await store.entity_details("E", "a", 1)).timers == (50.0,)
    assert (await store.entity_details("E", "b", 1)).timers == ()


async def test_a_suspension_is_recorded_listed_and_cleared(store: Store) -> None:
    fence = await fence_for(store, 1)
    await store.accept(acc("k", "m"))
    record = Suspension("E", "k", 1, "RuntimeError: boom", 2, 10.0, 20.0)
    await store.suspend_run(fence, record)
    assert (await store.suspensions([1]))[1] == [record]
    assert (await store.suspensions([2]))[2] == []
    assert await store.suspensions([1, 2]) == {1: [record], 2: []}
    assert (await store.entity_details("E", "k", 1)).suspension == record
    assert [e.suspended for e in await store.entities("E", None, limit=10)] == [True]
    again = Suspension("E", "k", 1, "RuntimeError: boom", 3, 10.0, 40.0)
    await store.suspend_run(fence, again)  # replaces the entity's earlier record
    assert (await store.suspensions([1]))[1] == [again]
    await store.clear_suspension(fence, "E", "k", 1)
    assert (await store.suspensions([1]))[1] == []
    assert [e.suspended for e in await store.entities("E", None, limit=10)] == [False]


# -- durable signal waits ----------------------------------------------------------------


def delivery(name: str, key: str, *, early: str = "buffer") -> DeliveryRequest:
    """A delivery to wait `name` of entity "k" (shard 1), idempotent by `key`."""
    return DeliveryRequest("E", "k", 1, name, key, f'{{"by":"{key}"}}', None, early)


async def test_a_signal_wait_takes_one_delivery_buffered_or_open_and_times_out_by_itself(
    store: Store,
) -> None:
    fence = await fence_for(store, 1)
    with pytest.raises(corral.EntityNotRunningError):
        await store.deliver(delivery("approval", "d0"))  # no run to deliver to
    await store.accept(acc("k", "m"))
    early = await store.deliver(delivery("approval", "d1"))
    assert (early.status, early.wait and early.wait.status) == ("buffered", WaitStatus.BUFFERED)
    assert (await store.deliver(delivery("approval", "d1"))).status == "duplicate"
    assert (await store.deliver(delivery("other", "d9", early="reject"))).status == \
        "not_waiting"
    taken = await store.open_wait(fence, "E", "k", 1, "approval", deadline=None, now=100.0)
    assert (taken.status, taken.delivery_key, taken.payload) == (
        WaitStatus.DELIVERED, "d1", '{"by":"d1"}')
    waiting = await store.open_wait(fence, "E", "k", 1, "second", deadline=1e12, now=100.0)
    assert waiting.status == WaitStatus.OPEN
    assert [(w.name, w.status) for w in await store.signal_waits(None, limit=10)] == [
        ("second", WaitStatus.OPEN)]
    won = await store.deliver(delivery("second", "d2", early="reject"))
    assert won.status == "delivered"
    assert won.entry is not None
    assert (won.entry.kind, won.entry.name, won.entry.seq) == (EntryKind.DELIVER, "second", 2)
    assert (await store.deliver(delivery("second", "d3"))).status == "already_delivered"
    assert await store.signal_waits(None, limit=10) == []
    late = await store.open_wait(fence, "E", "k", 1, "third", deadline=1.0, now=0.5)
    assert late.status == WaitStatus.OPEN
    assert (await store.deliver(delivery("third", "d4"))).status == "stale"  # the store's clock
    expired = await store.expire_wait(fence, "E", "k", 1, "third", now=2.0)
    assert expired.status == WaitStatus.TIMED_OUT
    waits = (await store.entity_details("E", "k", 1)).waits
    assert sorted((w.name, w.status) for w in waits) == [
        ("approval", WaitStatus.DELIVERED), ("second", WaitStatus.DELIVERED),
        ("third", WaitStatus.TIMED_OUT)]


# -- dead letters ---------------------------------------------------------------------


async def test_a_dead_letter_is_recorded_once_replayed_once_and_discarded(
    store: Store,
) -> None:
    fence = await fence_for(store, 1)
    entry = (await store.accept(acc("k", "poison", payload='{"v":13}'))).entry
    dl = await store.record_dead_letter(fence, entry, error="ValueError: 13", traceback="tb",
                                        attempts=3, failed_at=5.0)
    assert await store.record_dead_letter(fence, entry, error="again", traceback="tb",
                                          attempts=4, failed_at=6.0) == dl
    [letter] = await store.dead_letters("E", "k")
    assert (letter.id, letter.seq, letter.payload, letter.error) == (dl, 1, '{"v":13}',
                                                                      "ValueError: 13")
    assert await store.dead_letter_seqs("E", "k", 1) == frozenset({1})
    replayed = await store.replay_dead_letter("E", "k", 1, dl, accepted_at=7.0)
    assert not replayed.duplicate
    assert (replayed.entry.seq, replayed.entry.message_id) == (2, f"replay:{dl}:poison")
    assert await store.dead_letters() == []
    retried = await store.replay_dead_letter("E", "k", 1, dl, accepted_at=8.0)
    assert (retried.duplicate, retried.entry.seq) == (True, 2)
    with pytest.raises(corral.DeadLetterNotFoundError):
        await store.replay_dead_letter("E", "k", 1, dl + 1000, accepted_at=9.0)
    other_dl = await store.record_dead_letter(fence, replayed.entry, error="e", traceback="",
                                              attempts=1, failed_at=9.0)
    assert other_dl > dl  # ids are never reused
    assert await store.discard_dead_letter("E", "k", other_dl) is True
    assert await store.discard_dead_letter("E", "k", other_dl) is False
    await store.accept(acc("k", "end", kind=EntryKind.TERMINATE, start=None))
    third = await store.record_dead_letter(fence, entry, error="e", traceback="", attempts=1,
                                           failed_at=9.0)
    with pytest.raises(corral.EntityNotRunningError, match="cannot replay"):
        await store.replay_dead_letter("E", "k", 1, third, accepted_at=10.0)
    assert [d.id for d in await store.dead_letters()] == [third]  # refused: nothing changed

async def test_a_forced_close_dead_letters_the_unapplied_and_settling_adds_nothing_twice(
    store: Store,
) -> None:
    fence = await fence_for(store, 1)
    for mid in ("m1", "m2", "m3"):
        await store.accept(acc("k", mid))
    assert await store.settle_run(fence, "E", "k", 1, applied_seq=1, failed_at=5.0) == 0
    assert await store.close_run(fence, "E", "k", 1, applied_seq=1, status=corral.RunStatus
                                 .FAILED, result=None, error="boom", force=True)
    assert await store.dead_letter_seqs("E", "k", 1) == frozenset({2, 3})
    letters = await store.dead_letters("E", "k")
    assert [(d.seq, d.message_id, d.run_id) for d in letters] == [(2, "m2", 1), (3, "m3", 1)]
    assert await store.settle_run(fence, "E", "k", 1, applied_seq=1, failed_at=6.0) == 0
    assert len(await store.dead_letters("E", "k")) == 2


async def test_dead_letters_are_read_page_by_page_and_by_entity(store: Store) -> None:
    fence = await fence_for(store, 1)
    ids = []
    for key in ("a", "b", "c"):
        entry = (await store.accept(acc(key, "poison"))).entry
        ids.append(await store.record_dead_letter(fence, entry, error="E", traceback="tb",
                                                  attempts=1, failed_at=1.0))
    assert ids == sorted(ids)
    first = await store.dead_letters(limit=2)
    assert [d.id for d in first] == ids[:2]
    assert [d.id for d in await store.dead_letters(limit=2, after=first[-1].id)] == ids[2:]
    assert [d.key for d in await store.dead_letters("E", "b")] == ["b"]
    assert await store.dead_letters("T") == []
    assert (await store.entity_details("E", "a", 1)).dead_letters == 1


# -- leases and fencing ---------------------------------------------------------------


async def test_a_lease_is_exclusive_until_it_expires_and_a_takeover_fences_the_old_holder(
    store: Store, other: Store, db_path: str,
) -> None:
    assert await store.acquire_leases("a", [1, 2], 0.5) == {1: 1, 2: 1}
    assert await other.acquire_leases("b", [1, 2, 3], 0.5) == {3: 1}  # 1 and 2 are live
    assert await store.acquire_leases("a", [1], 0.5) == {1: 1}  # ours: same epoch
    old = Fence(1, "a", 1)
    await wait_until(lambda: _expired(other, "b", 1), "a's lease on shard 1 expires")
    new = Fence(1, "b", 2)
    with pytest.raises(corral.LeaseLostError, match="epoch 1 of a"):
        await store.write_snapshot(old, "E", "k", 1, applied_seq=1, state=b"z", keep=1)
    with pytest.raises(corral.LeaseLostError):
        await store.set_timer(old, "E", "k", 1, "t", 1.0)
    assert sql(db_path, "SELECT * FROM snapshots") == []  # refused before writing
    assert sql(db_path, "SELECT * FROM timers") == []
    assert await store.renew_leases("a", {1: 1, 2: 1}, 0.5) == {2}
    await other.set_timer(new, "E", "k", 1, "t", 1.0)
    assert await other.acquire_leases("c", [1], 60.0, force=True) == {1: 3}
    with pytest.raises(corral.LeaseLostError):
        await other.set_timer(new, "E", "k", 1, "t", 2.0)

async def test_a_dead_holders_shards_are_taken_at_once_without_waiting_for_expiry(
    db_path: str, other: Store,
) -> None:
    dying = await open_store(db_path, shards=SHARDS)
    try:
        assert await dying.acquire_leases("dying", [7, 8], 3600.0) == {7: 1, 8: 1}
        assert await other.acquire_leases("heir", [7, 8], 60.0) == {}  # alive: live leases
    finally:
        await dying.close()  # its session ends, as a killed process's would
    assert await other.acquire_leases("heir", [7, 8], 60.0) == {7: 2, 8: 2}
    with pytest.raises(corral.LeaseLostError):
        await other.set_timer(Fence(7, "dying", 1), "E", "k", 1, "t", 1.0)

async def _expired(store: Store, owner: str, shard: int) -> bool:
    # The acquirer's lease term is the holder's: a SQLite store judges a lease expired
    # when it saw the row unchanged for its own term (`_sightings`).
    return shard in await store.acquire_leases(owner, [shard], 0.5)


async def test_released_leases_are_free_at_once_for_the_next_owner_and_fence_the_last(
    store: Store, other: Store,
) -> None:
    assert await store.acquire_leases("a", [1, 2], 600.0) == {1: 1, 2: 1}
    await store.release_leases("a")
    assert await other.acquire_leases("b", [1, 2], 60.0) == {1: 2, 2: 2}
    with pytest.raises(corral.LeaseLostError):
        await store.set_timer(Fence(1, "a", 1), "E", "k", 1, "t", 1.0)


# -- graceful shard hand-off (`_ops_handoff`): a requester asks, the holder's tick sees
# the request, the holder releases to it, the heir takes the shard at the next epoch and
# nobody else does until the reservation ends.


async def test_a_requested_shard_is_handed_to_the_requester_at_the_next_epoch_and_to_no_one_else(
    store: Store, other: Store,
) -> None:
    assert await store.acquire_leases("a", [1, 2], 600.0) == {1: 1, 2: 1}
    assert await store.lease_requests("a") == {}
    await other.request_leases("b", [1], 600.0)
    assert await store.lease_requests("a") == {1: "b"}
    assert await other.lease_offers("b") == set()  # asked, not yet released
    assert await store.hand_off_leases({Fence(1, "a", 1): "b"}, 600.0) == {1}
    assert await store.lease_requests("a") == {}  # the request is met
    assert await other.lease_offers("b") == {1}
    # The holder's writes are refused from now on, and it does not take the shard back;
    # nor does a third host, though the shard's lock is free now: it is reserved for b.
    with pytest.raises(corral.LeaseLostError):
        await store.set_timer(Fence(1, "a", 1), "E", "k", 1, "t", 1.0)
    assert await store.renew_leases("a", {1: 1, 2: 1}, 600.0) == {2}
    assert await store.acquire_leases("a", [1], 600.0) == {}
    assert await other.acquire_leases("c", [1], 600.0) == {}
    assert await other.acquire_leases("b", [1, 2], 600.0) == {1: 2}  # 2 is a's, live
    assert await other.lease_offers("b") == set()
    await other.set_timer(Fence(1, "b", 2), "E", "k", 1, "t", 1.0)
    # A stale fence hands nothing; the others of the same call are handed.
    assert await store.hand_off_leases({Fence(1, "a", 1): "c", Fence(2, "a", 1): "c"},
                                       600.0) == {2}
    assert await store.acquire_leases("c", [1, 2], 600.0) == {2: 2}


async def test_a_request_of_a_requester_that_stopped_renewing_it_expires(
    store: Store, other: Store,
) -> None:
    assert await store.acquire_leases("a", [3], 600.0) == {3: 1}
    await other.request_leases("b", [3], 0.3)

    async def expired() -> bool:
        return await store.lease_requests("a") == {}
    assert not await expired()
    await wait_until(expired, "b's request expires")


async def test_a_shard_released_to_an_heir_that_never_takes_it_is_anyones_after_one_term(
    store: Store, other: Store,
) -> None:
    assert await store.acquire_leases("a", [4], 600.0) == {4: 1}
    await other.request_leases("b", [4], 600.0)
    assert await store.hand_off_leases({Fence(4, "a", 1): "b"}, 0.3) == {4}
    await other.request_leases("c", [4], 600.0)  # released already: c's ask is ignored
    assert await store.lease_requests("a") == {}

    async def taken() -> bool:  # c's term is the reservation's (see `_expired`)
        return await other.acquire_leases("c", [4], 0.3) == {4: 2}
    assert not await taken()
    await wait_until(taken, "b's reservation ends")


async def test_hosts_alive_to_receive_shards_are_those_registered_as_hosts_until_they_go(
    store: Store, other: Store,
) -> None:
    builds = [("E", "f1", "{}"), ("F", "f2", "{}")]  # one row per type: listed once
    await store.register_builds("a", "host", builds, ttl=600.0)
    await other.register_builds("b", "host", builds, ttl=600.0)
    await other.register_builds("c", "client", builds, ttl=600.0)  # receives no shard
    await other.register_builds("brief", "host", builds, ttl=0.3)
    assert await other.live_hosts("x") == ["a", "b", "brief"]

    async def brief_gone() -> bool:
        return await other.live_hosts("x") == ["a", "b"]
    await wait_until(brief_gone, "brief's presence expires")
    assert await store.live_hosts("a") == ["b"]  # never its own heir
    assert await other.live_hosts("x") == ["a", "b"]  # asking is a read
    await other.forget_process("b")
    assert await store.live_hosts("x") == ["a"]


async def test_a_host_that_releases_its_leases_withdraws_its_requests(
    store: Store, other: Store,
) -> None:
    assert await store.acquire_leases("a", [6], 600.0) == {6: 1}
    await other.request_leases("b", [6], 600.0)
    assert await store.lease_requests("a") == {6: "b"}
    await other.release_leases("b")  # b closes while it waits (a rolling deploy's host)
    assert await store.lease_requests("a") == {}


async def test_a_host_asking_for_a_shard_it_holds_asks_for_nothing(store: Store) -> None:
    assert await store.acquire_leases("a", [5], 600.0) == {5: 1}
    await store.request_leases("a", [5], 600.0)
    assert await store.lease_requests("a") == {}


async def test_a_shard_handed_over_is_locked_by_its_heir_at_once_so_no_third_host_takes_it(
    store: Store, other: Store, db_path: str,
) -> None:
    """The holder drops the shard's OS or advisory lock when it hands the shard over; the
    heir takes the lock with the lease, not at its next renewal: a host starting in
    between would find the lock free and take the shard as if its holder had died."""
    assert await store.acquire_leases("a", [6], 600.0) == {6: 1}
    await other.request_leases("b", [6], 600.0)
    assert await store.hand_off_leases({Fence(6, "a", 1): "b"}, 600.0) == {6}
    assert await other.acquire_leases("b", [6], 600.0) == {6: 2}
    async with opened(db_path, SHARDS) as third:
        assert await third.acquire_leases("c", [6], 600.0) == {}


# -- the versioned schema -------------------------------------------------------------


async def test_a_store_written_by_a_newer_corral_or_with_other_shards_is_refused(
    db_path: str,
) -> None:
    store = await open_store(db_path, shards=SHARDS)
    await store.close()
    with pytest.raises(corral.ShardCountError, match="shards=16, this runtime uses 8"):
        await open_store(db_path, shards=8)
    version = int(sql(db_path, "SELECT v FROM meta WHERE k = 'schema_version'")[0][0])
    sql(db_path, "UPDATE meta SET v = '99' WHERE k = 'schema_version'")
    with pytest.raises(corral.StoreError, match=rf"schema version 99.*up to {version}\b"):
        await open_store(db_path, shards=SHARDS)
    assert sql(db_path, "SELECT v FROM meta WHERE k = 'schema_version'") == [("99",)]


# -- the registry of builds (`_build_registry`, `_ops_builds`) -----------------------------------


def _by_fp(found: list[BuildRecord]) -> dict[str, BuildRecord]:
    return {b.fingerprint: b for b in found}


async def test_a_build_is_registered_once_with_first_and_last_seen_and_its_live_processes(
        store: Store, other: Store) -> None:
    first = await store.register_builds("p1", "host", [("T", "f1", '{"v":1}')], ttl=60)
    await asyncio.sleep(0.01)
    later = await other.register_builds("p2", "client", [("T", "f1", '{"v":1}'),
                                                         ("U", "g1", "{}")], ttl=60)
    found = await store.builds("T")
    assert [b.fingerprint for b in found] == ["f1"]
    b = found[0]
    assert (b.entity_type, b.manifest) == ("T", '{"v":1}')
    assert b.first_seen == pytest.approx(first, abs=0.5)
    assert b.last_seen == pytest.approx(later, abs=0.5)
    assert b.last_seen >= b.first_seen
    assert [(p.process, p.role) for p in b.processes] == [("p1", "host"), ("p2", "client")]
    assert [b.entity_type for b in await store.builds()] == ["T", "U"]


async def test_builds_are_listed_oldest_first_and_a_process_moves_between_builds(
        store: Store) -> None:
    await store.register_builds("p1", "host", [("T", "f1", "{}")], ttl=60)
    await asyncio.sleep(0.01)
    await store.register_builds("p1", "host", [("T", "f2", "{}")], ttl=60)  # restarted
    found = await store.builds("T")
    assert [b.fingerprint for b in found] == ["f1", "f2"]
    assert [p.process for p in _by_fp(found)["f2"].processes] == ["p1"]
    assert _by_fp(found)["f1"].processes == ()  # the build stays, its process moved


async def test_an_expired_or_forgotten_process_is_not_live_and_its_build_is_kept(
        store: Store) -> None:
    await store.register_builds("gone", "host", [("T", "f1", "{}")], ttl=0.01)
    await store.register_builds("closed", "client", [("T", "f1", "{}")], ttl=60)
    await asyncio.sleep(0.05)
    await store.forget_process("closed")
    (b,) = await store.builds("T")
    assert b.processes == ()
    await store.register_builds("gone", "host", [("T", "f1", "{}")], ttl=60)  # back
    (b,) = await store.builds("T")
    assert [p.process for p in b.processes] == ["gone"]


async def test_names_in_use_counts_journal_entries_and_dead_letters_of_each_name(
        store: Store) -> None:
    for mid in ("m1", "m2"):
        await store.accept(acc("k", mid, name="reply", etype="T"))
    await store.accept(acc("k", "m3", name="close", etype="T"))
    await store.accept(acc("k", "m4", name="reply", etype="Other"))
    fence = await fence_for(store, 1)
    (entry,) = [e for e in await store.journal("T", "k", run_id=1, after_seq=0)
                if e.name == "close"]
    await store.record_dead_letter(fence, entry, error="x", traceback="", attempts=1,
                                   failed_at=1.0)
    used = await store.names_in_use("T", ["reply", "close", "never"])
    assert used == {"reply": "2 journal entries remain",
                    "close": "1 journal entry, 1 dead letter remain"}
    assert await store.names_in_use("T", []) == {}


# -- hosts' progress and the census (operators' numbers from any process) ----------------


async def test_recorded_progress_shows_every_reader_the_applied_seq_and_backlog_never_back(
    store: Store, other: Store,
) -> None:
    fence = await fence_for(store, 1)
    entries = [(await store.accept(acc("k", f"m{i}"))).entry for i in range(1, 4)]

    async def progress() -> tuple[object, ...]:
        [record] = await other.entities("E", None, limit=10)  # another process reads
        details = await other.entity_details("E", "k", 1)
        assert details.progress == record.progress
        p = record.progress
        assert p is not None
        return p.applied_seq, p.mailbox_depth, p.recorded_at, p.oldest_unapplied_at

    assert await progress() == (0, None, None, entries[0].accepted_at)  # nothing recorded
    await store.record_progress(fence, [("E", "k", 2, 1)], at=100.0)
    assert await progress() == (2, 1, 100.0, entries[2].accepted_at)
    await store.record_progress(fence, [("E", "k", 1, 0)], at=101.0)  # a stale watermark
    assert await progress() == (2, 1, 100.0, entries[2].accepted_at)
    with pytest.raises(corral.LeaseLostError):  # a former holder writes nothing
        await store.record_progress(Fence(1, "host", 99), [("E", "k", 3, 0)], at=102.0)
    assert await progress() == (2, 1, 100.0, entries[2].accepted_at)
    await store.record_progress(fence, [("E", "k", 3, 0)], at=103.0)
    assert await progress() == (3, 0, 103.0, None)  # nothing left to apply
    await store.accept(acc("k", "m4"))
    await store.write_snapshot(fence, "E", "k", 1, applied_seq=4, state=b"1", keep=1,
                               passivate=True)  # passivated after applying it
    assert (await progress())[0::3] == (4, None)


async def test_a_new_run_starts_with_no_backlog_of_the_closed_one(store: Store) -> None:
    fence = await fence_for(store, 1)
    for mid in ("m1", "m2"):
        await store.accept(acc("k", mid))
    await store.close_run(fence, "E", "k", 1, applied_seq=1, status=corral.RunStatus.FAILED,
                          result=None, error="boom", force=True)  # m2 dead-lettered
    [closed] = await store.entities("E", None, limit=10)
    assert closed.progress is not None
    assert closed.progress.oldest_unapplied_at is None
    await store.accept(acc("k", "m3"))  # run 2, from seq 3
    [record] = await store.entities("E", None, limit=10)
    assert (record.run_id, record.accepted_seq) == (2, 3)
    assert record.progress is not None
    assert record.progress.applied_seq == 2


async def test_the_census_aggregates_a_stores_known_contents(store: Store) -> None:
    fence = await fence_for(store, 1)
    first = {key: (await store.accept(acc(key, "m1"))).entry for key in ("a", "b", "c")}
    second_b = (await store.accept(acc("b", "m2"))).entry
    await store.accept(acc("x", "m1", shard=2, etype="T"))
    await store.record_progress(fence, [("E", "a", 1, 0), ("E", "b", 0, 0)], at=1.0)
    await store.close_run(fence, "E", "c", 1, applied_seq=1,
                          status=corral.RunStatus.COMPLETED, result='"done"', error=None)
    await store.record_dead_letter(fence, second_b, error="ValueError", traceback="tb",
                                   attempts=3, failed_at=5.0)
    await store.open_wait(fence, "E", "a", 1, "approval", deadline=None, now=1.0)
    await store.suspend_run(fence, Suspension("E", "b", 1, "RuntimeError", 1, 1.0, 9.0))
    await store.register_builds("h1", "host", [("E", "f1", "{}"), ("T", "f2", "{}")],
                                ttl=600.0)
    await store.register_builds("c1", "client", [("E", "f1", "{}")], ttl=600.0)
    await store.register_builds("old", "host", [("E", "f0", "{}")], ttl=0.01)
    await asyncio.sleep(0.05)  # the store's clock passes old's registration
    census = await store.census()
    assert census.entities == (("E", "completed", 1), ("E", "running", 2), ("T", "running", 1))
    assert [(b.entity_type, b.messages, b.entities) for b in census.backlog] == [
        ("E", 2, 1), ("T", 1, 1)]  # b: 2 of 2 behind; a applied all; x: 1 never applied
    by_type = {b.entity_type: b.oldest_unapplied_at for b in census.backlog}
    assert by_type["E"] == first["b"].accepted_at
    assert census.dead_letters == (("E", 1),)
    assert census.open_waits == (("E", 1),)
    assert census.suspended_runs == (("E", 1),)
    assert census.processes == (("E", "f1", "client", 1), ("E", "f1", "host", 1),
                                ("T", "f2", "host", 1))
    assert (census.hosts, census.shards, census.shards_held) == (1, SHARDS, 1)
    assert census.at > 1_000_000_000  # the store's clock
# -- an entity's history (operators: `corral history`, `show --state`) -------------------


async def test_an_entitys_messages_merge_the_journal_the_dedupe_window_and_dead_letters(
    store: Store,
) -> None:
    fence = await fence_for(store, 1)
    for mid in ("m1", "m2", "m3", "m4"):
        await store.accept(acc("k", mid, sender="ana"))
    await store.accept(acc("other", "m1"))
    entries = await store.journal("E", "k", run_id=1, after_seq=0)
    poison = await store.record_dead_letter(fence, entries[2], error="ValueError: 13",
                                            traceback="tb", attempts=3, failed_at=99.0)
    await store.write_snapshot(fence, "E", "k", 1, applied_seq=3, state=b"{}", keep=1)
    found = await store.messages("E", "k")
    assert [(m.seq, m.message_id, m.sender) for m in found] == [
        (1, "m1", "ana"), (2, "m2", "ana"), (3, "m3", "ana"), (4, "m4", "ana")]
    covered, dead, pending = found[0], found[2], found[3]
    # Covered by the snapshot: only the dedupe window's row is left of it.
    assert (covered.kind, covered.name, covered.payload) == (None, None, None)
    assert covered.accepted_at == entries[0].accepted_at
    assert (dead.dead_letter_id, dead.error, dead.failed_at, dead.payload) == (
        poison, "ValueError: 13", 99.0, '{"v":1}')
    assert dead.accepted_at == entries[2].accepted_at
    assert (pending.kind, pending.name, pending.payload) == (EntryKind.SIGNAL, "note", '{"v":1}')
    assert [m.seq for m in await store.messages("E", "k", after_seq=1, limit=2)] == [2, 3]
    assert await store.messages("E", "nobody") == []
    assert [e.seq for e in await store.journal("E", "k", run_id=1, after_seq=0, limit=1)] == [4]


async def test_an_entitys_timers_and_waits_are_listed_with_their_runs(store: Store) -> None:
    fence = await fence_for(store, 1)
    await store.accept(acc("k", "m"))
    await store.set_timer(fence, "E", "k", 1, "late", 50.0)
    await store.set_timer(fence, "E", "k", 1, "soon", 20.0)
    await store.open_wait(fence, "E", "k", 1, "approval", deadline=70.0, now=10.0)
    assert [(t.run_id, t.timer_id, t.due_at) for t in await store.timers("E", "k")] == [
        (1, "soon", 20.0), (1, "late", 50.0), (1, "wait:approval", 70.0)]  # its deadline
    [wait] = await store.waits("E", "k")
    assert (wait.run_id, wait.name, wait.status, wait.deadline) == (
        1, "approval", WaitStatus.OPEN, 70.0)
    assert await store.timers("E", "other") == []
    assert await store.waits("E", "other") == []


async def test_a_replayed_dead_letter_is_found_by_its_id_while_its_replay_is_remembered(
    store: Store,
) -> None:
    fence = await fence_for(store, 1)
    entry = (await store.accept(acc("k/1", "poison"))).entry
    dl = await store.record_dead_letter(fence, entry, error="e", traceback="", attempts=1,
                                        failed_at=5.0)
    assert await store.replayed_to(dl) is None  # still a dead letter
    await store.replay_dead_letter("E", "k/1", 1, dl, accepted_at=7.0)
    assert await store.replayed_to(dl) == ("E", "k/1")
    assert await store.replayed_to(dl + 1) is None
    assert await store.replayed_to(dl * 10) is None  # "replay:1:" is no prefix of "replay:10:"


async def test_entities_are_listed_by_key_prefix(store: Store) -> None:
    for key in ("order-1", "order-2", "orders", "other", "order_x"):
        await store.accept(acc(key, "m"))
    await store.accept(acc("order-9", "m", etype="F"))
    found = await store.entities("E", None, limit=10, key_prefix="order-")
    assert [e.key for e in found] == ["order-1", "order-2"]
    assert [(e.entity_type, e.key) for e in
            await store.entities(None, None, limit=10, key_prefix="order-")] == [
        ("E", "order-1"), ("E", "order-2"), ("F", "order-9")]
    page = await store.entities(None, None, limit=1, after=("E", "order-1"), key_prefix="order")
    assert [e.key for e in page] == ["order-2"]
    assert [e.key for e in await store.entities("E", None, limit=10, key_prefix="order_")] == [
        "order_x"]  # `_` is no wildcard
    # A prefix whose last code point has no successor (U+10FFFF), or whose successor is a
    # surrogate (U+D7FF), still bounds the range: no error, and nothing matches here.
    for odd in ("order\U0010ffff", "\U0010ffff", "order\ud7ff"):
        assert await store.entities("E", None, limit=10, key_prefix=odd) == []
# -- backpressure: max_backlog checked inside the accepting transaction ---------------


async def test_a_signal_over_max_backlog_is_refused_with_nothing_stored_until_applied_catches_up(
    store: Store, db_path: str,
) -> None:
    for n in range(1, 4):  # seqs 1..3, none applied
        await store.accept(acc("k", f"m{n}", max_backlog=3))
    with pytest.raises(corral.EntityOverloadedError) as refused:
        await store.accept(acc("k", "m4", max_backlog=3))
    err = refused.value
    assert (err.backlog, err.max_backlog, err.entity_type, err.key, err.message_id) == (
        3, 3, "E", "k", "m4")
    assert err.retryable
    assert 0 < err.retry_after <= 5.0
    journal = sql(db_path, "SELECT message_id FROM journal WHERE key = 'k' ORDER BY seq")
    assert [r[0] for r in journal] == ["m1", "m2", "m3"]
    assert sql(db_path, "SELECT count(*) FROM dedupe WHERE message_id = 'm4'")[0][0] == 0
    assert (await store.accept(acc("k", "m1", max_backlog=3))).duplicate  # still answered
    # The accepting process's own watermark (its hosted activation's) frees the place...
    assert not (await store.accept(acc("k", "m4", max_backlog=3, applied=1))).duplicate
    with pytest.raises(corral.EntityOverloadedError):
        await store.accept(acc("k", "m5", max_backlog=3, applied=1))
    # ...and so does a snapshot, for a process that does not host the entity.
    fence = await fence_for(store, 1)
    await store.write_snapshot(fence, "E", "k", 1, applied_seq=3, state=b"3", keep=2)
    assert (await store.accept(acc("k", "m5", max_backlog=3))).entry.seq == 5
    assert (await store.accept(acc("k", "m6", max_backlog=3))).entry.seq == 6
    with pytest.raises(corral.EntityOverloadedError):
        await store.accept(acc("k", "m7", max_backlog=3))  # 4, 5 and 6 not applied
    # ...and so does the progress its host records (once a second), past the snapshot.
    await store.record_progress(fence, [("E", "k", 4, 2)], at=1.0)
    assert (await store.accept(acc("k", "m7", max_backlog=3))).entry.seq == 7


async def test_a_batch_counts_its_own_acceptances_against_max_backlog(store: Store) -> None:
    results = await store.accept_many([acc("k", f"m{n}", max_backlog=2) for n in range(4)])
    assert [type(r).__name__ for r in results] == [
        "AcceptResult", "AcceptResult", "EntityOverloadedError", "EntityOverloadedError"]


async def test_two_stores_racing_for_the_last_places_never_pass_max_backlog(
    store: Store, other: Store, db_path: str,
) -> None:
    async def send(s: Store, who: str) -> list[AcceptResult | Exception]:
        return await s.accept_many([acc("k", f"{who}{n}", max_backlog=5) for n in range(4)])

    await store.accept(acc("k", "first", max_backlog=5))
    results = [r for batch in await asyncio.gather(send(store, "a"), send(other, "b"))
               for r in batch]
    accepted = [r for r in results if isinstance(r, AcceptResult)]
    assert len(accepted) == 4  # 1 + 4 = the bound; every other one was refused
    assert all(isinstance(r, corral.EntityOverloadedError) for r in results
               if not isinstance(r, AcceptResult))
    assert sql(db_path, "SELECT count(*) FROM journal WHERE key = 'k'")[0][0] == 5


async def test_an_overflowing_signal_of_a_dead_letter_type_is_kept_as_a_dead_letter(
    store: Store,
) -> None:
    await store.accept(acc("k", "m1", max_backlog=1, overflow="dead_letter"))
    over = await store.accept(acc("k", "m2", max_backlog=1, overflow="dead_letter",
                                  payload='{"v":2}'))
    assert over.dead_letter_id is not None
    assert not over.duplicate
    assert (over.entry.seq, over.entry.run_id) == (0, 1)
    [letter] = await store.dead_letters("E", "k")
    assert (letter.id, letter.message_id, letter.payload, letter.seq) == (
        over.dead_letter_id, "m2", '{"v":2}', 0)
    assert "max_backlog 1" in letter.error
    assert [e.message_id for e in await store.journal("E", "k", run_id=1, after_seq=0)] == ["m1"]
    replayed = await store.replay_dead_letter("E", "k", 1, letter.id, accepted_at=99.0)
    assert replayed.entry.seq == 2  # an operator's replay is not bounded


# -- batches: accept_all, every acceptance or none -------------------------------------


async def test_accept_all_accepts_a_batch_across_entities_in_one_commit_in_batch_order(
    store: Store,
) -> None:
    before = store.commits
    results = await store.accept_all([acc("a", "m1"), acc("b", "m1", shard=2),
                                      acc("a", "m2"), acc("a", "m1")])
    assert store.commits == before + 1
    assert [(r.entry.key, r.entry.seq, r.started, r.duplicate) for r in results] == [
        ("a", 1, True, False), ("b", 1, True, False), ("a", 2, False, False),
        ("a", 1, False, True)]  # a duplicate inside the batch is answered, not refused


async def test_a_refused_item_refuses_the_whole_batch_naming_its_index_and_stores_nothing(
    store: Store, db_path: str,
) -> None:
    await store.accept(acc("a", "old"))
    await store.accept(acc("full", "f1", max_backlog=1))
    cases = [
        (acc("a", "old", payload='{"v":9}'), corral.IdempotencyConflictError),
        (acc("never", "n1", start=None), corral.EntityNotRunningError),
        (acc("full", "f2", max_backlog=1), corral.EntityOverloadedError),
    ]
    for bad, error in cases:
        batch = [acc("b", f"x-{error.__name__}"), acc("c", "y", shard=3),
                 acc("full", "dl", max_backlog=1, overflow="dead_letter"), bad]
        with pytest.raises(corral.BatchRefusedError) as refused:
            await store.accept_all(batch)
        assert refused.value.index == 3
        assert isinstance(refused.value.error, error)
        assert refused.value.__cause__ is refused.value.error
        assert (refused.value.key, refused.value.message_id) == (bad.key, bad.message_id)
    assert sorted(r[0] for r in sql(db_path, "SELECT key FROM entities")) == ["a", "full"]
    assert sql(db_path, "SELECT count(*) FROM journal")[0][0] == 2
    assert sql(db_path, "SELECT count(*) FROM dead_letters")[0][0] == 0  # rolled back too
    # The store goes on: the same batch without the bad item commits whole.
    results = await store.accept_all([acc("b", "x"), acc("a", "new")])
    assert [(r.entry.key, r.entry.seq) for r in results] == [("b", 1), ("a", 2)]


async def test_a_refused_batch_leaves_the_other_ops_of_its_group_commit_alone(
    store: Store, db_path: str,
) -> None:
    refused_batch = store.accept_all([acc("b", "m1"), acc("never", "n", start=None)])
    alone = [store.accept(acc(f"k{n}", "m")) for n in range(5)]
    results = await asyncio.gather(refused_batch, *alone, return_exceptions=True)
    assert isinstance(results[0], corral.BatchRefusedError)
    assert all(isinstance(r, AcceptResult) for r in results[1:])
    keys = sorted(r[0] for r in sql(db_path, "SELECT key FROM journal"))
    assert keys == [f"k{n}" for n in range(5)]


# -- the outbox: each send written once, whatever repeats its write ---------------------


async def _deliver(store: Store, fence: Fence, sender: str) -> list[bool]:
    """Deliver the run's pending sends as the sender's host does (`_outbox.Postman`):
    accept each into its target under the row's message id, then mark them sent.
    Whether each was a duplicate at its target."""
    rows = await store.pending_sends("E", sender, 1, limit=1000)
    dup = [(await store.accept(acc(r.send.target_key, r.message_id, name=r.send.name,
                                   payload=r.send.payload, sender=f"E/{sender}",
                                   start=r.send.start))).duplicate for r in rows]
    if rows:
        await store.mark_sent(fence, "E", sender, 1, upto=rows[-1].seq)
    return dup


async def test_a_write_of_sends_applied_twice_yields_one_row_and_one_delivery(
    store: Store, db_path: str,
) -> None:
    """PostgreSQL can lose the connection during COMMIT: the write's outcome is unknown
    (`StoreUnavailableError(committed=None)`) and the runtime writes it again
    (`_residence.retrying`). The write around the sends succeeds again (a step's
    first record wins, a snapshot replaces the one at its watermark), so the sends
    must not double: the sender's host numbers each send before the first attempt
    (`Send.seq`), the number is the outbox row's key and a write skips a number it
    finds. Should the retry come after the delivery deleted the rows, its rows come
    back with the same message ids: duplicates at the target, delivered once."""
    fence = await fence_for(store, 1)
    await store.accept(acc("k", "m0"))  # the sender
    await store.accept(acc("t", "m0"))  # the target
    sends = [Send("E", "t", "note", f'{{"n":{n}}}', "{}", "allow_duplicate", seq=n + 1)
             for n in range(2)]
    step = StepRecord("s", True, "1", None, 1, 1.0)
    for _ in range(2):  # the write, then its retry
        await store.record_step(fence, "E", "k", 1, step, sends=sends)
        await store.write_snapshot(fence, "E", "k", 1, applied_seq=1, state=b"s", keep=1,
                                   sends=sends)
    assert sql(db_path, "SELECT seq, message_id FROM outbox") == [(1, None), (2, None)]
    assert await _deliver(store, fence, "k") == [False, False]
    await store.record_step(fence, "E", "k", 1, step, sends=sends)  # a late retry
    # Send 1's row came back (send 2's, the run's newest, stayed): a duplicate.
    assert await _deliver(store, fence, "k") == [True]
    target = sql(db_path, "SELECT message_id FROM journal WHERE key = 't' ORDER BY seq")
    assert target == [("m0",), ("send:E/k/1/1",), ("send:E/k/1/2",)]
    assert await store.last_send("E", "k", 1) == 2


# -- retention ------------------------------------------------------------------------

# Every table with an entity's rows (an `etype` and a `key` column), from the one table
# definition: a table added later is checked here without a word.
_ENTITY_TABLES = tuple(t.name for t in TABLES if re.search(r"\betype TEXT\b", t.body)
                       and re.search(r"\bkey TEXT\b", t.body))
_RUN_COLUMN = {t.name for t in TABLES if re.search(r"\brun_id\b", t.body)}


def _rows_of(location: str, key: str, run_id: int | None = None) -> dict[str, int]:
    """The rows each table holds of entity ("E", key) (of one run), where it holds any."""
    where = "" if run_id is None else f" AND run_id = {run_id}"
    counts = {t: sql(location, f"SELECT count(*) FROM {t} WHERE etype = 'E' AND key = ?"
                     f"{where}", key)[0][0] for t in _ENTITY_TABLES
              if run_id is None or t in _RUN_COLUMN}
    return {t: n for t, n in counts.items() if n}


async def _closed_with_every_kind_of_row(store: Store, fence: Fence, key: str) -> None:
    """Entity `key` on shard 1 with journal, dedupe, snapshot, dead letter, wait,
    suspension, step (and its history), outbox and progress rows, then terminated
    (closed at its acceptance time: the test clock's small numbers, long before any
    wall-clock cutoff; the close deletes its timers, steps and suspension, not the
    steps' history)."""
    first = (await store.accept(acc(key, "m1"))).entry
    await store.accept(acc(key, "m2", start=None))
    await store.write_snapshot(fence, "E", key, 1, applied_seq=1, state=b"s", keep=1)
    await store.record_dead_letter(fence, first, error="e", traceback="", attempts=1,
                                   failed_at=1.0)
    await store.open_wait(fence, "E", key, 1, "approval", deadline=None, now=1.0)
    await store.suspend_run(fence, Suspension("E", key, 1, "boom", 1, 1.0, 2.0))
    await store.record_step(fence, "E", key, 1, StepRecord("s", True, "1", None, 1, 1.0),
                            sends=[Send("E", "other", "m", "{}", None, "allow_duplicate", seq=1)],
                            history=StepAttempts(1, "s", "completed", 1, 1.0, 1.0, "1"))
    await store.mark_sent(fence, "E", key, 1, upto=1)  # delivered (an unsent one is kept)
    await store.record_progress(fence, [("E", key, 1, 0)], at=1.0)
    await store.accept(acc(key, "end", kind=EntryKind.TERMINATE, start=None))


async def test_retention_purges_a_closed_entity_with_all_its_rows_and_nothing_else(
    store: Store, db_path: str,
) -> None:
    fence = await fence_for(store, 1)
    await _closed_with_every_kind_of_row(store, fence, "old")
    await store.accept(acc("live", "m1"))  # running: never purged
    await store.accept(acc("recent", "m1"))
    assert await store.close_run(fence, "E", "recent", 1, applied_seq=1,
                                 status=corral.RunStatus.COMPLETED, result=None, error=None)
    await store.accept(acc("elsewhere", "m1", shard=2))
    await store.accept(acc("elsewhere", "end", shard=2, kind=EntryKind.TERMINATE, start=None))
    old = _rows_of(db_path, "old")
    assert set(old) == set(_ENTITY_TABLES) - {"timers", "steps", "suspensions"}
    before = {key: _rows_of(db_path, key) for key in ("live", "recent", "elsewhere")}

    cutoff = 1e9  # after the test clock's terminations, before any wall-clock close
    assert await store.purgeable("E", cutoff) == Purged(2, 2)  # "old" and "elsewhere"
    assert _rows_of(db_path, "old") == old  # a dry run deletes nothing
    purged = await store.purge_closed("E", cutoff, limit=10, fences=[fence])
    assert purged == Purged(1, 1, sum(old.values()))  # shard 2 is not this host's
    assert _rows_of(db_path, "old") == {}
    assert {key: _rows_of(db_path, key) for key in before} == before
    assert await store.purge_closed("E", cutoff, limit=10, fences=[fence]) == Purged()
    elsewhere = sum(before["elsewhere"].values())
    assert await store.purge_closed("E", cutoff, limit=10) == Purged(1, 1, elsewhere)
    assert await store.purgeable("E", cutoff) == Purged()


async def test_a_signal_to_a_purged_key_starts_run_1_and_its_old_ids_are_new_again(
    store: Store,
) -> None:
    fence = await fence_for(store, 1)
    await _closed_with_every_kind_of_row(store, fence, "k")
    reject = corral.IdReusePolicy.REJECT_DUPLICATE
    with pytest.raises(corral.EntityClosedError):  # retained: the policy decides
        await store.accept(acc("k", "again", reuse=reject))
    await store.purge_closed("E", 1e9, limit=10, fences=[fence])
    with pytest.raises(corral.EntityNotRunningError, match="was never started"):
        await store.accept(acc("k", "m1", start=None))
    fresh = await store.accept(acc("k", "m1", reuse=reject))  # m1: the purged run's id
    assert (fresh.duplicate, fresh.started, fresh.entry.run_id, fresh.entry.seq) == (
        False, True, 1, 1)
    assert [r.run_id for r in await store.runs("E", "k")] == [1]


async def test_retention_keeps_a_closed_run_until_its_sends_are_delivered(
    store: Store, db_path: str,
) -> None:
    fence = await fence_for(store, 1)
    unsent = [Send("E", "t", "note", "{}", None, "allow_duplicate", seq=1)]
    await store.accept(acc("whole", "m1"))  # its latest run closes with a send unsent
    assert await store.close_run(fence, "E", "whole", 1, applied_seq=1, sends=unsent,
                                 status=corral.RunStatus.COMPLETED, result=None, error=None)
    await store.accept(acc("chain", "m1"))  # a run left behind with a send unsent
    assert await store.continue_as_new(fence, "E", "chain", 1, applied_seq=1,
                                       next_input="{}", carried=[], sends=unsent) == 2
    await store.accept(acc("chain", "end", kind=EntryKind.TERMINATE, start=None))
    late = time.time() + 1

    assert await store.purgeable("E", late) == Purged()
    assert await store.purge_closed("E", late, limit=10, fences=[fence]) == Purged()
    assert sql(db_path, "SELECT key, run_id FROM outbox ORDER BY key") == [
        ("chain", 1), ("whole", 1)]
    await store.mark_sent(fence, "E", "chain", 1, upto=1)
    purged = await store.purge_closed("E", late, limit=10, fences=[fence])
    assert (purged.runs, purged.entities) == (2, 1)  # "chain" whole, its two runs
    assert await store.purgeable("E", late) == Purged()  # "whole" still waits
    await store.mark_sent(fence, "E", "whole", 1, upto=1)
    purged = await store.purge_closed("E", late, limit=10, fences=[fence])
    assert (purged.runs, purged.entities) == (1, 1)
    assert sql(db_path, "SELECT count(*) FROM outbox") == [(0,)]


async def test_retention_purges_oldest_first_in_bounded_batches_and_runs_left_behind(
    store: Store, db_path: str,
) -> None:
    fence = await fence_for(store, 1)
    for key in ("a", "b", "c"):
        await store.accept(acc(key, "m1"))
        await store.accept(acc(key, "end", kind=EntryKind.TERMINATE, start=None))
    await store.accept(acc("chain", "m1"))
    await store.record_dead_letter(fence, (await store.journal("E", "chain", run_id=1,
                                                               after_seq=0))[0],
                                   error="e", traceback="", attempts=1, failed_at=1.0)
    assert await store.continue_as_new(fence, "E", "chain", 1, applied_seq=1,
                                       next_input="{}", carried=[]) == 2
    assert await store.purge_closed("E", 1e9, limit=2, fences=[fence]) == Purged(2, 2, 12)
    assert [k for k in ("a", "b", "c") if _rows_of(db_path, k)] == ["c"]  # oldest first
    purged = await store.purge_closed("E", time.time() + 1, limit=10, fences=[fence])
    assert (purged.runs, purged.entities) == (2, 1)  # "c", and "chain"'s run 1
    assert _rows_of(db_path, "c") == {}
    assert [r.run_id for r in await store.runs("E", "chain")] == [2]
    assert "dead_letters" not in _rows_of(db_path, "chain", 1)
    assert (await store.accept(acc("chain", "m1"))).duplicate  # ids stay for the window


async def test_a_purge_with_a_lost_lease_is_refused_and_deletes_nothing(
    store: Store, db_path: str,
) -> None:
    stale = await fence_for(store, 1)
    await store.accept(acc("k", "m1"))
    await store.accept(acc("k", "end", kind=EntryKind.TERMINATE, start=None))
    await store.acquire_leases("other", [1], 60.0, force=True)
    with pytest.raises(corral.LeaseLostError):
        await store.purge_closed("E", 1e9, limit=10, fences=[stale])
    assert _rows_of(db_path, "k")


async def test_a_purge_of_more_entities_than_one_statement_takes_purges_them_all(
    store: Store, db_path: str,
) -> None:
    keys = [f"k{n}" for n in range(450)]  # more than a statement's 400 keys
    await store.accept_many([acc(k, "m1") for k in keys])
    await store.accept_many([acc(k, "end", kind=EntryKind.TERMINATE, start=None)
                             for k in keys])
    assert await store.purge_closed("E", 1e9, limit=1000) == Purged(450, 450, 450 * 6)
    assert sql(db_path, "SELECT count(*) FROM runs") == [(0,)]


async def _big_closed_entity(store: Store, fence: Fence, key: str, messages: int) -> None:
    """Entity `key` on shard 1 with `messages` journal entries and dedupe ids and a dead
    letter, terminated."""
    await store.accept_many([acc(key, f"m{n}") for n in range(messages)])
    first = (await store.journal("E", key, run_id=1, after_seq=0))[0]
    await store.record_dead_letter(fence, first, error="e", traceback="", attempts=1,
                                   failed_at=1.0)
    await store.accept(acc(key, "end", kind=EntryKind.TERMINATE, start=None))


async def test_a_run_with_more_rows_than_a_purge_deletes_goes_over_several_bounded_purges(
    store: Store, other: Store, db_path: str,
) -> None:
    """`rows` (`Retention.rows`) bounds what one purge, one transaction, deletes, however
    many rows a run owns (here ~600: a dedupe window and a journal a terminate left):
    it goes over several purges, another writer's acceptances commit between them, and
    the entity's run and entity rows go last, with its last other rows."""
    fence = await fence_for(store, 1)
    await _big_closed_entity(store, fence, "big", 300)
    total = sum(_rows_of(db_path, "big").values())
    assert total > 600
    rounds: list[Purged] = []
    while (done := await store.purge_closed("E", 1e9, limit=10, fences=[fence],
                                            rows=100)).rows:
        rounds.append(done)
        assert done.rows <= 100
        left = _rows_of(db_path, "big")
        assert not left or {"runs", "entities"} <= set(left)  # still found next round
        assert not (await other.accept(acc("live", f"m{len(rounds)}"))).duplicate
    assert len(rounds) >= total // 100
    assert sum(rounds, Purged()) == Purged(1, 1, total)
    assert _rows_of(db_path, "big") == {}
    assert sql(db_path, "SELECT count(*) FROM journal WHERE key = 'live'") == [(len(rounds),)]


async def test_a_key_reopened_while_half_purged_keeps_its_new_run(
    store: Store, db_path: str,
) -> None:
    fence = await fence_for(store, 1)
    await _big_closed_entity(store, fence, "big", 150)
    assert (await store.purge_closed("E", 1e9, limit=10, fences=[fence], rows=100)).rows
    reopened = await store.accept(acc("big", "again"))  # ALLOW_DUPLICATE: run 2
    assert (reopened.started, reopened.entry.run_id) == (True, 2)
    while (await store.purge_closed("E", 1e9, limit=10, fences=[fence], rows=100)).rows:
        pass
    assert [r.run_id for r in await store.runs("E", "big")] == [2]  # run 1 left behind, gone
    assert [e.message_id for e in await store.journal("E", "big", run_id=2,
                                                      after_seq=0)] == ["again"]
    assert (await store.accept(acc("big", "again"))).duplicate


async def test_an_entity_purged_whole_counts_every_run_it_had_as_the_dry_run_does(
    store: Store, db_path: str,
) -> None:
    for mid in ("a", "b"):  # run 1 terminated, then run 2 started and terminated
        await store.accept(acc("k", mid))
        await store.accept(acc("k", f"end-{mid}", kind=EntryKind.TERMINATE, start=None))
    assert await store.purgeable("E", 1e9) == Purged(2, 1)
    assert await store.purge_closed("E", 1e9, limit=10) == Purged(2, 1, 1 + 2 + 4 + 4)
    assert _rows_of(db_path, "k") == {}


async def test_a_host_of_another_cluster_is_refused_while_a_claim_lives(
        db_path: str, store: Store, other: Store) -> None:
    """Hosting claims (`_hosting`): hosts of one cluster share the store; a claim of
    another cluster is refused with the live claim, writing nothing; a released or
    lapsed claim no longer refuses anyone."""
    assert await store.claim_hosting("a1", "ray:one", "Ray one, pid 1", ttl=600.0) is None
    assert await other.claim_hosting("a2", "ray:one", "Ray one, pid 2", ttl=600.0) is None
    rows = "SELECT process, cluster, holder, expires_at FROM hosting ORDER BY process"
    before = sql(db_path, rows)
    refused = await other.claim_hosting("b1", "ray:two", "Ray two", ttl=600.0)
    assert refused is not None
    assert (refused.cluster, refused.process in {"a1", "a2"}, refused.holder[:7]) == (
        "ray:one", True, "Ray one")
    assert await other.claim_hosting("l1", "local", "local", ttl=600.0) is not None
    assert sql(db_path, rows) == before  # nothing written
    assert [c.process for c in await other.hosting_claims()] == ["a1", "a2"]
    await store.release_hosting("a1")
    await other.release_hosting("a2")
    assert await other.hosting_claims() == []
    assert await other.claim_hosting("b1", "ray:two", "Ray two", ttl=0.05) is None

    async def lapsed() -> bool:
        return await other.hosting_claims() == []
    await wait_until(lapsed, "b1's claim lapses")
    assert await store.claim_hosting("l1", "local", "local", ttl=600.0) is None  # lapsed


async def test_two_clusters_claiming_at_once_get_one_winner(db_path: str) -> None:
    """Claims of two clusters racing from separate writers: exactly one cluster holds
    the store (the claim's check and write are one transaction)."""
    for round_ in range(5):
        async with opened(db_path, SHARDS) as a, opened(db_path, SHARDS) as b:
            results = await asyncio.gather(
                a.claim_hosting(f"a{round_}", f"ray:a{round_}", "a", ttl=600.0),
                b.claim_hosting(f"b{round_}", f"ray:b{round_}", "b", ttl=600.0))
            assert sorted(r is None for r in results) == [False, True]
            assert len({c.cluster for c in await a.hosting_claims()}) == 1
            for c in await a.hosting_claims():
                await a.release_hosting(c.process)
