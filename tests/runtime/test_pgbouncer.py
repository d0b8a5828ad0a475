"""corral behind PgBouncer in transaction mode (issue 42, item 3): host processes and
clients share a few server connections (`?pool=transaction`: no LISTEN, no advisory
locks, no prepared statements, limits set per transaction).

A real PgBouncer (`tests/support/pgbouncer.py`) in front of a fresh database of the
session's cluster; hosts are real processes (`tests/support/mp_worker.py`), killed with
SIGKILL. The store is read directly, past PgBouncer.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

import corral
from bounded_entities import Reminder, Wake
from bounded_entities import Start as ReminderStart
from mp_entities import Clocked, Job, Pipeline, Recorder
from pg import pg_url as pg_fixture  # noqa: F401 (fixtures, found by name)
from pg import postgres_url as cluster_fixture  # noqa: F401
from pgbouncer import POOL_SIZE, bouncer
from procs import Worker, spawner, wait_for_exit, wait_until
from stores import sql

WORKER = Path(__file__).resolve().parents[1] / "support" / "mp_worker.py"
ENTITIES: list[type[corral.Entity]] = [Clocked, Pipeline, Recorder]
TTL = 1.0
WAIT = 60.0

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")


@pytest.fixture
def bounced(pg_url: str) -> Iterator[str]:
    """The test database's URL through PgBouncer (transaction mode)."""
    with bouncer(pg_url) as url:
        yield url


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, WORKER) as start:
        yield start


def server_connections(pg_url: str) -> int:
    """Client backends on the database, but the one asking."""
    return int(sql(pg_url, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND backend_type = 'client backend' "
                           "AND pid <> pg_backend_pid()")[0][0])


async def caught_up(ref: corral.EntityRef[corral.Entity]) -> bool:
    info = await ref.describe()
    return info.hosted_here and info.applied_seq == info.accepted_seq


async def test_signal_with_start_from_two_processes_through_pgbouncer_starts_one_run_and_applies_each_once(  # noqa: E501
        tmp_path: Path, pg_url: str, bounced: str, spawn: Callable[..., Worker]) -> None:
    key, procs, per_proc = "order-7", 2, 100
    go, fire = tmp_path / "go", tmp_path / "fire"
    workers = [
        spawn(f"swarm{i}", "swarm", "--db", bounced, "--lease-ttl", str(TTL), "--index", str(i),
              "--count", str(per_proc), "--key", key, "--go", str(go), "--fire", str(fire),
              "--ready", str(tmp_path / f"ready{i}.json"), "--out", str(tmp_path / f"acks{i}.json"))
        for i in range(procs)
    ]
    go.touch()
    await wait_until(lambda: all((tmp_path / f"ready{i}.json").exists() for i in range(procs)),
                     "every worker has opened the store", timeout=WAIT, alive=workers)
    fire.touch()
    await wait_for_exit(workers)

    acks = [a for i in range(procs)
            for a in json.loads((tmp_path / f"acks{i}.json").read_text())]
    assert [a for a in acks if "error" in a] == []
    assert len([a for a in acks if a["started"]]) == 1, "more than one call started a run"
    assert sorted(a["seq"] for a in acks) == list(range(1, procs * per_proc + 1))
    async with corral.open_runtime(bounced, entities=ENTITIES, lease_ttl=TTL) as rt:
        ref = rt.ref(Recorder, key)
        await wait_until(lambda: caught_up(ref), "the parent hosts the entity and caught up",
                         timeout=WAIT)
        applied = await ref.query(Recorder.applied_ids)
        assert server_connections(pg_url) <= POOL_SIZE  # every process shares PgBouncer's
    assert sorted(applied) == sorted(a["mid"] for a in acks)
    assert len(applied) == len(set(applied)), "a signal was applied twice"
    assert sql(pg_url, "SELECT run_id, status FROM runs WHERE key=?", key) == [(1, "running")]


async def test_through_pgbouncer_a_sigkilled_hosts_shards_are_taken_when_its_leases_expire(
        tmp_path: Path, pg_url: str, bounced: str, spawn: Callable[..., Worker]) -> None:
    keys, jobs = [f"pipe-{i}" for i in range(4)], 3
    ready = tmp_path / "ready.json"
    host_a = spawn("host-a", "pipeline", "--db", bounced, "--lease-ttl", str(TTL),
                   "--ready", str(ready), "--keys", ",".join(keys), "--jobs", str(jobs))
    await wait_until(ready.exists, "host A's entities processed their jobs", timeout=WAIT,
                     alive=[host_a])
    a = json.loads(ready.read_text())
    async with corral.open_runtime(bounced, entities=ENTITIES, lease_ttl=TTL) as rt:
        assert rt.host is not None
        host_a.sigkill()
        refs = {key: rt.ref(Pipeline, key) for key in keys}
        for key, ref in refs.items():
            await wait_until(partial(caught_up, ref), f"{key} is hosted here", timeout=WAIT)
            await ref.signal(Pipeline.jobs, Job(mid="finish"))
        for key, ref in refs.items():
            assert await ref.result(timeout=30) == [f"{key}-j{n}" for n in range(1, jobs + 1)]
        leases = {s: (o, e) for s, o, e in sql(pg_url, "SELECT shard, owner, epoch FROM leases")}
        for shard in {r.shard for r in refs.values()}:
            assert leases[shard][0] == rt.host.owner != a["owner"]
            assert leases[shard][1] >= 2


async def test_a_durable_timer_fires_through_pgbouncer(bounced: str, pg_url: str) -> None:
    due = time.time() + 1.0
    async with corral.open_runtime(bounced, entities=[Reminder], lease_ttl=TTL) as rt:
        ref = rt.ref(Reminder, "t-1")
        await ref.signal_with_start(Reminder.wake, Wake(at=due), start=ReminderStart())
        fired = await ref.result(timeout=30)
    assert fired.fired_at >= due
    assert sql(pg_url, "SELECT count(*) FROM timers") == [(0,)]
