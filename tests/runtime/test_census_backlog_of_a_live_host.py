"""The census's backlog comes from the summaries its live holders write (issue 42).

A host holding every shard, with handlers blocked on some entities, writes each shard's
backlog by type with its progress round; the census sums those summaries and they
equal the exact count of the store's rows (messages behind, entities behind, the
oldest unapplied message's accepted_at), falling to nothing once the handlers go on.
When the holder's leases are gone (expired, as a dead host's do, or released) its
summaries are never read: the census counts those shards exactly from the store, so
what was accepted after the last summary shows.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pydantic import BaseModel

import corral
import corral.runtime.host._progress as progress
from acceptances import opened
from corral.persistence import TypeBacklog
from corral.persistence._backlog import EXACT, VOUCHED
from corral.runtime.host._activation import Activation
from entities import fresh_key
from procs import wait_until
from stores import is_postgres, sql

SHARDS = 2
GATES: dict[str, asyncio.Event] = {}


class Step(BaseModel):
    n: int


class Gated(corral.Entity):
    """Its handler of step 1 waits for the test's gate for its key, if there is one."""

    def __init__(self) -> None:
        self.steps = 0

    @corral.signal
    async def step(self, step: Step) -> None:
        if step.n == 1 and (gate := GATES.get(self.key)) is not None:
            await gate.wait()
        self.steps = step.n


def _truth(location: str) -> tuple[TypeBacklog, ...]:
    """The backlog counted exactly from the store's rows, every shard."""
    greatest = "greatest" if is_postgres(location) else "max"
    rows = sql(location, EXACT.format(greatest=greatest, shards=""))
    return tuple(TypeBacklog(r[0], int(r[1]), int(r[2]), r[3]) for r in sorted(rows))


async def _census(location: str) -> tuple[TypeBacklog, ...]:
    async with opened(location, SHARDS) as store:
        return (await store.census()).backlog


def _vouched(location: str) -> list[Any]:
    """The shards a live lease vouches for (the census sums their summaries)."""
    return sql(location, VOUCHED, time.time())


def _act(rt: Any, key: str) -> Activation:
    found = [a for s in rt.host.shards.values() if (a := s.get("Gated", key)) is not None]
    assert len(found) == 1
    return found[0]


def _known_behind(rt: Any) -> list[int]:
    """The messages behind each resident entity known to be behind."""
    return sorted(b[0] for s in rt.host.shards.values() for a in s.activations()
                  if (b := a.backlog()) is not None and b[0])


async def test_the_census_sums_a_live_hosts_backlog_summaries_and_they_equal_the_rows(
        db_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "PROGRESS_INTERVAL", None)  # rounds run by the test
    blocked = [fresh_key("blocked") for _ in range(3)]
    free = [fresh_key("free") for _ in range(3)]
    for key in blocked:
        GATES[key] = asyncio.Event()
    async with corral.open_runtime(db_path, entities=[Gated], shards=SHARDS) as rt:
        assert rt.host is not None
        assert len(rt.host.shards) == SHARDS
        for key in blocked + free:
            for n in (1, 2, 3):
                await rt.ref(Gated, key).signal_with_start(Gated.step, Step(n=n), start=None)
        for key in free:
            await _act(rt, key).wait_applied(3)
        await wait_until(lambda: _known_behind(rt) == [3, 3, 3], "the blocked ones known")
        await rt.host.record_progress()
        truth = _truth(db_path)
        assert [(b.messages, b.entities) for b in truth] == [(9, 3)]  # all of the blocked
        assert len(_vouched(db_path)) == SHARDS  # the census reads the summaries
        assert await _census(db_path) == truth
        for key in blocked:
            GATES.pop(key).set()
        for key in blocked:
            await _act(rt, key).wait_applied(3)
        await rt.host.record_progress()
        assert len(_vouched(db_path)) == SHARDS
        assert await _census(db_path) == _truth(db_path) == ()


async def test_the_census_counts_exactly_the_shards_whose_holder_is_gone(
        db_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "PROGRESS_INTERVAL", None)  # rounds run by the test
    blocked = [fresh_key("blocked") for _ in range(3)]
    for key in blocked:
        GATES[key] = asyncio.Event()
    try:
        async with corral.open_runtime(db_path, entities=[Gated], shards=SHARDS) as rt:
            assert rt.host is not None
            owner = rt.host.owner
            for key in blocked:
                for n in (1, 2):
                    await rt.ref(Gated, key).signal_with_start(Gated.step, Step(n=n),
                                                               start=None)
            await wait_until(lambda: _known_behind(rt) == [2, 2, 2], "the blocked ones known")
            await rt.host.record_progress()
            assert len(_vouched(db_path)) == SHARDS
            assert await _census(db_path) == _truth(db_path)
    finally:
        for key in blocked:
            GATES.pop(key).set()
    # Closed: its leases released, its summaries left as they were (six behind).
    assert sql(db_path, "SELECT sum(messages) FROM backlogs")[0][0] == 6
    async with corral.open_runtime(db_path, entities=[Gated], shards=SHARDS,
                                   host=False) as client:
        await client.ref(Gated, blocked[0]).signal(Gated.step, Step(n=3))
    assert _vouched(db_path) == []
    truth = _truth(db_path)
    assert [(b.messages, b.entities) for b in truth] == [(7, 3)]
    assert await _census(db_path) == truth
    # Killed: its leases still name it, at the epoch of its summaries, and expired.
    sql(db_path, "UPDATE leases SET owner = ?, expires_at = ? WHERE epoch > 0", owner,
        time.time() - 1)
    assert _vouched(db_path) == []
    assert await _census(db_path) == truth
