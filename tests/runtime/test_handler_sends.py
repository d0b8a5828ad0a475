"""Sends from a handler (`Entity.send` in a signal or update handler): written no later
than the snapshot that covers the entry the handler applied, with message ids derived
from that entry, so every send reaches its target once, in order, across SIGKILLs of
the host; a handler call that raises sends nothing. On both stores."""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import corral
from corral.persistence import Fence, StepRecord, handler_send_id, open_store
from corral.runtime.host._outbox import outgoing
from procs import TESTS, Worker, spawner, wait_until
from step_entities import Escalation, EscalationInput, Forward, Relay
from stores import sql

FORWARDS = 150
KILLS = 5


async def _seen(rt: corral.Runtime, key: str) -> list[int]:
    try:
        return await rt.ref(Escalation, key).query(Escalation.seen)
    except corral.EntityNotRunningError:  # not started yet
        return []


async def test_a_handlers_sends_reach_their_target_once_in_order(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Relay, Escalation]) as rt:
        ref = rt.ref(Relay, "r-1")
        for n in range(5):
            await ref.signal_with_start(Relay.forward, Forward(n=n),
                                        start=EscalationInput(), message_id=f"fwd-{n}")
        await wait_until(lambda: _has(rt, "esc-r-1", 10), "10 sends arrive")
        assert await _seen(rt, "esc-r-1") == list(range(10))
        ids = [r[0] for r in sql(db_path, "SELECT message_id FROM journal WHERE "
                                          "etype = 'Escalation' ORDER BY seq")]
    # Derived from the entry each handler call applied and the send's place in it.
    assert ids == [f"send:Relay/r-1/1/{seq}.{i}" for seq in range(1, 6) for i in (1, 2)]


async def _has(rt: corral.Runtime, key: str, n: int) -> bool:
    return len(await _seen(rt, key)) >= n


async def test_a_failed_handler_attempt_sends_nothing_and_its_retry_sends_once(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Relay, Escalation]) as rt:
        ref = rt.ref(Relay, "r-2")
        await ref.signal_with_start(Relay.forward, Forward(n=0, fail_first=True),
                                    start=EscalationInput())
        await ref.signal(Relay.forward, Forward(n=1))
        await wait_until(lambda: _has(rt, "esc-r-2", 4), "4 sends arrive")
        assert await ref.query(Relay.count) == 2
        assert await _seen(rt, "esc-r-2") == [0, 1, 2, 3]


async def test_an_update_sends_with_its_answer_and_a_raising_one_sends_nothing(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Relay, Escalation]) as rt:
        ref = rt.ref(Relay, "r-3")
        assert await ref.update_with_start(Relay.ask, Forward(n=7),
                                           start=EscalationInput()) == 7
        with pytest.raises(corral.UpdateFailedError, match="refused after a send"):
            await ref.update(Relay.ask, Forward(n=8, fail_first=True))
        assert await ref.update(Relay.ask, Forward(n=9)) == 9
        await wait_until(lambda: _has(rt, "esc-r-3", 2), "2 sends arrive")
        assert await _seen(rt, "esc-r-3") == [7, 9]
        # A query is no handler that applies an entry: its send is refused, unsent.
        with pytest.raises(corral.CorralError):
            await ref.query(Relay.peek)
    assert sql(db_path, "SELECT count(*) FROM journal WHERE etype = 'Escalation' "
                        "AND payload LIKE '%-1%'") == [(0,)]


async def test_a_handler_applied_again_after_a_crash_sends_duplicates_its_target_drops(
        db_path: str) -> None:
    """The crash the ids are for: a host applied `forward` (seq 1), a step's record of
    `run()` took the handler's sends along, and the host died before the snapshot that
    would cover seq 1. The next host delivers the written sends and applies seq 1 again:
    the same sends, with the same ids, are duplicates at the target."""
    async with corral.open_runtime(db_path, entities=[Relay, Escalation],
                                   host=False) as client:
        ref = client.ref(Relay, "r-9")
        await ref.signal_with_start(Relay.forward, Forward(n=0), start=EscalationInput())
        shard = ref.shard
    crashed = await open_store(db_path, shards=16)
    try:
        epoch = (await crashed.acquire_leases("crashed", [shard], 0.2))[shard]
        sends = [dataclasses.replace(
            outgoing(Escalation, "esc-r-9", Escalation.open, {"n": n, "text": "relayed"},
                     EscalationInput(), True),
            seq=n + 1, message_id=handler_send_id("Relay", "r-9", 1, 1, n + 1))
            for n in (0, 1)]
        await crashed.record_step(Fence(shard, "crashed", epoch), "Relay", "r-9", 1,
                                  StepRecord("tick", True, "null", None, 1, time.time()),
                                  sends=sends)
    finally:
        await crashed.close()
    async with corral.open_runtime(db_path, entities=[Relay, Escalation],
                                   lease_ttl=2.0) as rt:
        await wait_until(lambda: rt.ref(Relay, "r-9").query(Relay.count), "seq 1 applied")
        await wait_until(lambda: _has(rt, "esc-r-9", 2), "the sends arrive")
        await wait_until(lambda: not sql(db_path, "SELECT * FROM outbox WHERE NOT delivered"),
                         "every written send delivered")
        assert await _seen(rt, "esc-r-9") == [0, 1]
    assert sql(db_path, "SELECT count(*) FROM journal WHERE etype = 'Escalation'") == [(2,)]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, TESTS / "step_worker.py") as start:
        yield start


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")
async def test_a_handlers_sends_survive_sigkills_at_random_points(
        db_path: str, spawn: Callable[..., Worker]) -> None:
    async with corral.open_runtime(db_path, entities=[Relay, Escalation],
                                   host=False) as client:
        ref = client.ref(Relay, "k-1")
        rng = random.Random(27)
        per = FORWARDS // KILLS  # a host delivers a backlog's sends in a few batches:
        for kill in range(KILLS):  # give each host its own, killed part way through
            for n in range(kill * per, (kill + 1) * per):
                await ref.signal_with_start(Relay.forward, Forward(n=n),
                                            start=EscalationInput(), message_id=f"fwd-{n}")
            worker = spawn(f"relay-{kill}", "relay", db_path)
            target = len(await _seen(client, "esc-k-1")) + rng.randint(1, 2 * per - 1)
            await wait_until(lambda t=target: _has(client, "esc-k-1", t),
                             f"{target} sends arrive", alive=[worker], timeout=60)
            worker.sigkill()
    async with corral.open_runtime(db_path, entities=[Relay, Escalation],
                                   lease_ttl=2.0) as rt:
        await wait_until(lambda: _has(rt, "esc-k-1", 2 * FORWARDS), "every send arrives",
                         timeout=120)
        assert await _seen(rt, "esc-k-1") == list(range(2 * FORWARDS))
        assert await rt.ref(Relay, "k-1").query(Relay.count) == FORWARDS
