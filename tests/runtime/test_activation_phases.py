"""An activation's life is one `Phase`, moved only along the table `_NEXT`.

The phases an activation passes through are read from its debug log (logger
`corral.activation`, one record per move, with `phase_from`/`phase_to`), which
`Activation._enter`, the one place that moves it, writes.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import BaseModel

import corral
from corral.runtime.host._activation import _NEXT, Activation, Phase
from procs import wait_until


class Generation(BaseModel):
    n: int = 0


class Tick(BaseModel):
    pass


class TwoRuns(corral.Entity):
    """Run 0 continues as new at its first tick; run 1 returns at its first tick."""

    def __init__(self, init: Generation) -> None:
        self.generation = init.n
        self.ticks = 0

    @corral.signal
    def tick(self, _: Tick) -> None:
        self.ticks += 1

    async def run(self) -> int:
        await self.wait_for(lambda: self.ticks > 0)
        if self.generation == 0:
            self.continue_as_new(Generation(n=1))
        return self.generation


class Steady(corral.Entity):
    """No `run()`, never passivated."""

    def __init__(self, init: Generation) -> None:
        self.ticks = 0

    @corral.signal
    def tick(self, _: Tick) -> None:
        self.ticks += 1


class Dozy(corral.Entity):
    """No `run()`; passivated after 50 ms idle."""

    idle_timeout = 0.05

    def __init__(self, init: Generation) -> None:
        self.ticks = 0

    @corral.signal
    def tick(self, _: Tick) -> None:
        self.ticks += 1


def moves(caplog: pytest.LogCaptureFixture, key: str) -> list[tuple[str, str]]:
    return [(r.phase_from.value, r.phase_to.value) for r in caplog.records
            if r.name == "corral.activation" and hasattr(r, "phase_to") and r.key == key]


def live(rt: corral.Runtime, etype: type[corral.Entity], key: str) -> Activation:
    assert rt.host is not None
    name = etype._corral_definition.name
    found = [a for shard in rt.host.shards.values() if (a := shard.get(name, key))]
    assert len(found) == 1
    return found[0]


async def hosted(ref: corral.EntityRef[Any, Any]) -> bool:
    return (await ref.describe()).hosted_here


def test_every_phase_can_reach_finished_and_nothing_leaves_finished_or_returns_to_loading(
        ) -> None:
    assert set(_NEXT) == set(Phase)
    assert _NEXT[Phase.FINISHED] == frozenset()
    assert all(Phase.LOADING not in allowed for allowed in _NEXT.values())
    assert all(Phase.FINISHED in _NEXT[p] for p in Phase if p is not Phase.FINISHED)


async def test_a_move_the_table_does_not_list_is_refused_and_leaves_the_phase_as_it_was(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Steady]) as rt:
        await rt.ref(Steady, "d").signal_with_start(Steady.tick, Tick(), start=Generation())
        act = live(rt, Steady, "d")
        await act.wait_settled()
        assert act.phase is Phase.READY
        with pytest.raises(AssertionError, match="ready cannot become loading"):
            act._enter(Phase.LOADING)
        assert act.phase is Phase.READY


async def test_an_activation_loads_serves_continues_as_new_and_its_successor_closes_the_run(
        db_path: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="corral.activation")
    async with corral.open_runtime(db_path, entities=[TwoRuns]) as rt:
        ref = rt.ref(TwoRuns, "t")
        await ref.signal_with_start(TwoRuns.tick, Tick(), start=Generation())
        await wait_until(lambda: moves(caplog, "t")[-1:] == [("loading", "ready")]
                         and len(moves(caplog, "t")) > 1, "run 2 is loaded")
        await ref.signal(TwoRuns.tick, Tick())
        assert await ref.result(timeout=30) == 1
        await wait_until(lambda: len(moves(caplog, "t")) >= 8, "run 2's activation is dropped")
    # (A journal tail's safety poll may hand an entry back later: an activation then
    # loads, finds no running run and finishes; that is not this life.)
    assert moves(caplog, "t")[:8] == [
        ("loading", "ready"), ("ready", "continuing"), ("continuing", "closed"),
        ("closed", "finished"),  # run 1
        ("loading", "ready"), ("ready", "closing"), ("closing", "closed"),
        ("closed", "finished"),  # run 2
    ]


async def test_an_idle_activation_passivates_and_a_message_loads_the_next(
        db_path: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="corral.activation")
    async with corral.open_runtime(db_path, entities=[Dozy]) as rt:
        ref = rt.ref(Dozy, "p")
        await ref.signal_with_start(Dozy.tick, Tick(), start=Generation())
        await wait_until(lambda: _not(hosted(ref)), "the idle entity is passivated")
        await ref.signal(Dozy.tick, Tick())
        await wait_until(lambda: len(moves(caplog, "p")) >= 4, "it is loaded again")
    assert moves(caplog, "p")[:4] == [
        ("loading", "ready"), ("ready", "passivating"), ("passivating", "finished"),
        ("loading", "ready"),
    ]


async def test_a_host_closing_stops_its_activations_without_forwarding_their_inbox(
        db_path: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="corral.activation")
    async with corral.open_runtime(db_path, entities=[Steady]) as rt:
        await rt.ref(Steady, "s").signal_with_start(Steady.tick, Tick(), start=Generation())
        await live(rt, Steady, "s").wait_settled()
    assert moves(caplog, "s") == [
        ("loading", "ready"), ("ready", "stopping"), ("stopping", "finished")]


async def _not(flag: Any) -> bool:
    return not await flag
