"""Continue-as-new: one transaction closes run N and opens N+1, carrying what N left.

Each entity keeps what it applied in its state and hands it to the next run as the
start input, so the last run holds the whole history, each item tagged with the run
that applied it; the journal seq of each message comes from its ack.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

import corral
from bounded_entities import (
    Applied,
    Bump,
    Chain,
    Note,
    ParkedCounter,
    RollIn,
    RollingCounter,
    Rollover,
    StormLedger,
    StormMailbox,
)
from procs import wait_until
from stores import sql

SENDERS, PER_SENDER = 4, 500
TOTAL = SENDERS * PER_SENDER


async def storm(ref: corral.EntityRef[Any], handler: Any, expect: int
                ) -> list[list[tuple[str, corral.Ack]]]:
    """SENDERS concurrent tasks, each sending PER_SENDER signals one after another."""
    async def sender(s: int) -> list[tuple[str, corral.Ack]]:
        acks = []
        for n in range(PER_SENDER):
            mid = f"s{s}-{n}"
            ack = await ref.signal_with_start(handler, Note(mid=mid),
                                              start=Chain(expect=expect), message_id=mid)
            acks.append((mid, ack))
        return acks

    return list(await asyncio.gather(*(sender(s) for s in range(SENDERS))))


def check_exactly_once_in_order(applied: list[Applied],
                                per_sender: list[list[tuple[str, corral.Ack]]]) -> None:
    acks = {mid: ack for sent in per_sender for mid, ack in sent}
    assert {a.status for a in acks.values()} == {"accepted"}
    mids = [a.mid for a in applied]
    assert len(mids) == len(set(mids)), "a signal was applied twice"
    assert set(mids) == set(acks), "an acknowledged signal was never applied"
    # Global order: the journal seq of each ack, strictly increasing along the history.
    seqs = [acks[m].seq for m in mids]
    assert seqs == sorted(seqs), "signals were applied out of acceptance order"
    assert sorted(seqs) == list(range(1, TOTAL + 1))
    # Each sender's own order (it awaited each ack before sending the next).
    for sent in per_sender:
        mine = set(m for m, _ in sent)
        assert [m for m in mids if m in mine] == [m for m, _ in sent]
    # Never applied by a run older than the one that accepted it.
    assert all(a.run >= acks[a.mid].run_id for a in applied)


def check_chain(info: corral.EntityDescription, last: corral.RunStatus) -> None:
    runs = info.runs
    assert [r.run_id for r in runs] == list(range(1, len(runs) + 1))
    assert [r.status for r in runs] == [corral.RunStatus.CONTINUED] * (len(runs) - 1) + [last]
    assert [r.continued_from for r in runs] == [None, *range(1, len(runs))]
    assert info.run_id == runs[-1].run_id


async def test_a_signal_storm_while_the_entity_continues_as_new_every_100_signals_applies_each_once_in_order(  # noqa: E501
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[StormLedger]) as rt:
        ref = rt.ref(StormLedger, "ledger-1")
        sent = await storm(ref, StormLedger.note, TOTAL)
        applied = await ref.result(timeout=30)
        info = await ref.describe()

    check_exactly_once_in_order(applied, sent)
    check_chain(info, corral.RunStatus.COMPLETED)
    # The policy (100 signals) asked for a new run at least every ~100 applied signals.
    assert len(info.runs) >= TOTAL // 200
    per_run = [sum(1 for a in applied if a.run == r.run_id) for r in info.runs]
    assert sum(per_run) == TOTAL
    run_of = {a.mid: a.run for a in applied}
    switched = sum(1 for mid, ack in (p for s in sent for p in s) if run_of[mid] > ack.run_id)
    print(f"\n{len(info.runs)} runs, signals per run {per_run}; {switched} signals were "
          "accepted by run N and applied by a later run (sent during a switch)")
    # Closed runs leave nothing in the journal or snapshots.
    assert sql(db_path, "SELECT DISTINCT run_id FROM journal") in ([], [(info.run_id,)])
    assert sql(db_path, "SELECT count(*) FROM snapshots WHERE run_id<?", info.run_id) == [(0,)]


async def test_mailbox_payloads_run_has_not_taken_are_carried_to_the_next_run_in_order(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[StormMailbox]) as rt:
        ref = rt.ref(StormMailbox, "mailbox-1")
        sent = await storm(ref, StormMailbox.notes, TOTAL)
        final: Chain = await ref.result(timeout=30)
        info = await ref.describe()

    check_exactly_once_in_order(final.applied, sent)
    check_chain(info, corral.RunStatus.COMPLETED)
    # Each run took exactly `every` payloads; every switch left some untaken.
    runs = TOTAL // final.every
    assert len(info.runs) == runs
    assert [sum(1 for a in final.applied if a.run == r) for r in range(1, runs + 1)] == \
        [final.every] * runs
    assert len(final.carried) == runs - 1
    assert all(n >= 10 for n in final.carried), final.carried
    print(f"\nuntaken mailbox payloads carried at each continue-as-new: {final.carried}")


async def test_a_signal_accepted_while_continue_as_new_commits_lands_in_the_new_run_exactly_once(
        db_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Signals sent from inside the store call of the switch: one committed before it,
    one queued into the same group commit."""
    async with corral.open_runtime(db_path, entities=[Rollover]) as rt:
        ref = rt.ref(Rollover, "r-1")
        real = rt.store.continue_as_new
        during: list[corral.Ack] = []

        async def switch_with_signals(*args: Any, **kwargs: Any) -> int:
            during.append(await ref.signal(Rollover.note, Note(mid="before-commit"),
                                           message_id="before-commit"))
            same_batch, new_run = await asyncio.gather(
                ref.signal(Rollover.note, Note(mid="same-batch"), message_id="same-batch"),
                real(*args, **kwargs))
            during.append(same_batch)
            return int(new_run)

        monkeypatch.setattr(rt.store, "continue_as_new", switch_with_signals)
        for n in range(25):  # 2 snapshots, the journal truncated to the last 5
            await ref.signal_with_start(Rollover.note, Note(mid=f"m-{n}"), start=Chain(),
                                        message_id=f"m-{n}")
        await ref.signal(Rollover.roll)
        await wait_until(lambda: len(during) == 2, "the switch happened")
        monkeypatch.undo()
        after = await ref.signal(Rollover.note, Note(mid="after"), message_id="after")
        history = await ref.query(Rollover.history)
        info = await ref.describe()

    assert during[0].run_id == 1, "the first signal should be accepted by run 1"
    assert after.run_id == 2
    mids = [a.mid for a in history]
    assert mids == [*(f"m-{n}" for n in range(25)), "before-commit", "same-batch", "after"]
    runs = {a.mid: a.run for a in history}
    assert runs["m-24"] == 1
    assert (runs["before-commit"], runs["same-batch"], runs["after"]) == (2, 2, 2)
    check_chain(info, corral.RunStatus.RUNNING)
    assert info.run_id == 2
    # The journal holds no entry of run 1 now. Of run 2's own entries it holds those
    # after run 2's latest snapshot: none, when the snapshot at the end of the new run's
    # replay came after "after" was accepted (a race the test does not fix).
    assert {r[0] for r in sql(db_path, "SELECT run_id FROM journal")} <= {2}


async def test_a_message_id_seen_before_snapshots_truncation_and_continue_as_new_is_still_a_duplicate(  # noqa: E501
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Rollover]) as rt:
        ref = rt.ref(Rollover, "d-1")
        first = {}
        for n in range(40):
            first[n] = await ref.signal_with_start(Rollover.note, Note(mid=f"m-{n}"),
                                                   start=Chain(), message_id=f"m-{n}")
        await ref.signal(Rollover.roll, message_id="roll-1")
        await wait_until(lambda: _run_is(ref, 2), "run 2 is running")
        await ref.signal(Rollover.note, Note(mid="n-1"), message_id="n-1")
        # m-3 was accepted by run 1, covered by a snapshot and truncated; run 1 closed.
        assert sql(db_path, "SELECT count(*) FROM journal WHERE message_id='m-3'") == [(0,)]
        assert sql(db_path, "SELECT status FROM runs WHERE key='d-1' AND run_id=1") == \
            [("continued",)]

        again = await ref.signal(Rollover.note, Note(mid="m-3"), message_id="m-3")
        assert (again.status, again.run_id, again.seq) == ("duplicate", 1, first[3].seq)
        with_start = await ref.signal_with_start(Rollover.note, Note(mid="m-3"), start=Chain(),
                                                 message_id="m-3")
        assert (with_start.status, with_start.seq) == ("duplicate", first[3].seq)
        roll_again = await ref.signal(Rollover.roll, message_id="roll-1")
        assert roll_again.status == "duplicate"
        with pytest.raises(corral.IdempotencyConflictError):
            await ref.signal(Rollover.note, Note(mid="changed"), message_id="m-3")
        with pytest.raises(corral.IdempotencyConflictError):
            await ref.signal(Rollover.note, Note(mid="m-3"), message_id="m-3", sender="eve")
        history = await ref.query(Rollover.history)
        info = await ref.describe()

    assert [a.mid for a in history] == [*(f"m-{n}" for n in range(40)), "n-1"]
    assert info.run_id == 2, "the duplicate roll must not continue the run again"
    assert sql(db_path, "SELECT count(*) FROM journal WHERE message_id IN ('m-3', 'changed')") \
        == [(0,)]


async def test_a_query_right_after_continue_as_new_answers_even_when_nothing_was_carried(
        db_path: str) -> None:
    """The new run's journal is empty: its applied watermark starts where run 1 ended
    (a query waits for everything accepted, so a watermark of 0 would never answer)."""
    async with corral.open_runtime(db_path, entities=[Rollover]) as rt:
        ref = rt.ref(Rollover, "q-1")
        for n in range(3):
            await ref.signal_with_start(Rollover.note, Note(mid=f"m-{n}"), start=Chain())
        await ref.signal(Rollover.roll)
        await wait_until(lambda: _run_is(ref, 2), "run 2 is running")
        history = await asyncio.wait_for(ref.query(Rollover.history), 10)
        info = await ref.describe()
    assert [a.mid for a in history] == ["m-0", "m-1", "m-2"]
    assert (info.accepted_seq, info.applied_seq) == (4, 4)
    async with corral.open_runtime(db_path, entities=[Rollover]) as rt:  # recovery, too
        ref = rt.ref(Rollover, "q-1")
        history = await asyncio.wait_for(ref.query(Rollover.history), 10)
        assert len(history) == 3
        assert (await ref.describe()).applied_seq == 4


async def _run_is(ref: corral.EntityRef[Any], run_id: int) -> bool:
    info = await ref.describe()
    return info.run_id == run_id and info.status is corral.RunStatus.RUNNING


@pytest.mark.parametrize(("policy", "payload_size"), [
    pytest.param(corral.ContinueAsNewPolicy(max_signals=30, max_journal_entries=None,
                                            max_journal_bytes=None), 0, id="signals"),
    pytest.param(corral.ContinueAsNewPolicy(max_signals=None, max_journal_entries=30,
                                            max_journal_bytes=None), 0, id="journal-entries"),
    pytest.param(corral.ContinueAsNewPolicy(max_signals=None, max_journal_entries=None,
                                            max_journal_bytes=3_000), 90, id="journal-bytes"),
])
async def test_continue_as_new_is_suggested_once_a_policy_threshold_is_crossed(
        db_path: str, policy: corral.ContinueAsNewPolicy, payload_size: int) -> None:
    class Suggest(corral.Entity):
        continue_as_new_policy = policy
        snapshots = corral.SnapshotPolicy(every=None)

        def __init__(self) -> None:
            self.flags: list[bool] = []

        @corral.signal
        def note(self, n: Note) -> None:
            self.flags.append(self.continue_as_new_suggested)

        @corral.query
        def suggested(self) -> list[bool]:
            return list(self.flags)

    async with corral.open_runtime(db_path, entities=[Suggest]) as rt:
        ref = rt.ref(Suggest, "s-1")
        for n in range(40):
            mid = f"{n:02d}" + "x" * payload_size
            await ref.signal_with_start(Suggest.note, Note(mid=mid), start=None)
        flags = await ref.query(Suggest.suggested)
    # Read inside the handler of message n, i.e. after n messages were applied before it.
    first = flags.index(True)
    assert flags == [False] * first + [True] * (40 - first)
    assert 25 <= first <= 35, flags


@pytest.mark.parametrize(("callers", "per_caller"), [(10, 30), (50, 6)])
async def test_updates_racing_continue_as_new_are_each_applied_once_and_answered_by_that_application(  # noqa: E501
    db_path: str, callers: int, per_caller: int
) -> None:
    """An entity continuing as new every 5 updates, under many concurrent callers: each
    update counts once in the total carried along the chain, and each caller is told
    the count of its own application (so no two callers get the same count)."""
    async with corral.open_runtime(db_path, entities=[RollingCounter]) as rt:
        ref = rt.ref(RollingCounter, "counter")

        async def caller(c: int) -> list[int]:
            return [(await ref.update_with_start(RollingCounter.bump, Bump(), start=RollIn(),
                                                 update_id=f"u-{c}-{i}")).count
                    for i in range(per_caller)]

        counts = [n for got in await asyncio.gather(*(caller(c) for c in range(callers)))
                  for n in got]
        total = callers * per_caller
        assert sorted(counts) == list(range(1, total + 1))
        assert await ref.query(RollingCounter.count, activate=True) == total
        info = await ref.describe()
    assert len(info.runs) > 1  # a run applies 5 or more before it continues


async def test_an_async_update_handler_parked_when_run_continues_as_new_is_applied_once_by_the_next_run(  # noqa: E501
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[ParkedCounter]) as rt:
        ref = rt.ref(ParkedCounter, "parked")
        got = await asyncio.wait_for(
            ref.update_with_start(ParkedCounter.bump, Bump(), start=RollIn(), update_id="u-1"),
            10)
        assert (got.count, got.generation) == (1, 1)
        again = await ref.update(ParkedCounter.bump, Bump(), update_id="u-1")
        assert again == got
        info = await ref.describe()
    assert [r.status for r in info.runs] == [corral.RunStatus.CONTINUED, corral.RunStatus.RUNNING]


class Tick(BaseModel):
    n: int


class Roll(BaseModel):
    total: int = 0


class Snappy(corral.Entity):
    """Snapshots every 2 applied signals and continues as new after 3."""

    snapshots = corral.SnapshotPolicy(every=2, keep=1)

    def __init__(self, init: Roll) -> None:
        self.total, self.since = init.total, 0

    @corral.signal
    def add(self, tick: Tick) -> None:
        self.total += tick.n
        self.since += 1

    @corral.query
    def current(self) -> int:
        return self.total

    async def run(self) -> None:
        await self.wait_for(lambda: self.since >= 3)
        self.continue_as_new(Roll(total=self.total))


async def test_a_query_during_continue_as_new_is_answered_by_the_next_run(db_path: str) -> None:
    """A query parked on the closing run's activation used to wait forever."""
    async with corral.open_runtime(db_path, entities=[Snappy]) as rt:
        ref = rt.ref(Snappy, "snappy")
        for n in range(1, 13):
            await ref.signal_with_start(Snappy.add, Tick(n=1), start=Roll())
            assert await asyncio.wait_for(ref.query(Snappy.current), 10) == n
