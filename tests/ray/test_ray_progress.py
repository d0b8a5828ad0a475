"""Progress and the census on Ray: a pure client (and the census through a shard actor)
sees how far the shard actors applied, from the store (`namespace`: tests/ray/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import corral
from procs import wait_until
from ray_workers import ENTITIES, Counter, Item, Start

SHARDS = 2


async def test_a_pure_client_and_the_census_see_what_the_shard_actors_applied(
        tmp_path: Path, namespace: str) -> None:
    store = str(tmp_path / "s.db")
    async with corral.open_runtime(store, backend="ray", deploy=True, namespace=namespace,
                                   shards=SHARDS, entities=ENTITIES, lease_ttl=5.0) as rt:
        ref = rt.ref(Counter, "c-1")
        for i in range(5):
            await ref.signal_with_start(Counter.add, Item(id=str(i)), start=Start(tenant="t"))
        async with corral.open_runtime(store, entities=ENTITIES, shards=SHARDS,
                                       host=False) as client:

            async def recorded() -> bool:
                d = await client.ref(Counter, "c-1").describe()
                return (d.applied_seq, d.backlog, d.hosted_here) == (5, 0, False) and \
                    d.progress_age is not None
            await wait_until(recorded, "the shard actor records that it applied all five")
            listed = (await client.entities(Counter)).items
            assert [(e.key, e.applied_seq, e.backlog) for e in listed] == [("c-1", 5, 0)]
        census = await rt.census()  # answered by a shard actor, from the store
    assert ("Counter", "running", 1) in census.entities
    assert census.backlog == ()
    assert census.shards == SHARDS
    assert (census.hosts, census.shards_held) == (1, SHARDS)  # one host actor per node
    # on demand
