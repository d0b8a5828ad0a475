"""A host records the progress of an entity still loading: one whose recovery replays a
backlog and whose handler blocks in it is not "ready" until the replay ends, yet what
it applied is recorded, so a client, `corral ls/show` and the census see how far it
got (the stuck entity is the one an operator looks for)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

import corral
import corral.runtime.host._progress as progress
from entities import fresh_key
from procs import wait_until

BLOCKS_AT = 11
GATES: dict[str, asyncio.Event] = {}


class Step(BaseModel):
    n: int


class Stepper(corral.Entity):
    """Its handler of step `BLOCKS_AT` waits for the test's gate for its key."""

    steps: list[int]

    def __init__(self) -> None:
        self.steps = []

    @corral.signal
    async def step(self, step: Step) -> None:
        if step.n == BLOCKS_AT:
            await GATES[self.key].wait()
        self.steps.append(step.n)


async def test_an_entity_blocked_in_its_first_replay_has_its_progress_recorded(
        db_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "PROGRESS_INTERVAL", None)  # rounds run by the test
    key = fresh_key("stuck")
    GATES[key] = asyncio.Event()
    async with corral.open_runtime(db_path, entities=[Stepper], shards=1,
                                   host=False) as client:
        ref = client.ref(Stepper, key)
        for n in range(1, BLOCKS_AT + 2):  # a backlog, before any host
            await ref.signal_with_start(Stepper.step, Step(n=n), start=None)
        async with corral.open_runtime(db_path, entities=[Stepper], shards=1) as rt:
            assert rt.host is not None
            shard = rt.host.shards[0]
            await wait_until(lambda: (act := shard.get("Stepper", key)) is not None
                             and act.applied_seq == BLOCKS_AT - 1,
                             "the replay blocked in the handler of step 11")
            act = shard.get("Stepper", key)
            assert act is not None
            assert not act.is_ready  # still loading
            assert await rt.host.record_progress() == 1
            d = await ref.describe()  # the pure client reads the store
            assert (d.applied_seq, d.accepted_seq, d.backlog) == (10, 12, 2)
            GATES.pop(key).set()
            await wait_until(lambda: act.applied_seq == BLOCKS_AT + 1, "the rest applied")
            assert await rt.host.record_progress() == 1
            assert (await ref.describe()).applied_seq == BLOCKS_AT + 1
