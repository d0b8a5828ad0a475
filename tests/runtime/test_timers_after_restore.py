"""A restored entity reports its pending deadline throughout: its durable timer rows
stay from the passivation until its `run()` waits again (then replaced, in the same
transaction, by the timer it sets), not deleted when the activation comes back and
re-created later, so `describe().timers` is never empty meanwhile (and never holds the
deadline twice)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

import corral
from entities import fresh_key
from procs import wait_until
from stores import sql

GATES: dict[str, asyncio.Event] = {}
STARTS: dict[str, int] = {}


class Mode(BaseModel):
    wait: bool  # a durable signal wait; else a durable sleep


class Decision(BaseModel):
    ok: bool


class Napper(corral.Entity):
    """`run()` sleeps until a deadline kept in state (or waits on a signal wait with a
    timeout); from its second start on it first waits for the test's gate, as a
    restored `run()` busy before it reaches its wait again."""

    approval = corral.wait(Decision)

    due: float | None

    def __init__(self, init: Mode) -> None:
        self.wait = init.wait
        self.due = None

    @corral.signal
    def poke(self) -> None:
        pass

    async def run(self) -> None:
        STARTS[self.key] = STARTS.get(self.key, 0) + 1
        if STARTS[self.key] > 1:
            await GATES[self.key].wait()
        if self.wait:
            await self.wait_for_signal(Napper.approval, timeout=3600)
            return
        if self.due is None:
            self.due = self.now() + 3600
            await self.checkpoint()
        await self.sleep_until(self.due)


@pytest.mark.parametrize("wait", [False, True], ids=["sleep", "signal-wait"])
async def test_a_restored_entity_reports_its_pending_deadline_until_run_waits_again(
        db_path: str, wait: bool) -> None:
    key = fresh_key("napper")
    GATES[key] = asyncio.Event()
    async with corral.open_runtime(db_path, entities=[Napper], shards=1) as rt:
        assert rt.host is not None
        shard = rt.host.shards[0]
        ref = rt.ref(Napper, key)
        await ref.start(start=Mode(wait=wait))
        await wait_until(lambda: _waiting(shard, key), "run() waits under its timer")
        [due] = (await ref.describe()).timers
        act = shard.get("Napper", key)
        assert act is not None
        await act.passivate()
        assert (await ref.describe()).timers == (due,)

        await ref.signal(Napper.poke)  # brings it back: run() restarts, held at the gate
        await wait_until(lambda: STARTS[key] == 2, "run() restarted")
        assert (await ref.describe()).timers == (due,)  # restored, run() not there yet
        GATES.pop(key).set()
        await wait_until(lambda: _waiting(shard, key), "run() waits again")
        assert (await ref.describe()).timers == (due,)
        assert _rows(db_path, key) == 1


def _waiting(shard: Any, key: str) -> bool:
    act = shard.get("Napper", key)
    return act is not None and act.is_ready and not act.busy


def _rows(db_path: str, key: str) -> int:
    return int(sql(db_path, "SELECT count(*) FROM timers WHERE key = ?", key)[0][0])
