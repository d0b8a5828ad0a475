"""Schedules on the Ray backend: a Ray client creates, describes, triggers and pauses a
schedule through the host actors (it has no store of its own), and the host actor
holding the target's shard fires its ticks, each once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import corral
from corral.runtime.ray._connection import stop_hosts
from procs import sql, wait_until
from schedule_entities import Beat, Counter


@pytest.fixture
def namespace(ray_address: str) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    yield name
    stop_hosts(name)


async def test_a_ray_client_manages_a_schedule_that_the_host_actors_fire(
        db_path: str, namespace: str) -> None:
    async with corral.open_runtime(db_path, entities=[Counter], backend="ray", deploy=True,
                                   namespace=namespace, shards=2, lease_ttl=5.0) as rt:
        ref = rt.ref(Counter, "c")
        await rt.schedules.create("beat", ref, Counter.beat, Beat(), start=None,
                                  spec=corral.Interval(every=1),
                                  overlap=corral.Overlap.ALLOW)

        def fired() -> int:
            return int(sql(db_path, "SELECT count(*) FROM journal WHERE message_id "
                                    "LIKE 'schedule:beat@%'")[0][0])

        await wait_until(lambda: fired() >= 3, "three ticks fired by the host actors",
                         timeout=60)
        assert (await rt.schedules.trigger("beat", token="t-1")).outcomes == ("accepted",)
        paused = await rt.schedules.pause("beat")
        assert paused.paused
        total = fired() + 1  # the trigger's
        assert [i.id for i in await rt.schedules.list()] == ["beat"]

        async def applied() -> bool:
            return await ref.query(Counter.beats) == total
        await wait_until(applied, "every tick applied once", timeout=60)
    ids = [r[0] for r in sql(db_path, "SELECT message_id FROM journal WHERE message_id "
                                      "LIKE 'schedule:beat%'")]
    assert len(ids) == len(set(ids)) == total
