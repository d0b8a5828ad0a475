"""A SIGKILLed host's shards are taken over at once, not after its lease expires: the
kernel drops the host's OS lock on each shard lease when the process dies (SQLite), and
the server drops its session's advisory lock on each shard when the connection ends
(PostgreSQL). While the holder lives, nobody takes its shards before they expire."""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import corral
from corral.runtime.host._host import LocalHost
from procs import TESTS, Worker, spawner, wait_until
from stores import leased_owners, sql
from takeover_entities import Alarm

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL and flock")

DEFAULT_LEASE_TTL = inspect.signature(corral.open_runtime).parameters["lease_ttl"].default


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, TESTS / "takeover_worker.py") as start:
        yield start


async def test_a_restarted_process_resumes_a_killed_hosts_timer_before_its_lease_expires(
    db_path: str, tmp_path: Path, spawn: Callable[..., Worker],
) -> None:
    status = tmp_path / "status"
    worker = spawn("host", "host", db_path, str(status))
    await wait_until(status.exists, "the worker's alarm is set", alive=[worker])
    due = float(status.read_text())
    worker.sigkill()
    # lease_ttl stays at its default (10 s): waiting it out would ring ~8 s late.
    async with corral.open_runtime(db_path, entities=[Alarm]) as rt:
        ref = rt.ref(Alarm, "alarm")

        async def rang() -> bool:
            return await ref.query(Alarm.rang) is not None
        await wait_until(rang, "the alarm rings", timeout=30)
        rang_at = await ref.query(Alarm.rang)
        assert rang_at is not None
        late = rang_at - due
        print(f"\n[takeover] the alarm rang {late * 1000:.0f} ms after it was due")
        # ~10 ms on a quiet machine; waiting out the lease would ring ~8 s late. Half a
        # lease term tells the two apart even on a loaded CI runner (once 1.2 s at load 40).
        assert 0 <= late < DEFAULT_LEASE_TTL / 2
        epochs = sql(db_path, "SELECT epoch FROM leases WHERE shard=?", ref.shard)
    assert epochs == [(2,)]  # taken from the dead holder at a new epoch


async def test_a_live_holder_keeps_its_shards_however_often_another_process_starts(
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Alarm], shards=4) as first:
        assert first.host is not None
        assert len(first.host.shards) == 4
        async with corral.open_runtime(db_path, entities=[Alarm], shards=4) as second:
            assert second.host is not None
            assert second.host.shards == {}  # locks held by a live process: no takeover
        assert len(first.host.shards) == 4
        assert leased_owners(db_path) == {first.host.owner}


async def test_a_host_fenced_out_by_a_takeover_does_not_take_the_shards_straight_back(
    db_path: str,
) -> None:
    """A takeover (a restarted Ray shard actor) holds the leases at a new epoch but not
    yet the shards' locks, which the old holder drops when it finds itself fenced out:
    the old holder must not read the free lock as "the holder died"."""
    ttl = 0.6  # renewals every 0.2 s
    async with corral.open_runtime(db_path, entities=[Alarm], shards=4, lease_ttl=ttl) as first:
        first_host = first.host
        assert first_host is not None
        async with corral.open_runtime(db_path, entities=[Alarm], shards=4, lease_ttl=ttl,
                                       host=False) as second:
            taker = LocalHost(second.store, second.router,
                              second.boundary.definitions, lease_ttl=ttl,
                              poll_interval=0.005, takeover=True)
            await taker.open()
            try:
                await wait_until(lambda: not first_host.shards, "the first host is fenced out")
                await asyncio.sleep(4 * ttl)  # renewals of both, and the first's retries
                assert set(taker.shards) == {0, 1, 2, 3}
                assert not first_host.shards
                assert leased_owners(db_path) == {taker.owner}
            finally:
                await taker.close()
