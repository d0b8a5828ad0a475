"""Graceful shard hand-off between two real processes, on both stores (`runtime/host/_handoff`).

One host runs in a worker process (`handoff_worker.py`), the other in the test process,
which also streams signals and updates to entities on every shard and checks, per
entity, that the acknowledged messages are exactly the applied ones, in order: none
lost, none applied twice. Epochs and owners (read from the lease rows) say who took
each shard and how; no assertion is about time (the pause is `benchmarks/handoff.py`'s).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import corral
from corral.runtime import Runtime
from handoff_entities import Mark, Tally
from procs import TESTS, Worker, spawner, wait_for_exit, wait_until
from senders import Senders
from stores import sql

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL and flock")

SHARDS = 4  # as handoff_worker.py
TTL = 1.5  # renewal ticks every 0.5 s: a holder sees a request within that
KEYS = [f"t-{n}" for n in range(12)]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, TESTS / "handoff_worker.py") as start:
        yield start


def leases(db: str) -> dict[int, tuple[str, int]]:
    """{shard: (owner, epoch)} of every shard's lease row."""
    return {s: (o, e) for s, o, e in sql(db, "SELECT shard, owner, epoch FROM leases")}


async def started(spawn: Callable[..., Worker], tmp_path: Path, role: str, db: str,
                  ttl: float = TTL) -> tuple[Worker, dict[str, object]]:
    """A worker in `role`, once it wrote its status."""
    status = tmp_path / f"{role}.json"
    worker = spawn(role, role, db, str(status), str(ttl))
    await wait_until(status.exists, f"the {role} worker is ready", alive=[worker])
    return worker, json.loads(status.read_text())


class Stream:
    """One sender per key (so acceptance order is send order): signal-with-start, and
    every fifth message an update; `acked[key]` lists the acknowledged ids in order."""

    def __init__(self, rt: Runtime) -> None:
        self.refs = [rt.ref(Tally, key) for key in KEYS]
        assert {ref.shard for ref in self.refs} == set(range(SHARDS))
        self.acked: dict[str, list[str]] = {key: [] for key in KEYS}
        self._senders = Senders(self.refs, self._send, pause=0.005)

    async def _send(self, ref: corral.EntityRef[Tally, Mark], n: int) -> None:
        mid = f"{ref.key}-{n}"
        if n % 5 == 4:
            count = await ref.update(Tally.add, Mark(mid=mid), update_id=mid, timeout=60)
            assert count == n + 1  # every earlier message applied once, none twice
        else:
            await ref.signal_with_start(Tally.note, Mark(mid=mid), start=Mark(mid=""),
                                        message_id=mid)
        self.acked[ref.key].append(mid)

    async def wait_sent(self, more: int) -> None:
        """Until every sender has had `more` further messages acknowledged."""
        goal = {key: len(ids) + more for key, ids in self.acked.items()}
        await wait_until(lambda: all(len(self.acked[k]) >= n for k, n in goal.items()),
                         f"{more} more messages per key are acknowledged", timeout=60)

    async def stop_and_check(self) -> None:
        """Stop sending; then each entity applied exactly what was acknowledged."""
        await self._senders.stop()
        for ref in self.refs:
            async def applied(ref: corral.EntityRef[Tally, Mark] = ref) -> bool:
                return await ref.query(Tally.ids) == self.acked[ref.key]
            await wait_until(applied, f"{ref.key}'s acknowledged messages are applied")


async def test_every_shard_handed_from_a_live_host_to_another_under_a_stream_loses_nothing(
    db_path: str, tmp_path: Path, spawn: Callable[..., Worker],
) -> None:
    holder, status = await started(spawn, tmp_path, "host", db_path)
    before = leases(db_path)
    assert {owner for owner, _ in before.values()} == {status["owner"]}
    async with corral.open_runtime(db_path, entities=[Tally], shards=SHARDS,
                                   lease_ttl=TTL) as rt:
        assert rt.host is not None
        assert rt.host.shards == {}  # all held by the live worker
        stream = Stream(rt)
        await stream.wait_sent(10)
        taken = await rt.host.request_shards(range(SHARDS), timeout=30)
        await stream.wait_sent(10)
        await stream.stop_and_check()
        assert taken == {s: epoch + 1 for s, (_, epoch) in before.items()}
        assert leases(db_path) == {s: (rt.host.owner, epoch + 1)
                                   for s, (_, epoch) in before.items()}
        holder.check_alive()  # handed over, not killed
        assert holder.output.count("lease handed off") == SHARDS


async def test_a_host_closed_gracefully_hands_its_shards_to_the_live_host(
    db_path: str, tmp_path: Path, spawn: Callable[..., Worker],
) -> None:
    # The closing worker's lease term is long: had it left its shards to expire, they
    # would wait 60 s; it hands them over, and the heir takes each at the next epoch.
    holder, status = await started(spawn, tmp_path, "host", db_path, ttl=60.0)
    before = leases(db_path)
    async with corral.open_runtime(db_path, entities=[Tally], shards=SHARDS,
                                   lease_ttl=TTL) as rt:
        host = rt.host
        assert host is not None
        assert (host.owner, "host") in sql(db_path, "SELECT process, role FROM "
                                                    "build_processes")  # alive to receive
        stream = Stream(rt)
        await stream.wait_sent(5)
        holder.proc.send_signal(signal.SIGTERM)
        await stream.wait_sent(10)
        await stream.stop_and_check()
        await wait_for_exit([holder], timeout=30)  # a hang is reported with its stacks
        assert holder.output.count("lease handed off") == SHARDS
        assert "handed=False" not in holder.output
        assert set(host.shards) == set(range(SHARDS))
        assert leases(db_path) == {s: (host.owner, epoch + 1)
                                   for s, (_, epoch) in before.items()}
        assert status["owner"] not in {p for (p,) in sql(db_path, "SELECT process FROM "
                                                                   "build_processes")}


@pytest.mark.parametrize("role", ["request", "receive"])
async def test_a_receiver_killed_in_the_middle_of_a_hand_off_loses_no_shard_and_no_message(
    db_path: str, tmp_path: Path, spawn: Callable[..., Worker], role: str,
) -> None:
    """`request`: the heir dies after the holder released shards to it, before it took
    them (they are anyone's once the reservation ends, within a lease term); `receive`:
    it dies right after taking them (its locks go with it: taken back at once)."""
    async with corral.open_runtime(db_path, entities=[Tally], shards=SHARDS,
                                   lease_ttl=TTL) as rt:
        host = rt.host
        assert host is not None
        assert set(host.shards) == set(range(SHARDS))
        stream = Stream(rt)
        await stream.wait_sent(5)
        heir, status = await started(spawn, tmp_path, role, db_path)
        heir.sigkill()
        await wait_until(lambda: set(host.shards) == set(range(SHARDS)),
                         "the holder has every shard again", timeout=30)
        await stream.wait_sent(5)
        await stream.stop_and_check()
        after = leases(db_path)
        assert {owner for owner, _ in after.values()} == {host.owner}
        if role == "receive":  # 1 here, 2 in the receiver, 3 back here
            assert status["taken"] == {str(s): 2 for s in range(SHARDS)}
            assert {s: e for s, (_, e) in after.items()} == {s: 3 for s in range(SHARDS)}
        else:  # handed to the dead heir and taken back: 2; the others never left: 1
            offered = status["offered"]
            assert isinstance(offered, list)
            assert offered
            assert all(after[s][1] == 2 for s in offered)
            assert {e for _, e in after.values()} <= {1, 2}


async def test_a_request_of_a_dead_requester_expires_and_moves_nothing(
    db_path: str, tmp_path: Path, spawn: Callable[..., Worker],
) -> None:
    # A lease term of 600 s: no renewal tick runs by itself here; the host's lock held
    # throughout keeps its request poll out until the test runs one tick, after the dead
    # requester's request (0.5 s) expired.
    async with corral.open_runtime(db_path, entities=[Tally], shards=SHARDS,
                                   lease_ttl=600.0) as rt:
        host = rt.host
        assert host is not None
        before = leases(db_path)
        async with host.leasing:
            requester = spawn("request", "request", db_path, str(tmp_path / "r.json"), "0.5")
            await wait_until(
                lambda: len(sql(db_path, "SELECT * FROM lease_handoffs")) == SHARDS,
                "the requester asked for every shard", alive=[requester])
            requester.sigkill()
            until = max(u for (u,) in sql(db_path, "SELECT until FROM lease_handoffs"))
            await wait_until(lambda: time.time() > until + 0.1, "the request expires")
            await host._tick()
        assert set(host.shards) == set(range(SHARDS))
        assert leases(db_path) == before
