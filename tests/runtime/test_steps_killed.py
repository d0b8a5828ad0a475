"""A host SIGKILLed at random points while an agent runs 200 steps, each followed by a
send: every step's function ran once, and again only for a step that was running when
its host died (never after its result was recorded); every send was applied once by its
target, in order. On both stores."""

from __future__ import annotations

import random
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import corral
from procs import TESTS, Worker, spawner, wait_until
from step_entities import Dispatcher, Escalation

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")

STEPS = 200
KILLS = 5


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, TESTS / "step_worker.py") as start:
        yield start


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


async def test_steps_and_sends_survive_sigkills_at_random_points(
        db_path: str, tmp_path: Path, spawn: Callable[..., Worker]) -> None:
    log = tmp_path / "calls.log"
    rng = random.Random(27)
    for kill in range(KILLS):
        worker = spawn(f"host-{kill}", "host", db_path, str(log), str(STEPS))
        target = len(_calls(log)) + rng.randint(5, 30)
        await wait_until(lambda t=target: len(_calls(log)) >= t, f"{target} model calls",
                         alive=[worker], timeout=60)
        worker.sigkill()
    async with corral.open_runtime(db_path, entities=[Dispatcher, Escalation]) as rt:
        esc = rt.ref(Escalation, "esc-k-1")

        async def all_sent() -> bool:
            return len(await esc.query(Escalation.seen)) >= STEPS
        await wait_until(all_sent, "every send arrives", timeout=120)
        await rt.ref(Dispatcher, "k-1").signal(Dispatcher.proceed)
        assert await rt.ref(Dispatcher, "k-1").result(timeout=60) == STEPS
        assert await esc.query(Escalation.seen) == list(range(STEPS))
    calls = Counter(_calls(log))
    assert set(calls) == {f"model:{n}" for n in range(STEPS)}
    repeated = {name: count for name, count in calls.items() if count > 1}
    # Only a step running when its host died runs again: one repeat per kill at most.
    assert sum(count - 1 for count in repeated.values()) <= KILLS, repeated
