"""Backpressure (`Entity.max_backlog`): a hot entity under many senders never holds more
than its bound of signals accepted but not applied; every refused send got the typed
error and was stored nowhere; every accepted one was applied once. The bound is
checked in the store's accepting transaction (`tests/persistence/test_store_contract.py`
races two writers on it, both engines); here through the runtime and its hosts.

Scaled to a 2-core machine: 20 senders and a bound of 20 with a 2 ms handler (the
issue's 50 senders at 1,000 exercise the same code, only longer)."""

from __future__ import annotations

import asyncio
import collections

import pytest

import corral
from flow_entities import BOUND, Bounded, Overflowing
from procs import wait_until
from ray_workers import Item, Seen
from stores import sql

SENDERS, EACH = 20, 30


async def test_a_hot_entity_under_20_senders_never_passes_its_bound_and_applies_each_once(
    db_path: str,
) -> None:
    refusals: list[corral.EntityOverloadedError] = []
    backlogs: list[int] = []
    async with corral.open_runtime(db_path, entities=[Bounded]) as rt:
        ref = rt.ref(Bounded, "hot")
        await ref.start(start=None)

        async def sender(n: int) -> None:
            for i in range(EACH):
                mid = f"s{n}-{i}"
                while True:  # a well-behaved sender: the same id again after retry_after
                    try:
                        ack = await ref.signal(Bounded.add, Item(id=mid), message_id=mid)
                    except corral.EntityOverloadedError as err:
                        refusals.append(err)
                        await asyncio.sleep(err.retry_after)
                        continue
                    # The applied seq now is at least what the store counted from: the
                    # backlog this acceptance left is at most the bound.
                    described = await ref.describe()
                    assert described.applied_seq is not None
                    backlogs.append(ack.seq - described.applied_seq)
                    break

        await asyncio.gather(*(sender(n) for n in range(SENDERS)))

        async def all_applied() -> bool:
            return len((await ref.query(Bounded.seen)).items) == SENDERS * EACH

        await wait_until(all_applied, "every accepted signal applied")
        seen: Seen = await ref.query(Bounded.seen)
    assert refusals, "the senders never outran the entity: nothing tested"
    assert max(backlogs) <= BOUND
    assert all(e.entity_type == "Bounded" and e.key == "hot" and e.max_backlog == BOUND
               and e.backlog >= BOUND and 0 < e.retry_after <= 5 for e in refusals)
    counts = collections.Counter(seen.items)
    assert set(counts.values()) == {1}
    assert len(counts) == SENDERS * EACH
    # Each id was journaled once (a refused attempt stored nothing, its retry did).
    assert sql(db_path, "SELECT count(*) FROM dedupe WHERE key = 'hot'")[0][0] == (
        SENDERS * EACH + 1)  # and the start mark


async def test_a_refused_send_is_stored_nowhere_and_counted_as_rejected(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Bounded], host=False) as rt:
        ref = rt.ref(Bounded, "k")  # no host applies: the backlog only grows
        for n in range(BOUND):
            await ref.signal_with_start(Bounded.add, Item(id=f"m{n}"), start=None,
                                        message_id=f"m{n}")
        before = _rejected("Bounded")
        with pytest.raises(corral.EntityOverloadedError, match="max_backlog 20") as refused:
            await ref.signal(Bounded.add, Item(id="over"), message_id="over")
        assert (refused.value.backlog, refused.value.message_id) == (BOUND, "over")
        assert _rejected("Bounded") == before + 1
        # A retry of an accepted id is still answered duplicate: it adds nothing.
        again = await ref.signal(Bounded.add, Item(id="m0"), message_id="m0")
        assert again.status == "duplicate"
        # Updates and termination are never refused by the bound.
        await ref.terminate(reason="drained elsewhere")
    assert sql(db_path, "SELECT count(*) FROM journal WHERE message_id = 'over'") == [(0,)]
    assert sql(db_path, "SELECT count(*) FROM dedupe WHERE message_id = 'over'") == [(0,)]


async def test_an_overflow_dead_letter_type_keeps_what_is_over_its_bound_as_dead_letters(
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Overflowing], host=False) as rt:
        ref = rt.ref(Overflowing, "k")
        for n in range(BOUND):
            await ref.signal_with_start(Overflowing.add, Item(id=f"m{n}"), start=None)
        ack = await ref.signal(Overflowing.add, Item(id="over"), message_id="over")
        assert (ack.status, ack.seq, ack.run_id) == ("dead_lettered", 0, 1)
        [letter] = await rt.dead_letters(Overflowing, "k")
        assert (letter.id, letter.message_id, letter.name) == (ack.dead_letter_id, "over", "add")
        assert "overloaded" in letter.error
    async with corral.open_runtime(db_path, entities=[Overflowing]) as host:
        ref = host.ref(Overflowing, "k")
        replayed = await ref.replay_dead_letter(letter.id)
        assert replayed.status == "accepted"

        async def all_applied() -> bool:
            return len((await ref.query(Overflowing.seen)).items) == BOUND + 1

        await wait_until(all_applied, "the replayed letter applied")
        assert (await ref.query(Overflowing.seen)).items[-1] == "over"


def test_max_backlog_and_overflow_are_checked_when_the_class_is_defined() -> None:
    with pytest.raises(corral.EntityDefinitionError) as bad:
        class Wrong(corral.Entity):
            max_backlog = 0
            overflow = "drop"

            async def run(self) -> None:
                return None
    text = str(bad.value)
    assert "max_backlog must be a positive int or None, got 0" in text
    assert "overflow must be 'refuse' or 'dead_letter', got 'drop'" in text


def _rejected(etype: str) -> float:
    value = corral.metrics.REGISTRY.get_sample_value(
        "corral_messages_rejected_total",
        {"entity_type": etype, "reason": "EntityOverloadedError"})
    return value or 0.0
