"""Flow control on the Ray backend: the bound is checked in the shard actor's accepting
transaction (with the actor's own applied seq), and the typed error, with its fields,
reaches the caller across the Ray call; `signal_many` is split by shard, atomic per
shard."""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Iterator

import pytest

import corral
from corral.runtime.ray._connection import stop_hosts
from flow_entities import BOUND, Bounded, Brief
from procs import sql, wait_until
from ray_workers import Counter, Item, Seen, Start, Tally

SENDS = 200


@pytest.fixture
def namespace(ray_address: str) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    yield name
    stop_hosts(name)


async def test_a_hot_entity_on_ray_refuses_over_its_bound_and_applies_each_accepted_once(
    db_path: str, namespace: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Bounded], backend="ray", deploy=True,
                                   namespace=namespace, shards=2, lease_ttl=5.0) as rt:
        ref = rt.ref(Bounded, "hot")
        answers = await asyncio.gather(
            *(ref.signal_with_start(Bounded.add, Item(id=f"m{n}"), start=None,
                                    message_id=f"m{n}") for n in range(SENDS)),
            return_exceptions=True)
        refused = [a for a in answers if isinstance(a, BaseException)]
        accepted = {f"m{n}" for n, a in enumerate(answers) if isinstance(a, corral.Ack)}
        assert refused, "the senders never outran the entity: nothing tested"
        assert accepted
        for err in refused:
            assert isinstance(err, corral.EntityOverloadedError), repr(err)
            assert (err.entity_type, err.key, err.max_backlog) == ("Bounded", "hot", BOUND)
            assert err.backlog >= BOUND
            assert 0 < err.retry_after <= 5

        async def drained() -> bool:
            return len((await ref.query(Bounded.seen)).items) == len(accepted)

        await wait_until(drained, "every accepted signal applied")
        seen: Seen = await ref.query(Bounded.seen)
    assert set(collections.Counter(seen.items).values()) == {1}
    assert set(seen.items) == accepted
    stored = {r[0] for r in sql(db_path, "SELECT message_id FROM dedupe WHERE key = 'hot'")}
    assert stored == accepted  # a refused send stored nothing


async def test_signal_many_on_ray_is_split_by_shard_and_atomic_per_shard(
    db_path: str, namespace: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Counter, Tally], backend="ray", deploy=True,
                                   namespace=namespace, shards=4, lease_ttl=5.0) as rt:
        refs = [rt.ref(Counter, f"k{n}") for n in range(12)]
        start = Start(tenant="o")
        items = [corral.SignalItem(ref, Counter.add, Item(id=f"{ref.key}-{i}"),
                                   message_id=f"{ref.key}-{i}", start=start)
                 for i in range(3) for ref in refs]
        acks = await rt.signal_many(items)
        assert [(a.status, a.seq) for a in acks] == [
            ("accepted", i + 1) for i in range(3) for _ in refs]
        assert len({ref.shard for ref in refs}) > 1  # it was split

        # One item its shard's store refuses: that shard's part is refused whole, named
        # by its index in the whole batch; other shards' parts commit.
        never = rt.ref(Counter, "never-started")
        fresh = [corral.SignalItem(ref, Counter.add, Item(id=f"{ref.key}-x"),
                                   message_id=f"{ref.key}-x") for ref in refs]
        bad = corral.SignalItem(never, Counter.add, Item(id="n"), message_id="n")
        with pytest.raises(corral.BatchRefusedError) as refused:
            await rt.signal_many([*fresh, bad])
        assert refused.value.index == len(fresh)
        assert isinstance(refused.value.error, corral.EntityNotRunningError)
        same_shard = {i for i, ref in enumerate(refs) if ref.shard == never.shard}
        assert same_shard  # its shard's part held good items too: they were refused
        again = await rt.signal_many(fresh)  # resent without the bad item
        assert {i for i, a in enumerate(again) if a.status == "accepted"} == same_shard

        async def drained() -> bool:
            seen: Seen = await refs[0].query(Counter.seen)
            return len(seen.items) == 4

        await wait_until(drained, "k0's signals applied")
        assert (await refs[0].query(Counter.seen)).items == ["k0-0", "k0-1", "k0-2", "k0-x"]


async def test_shard_actors_purge_closed_runs_past_retention_and_a_purged_key_starts_afresh(
    db_path: str, namespace: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Brief], backend="ray", deploy=True,
                                   namespace=namespace, shards=2, lease_ttl=5.0) as rt:
        for n in range(6):
            await rt.ref(Brief, f"k{n}").signal_with_start(Brief.done, Item(id="m"),
                                                           start=None, message_id="m")

        def purged() -> bool:
            return sql(db_path, "SELECT count(*) FROM entities WHERE etype = 'Brief'") == [(0,)]

        await wait_until(purged, "every Brief closed and purged by its shard's actor")
        ack = await rt.ref(Brief, "k0").signal_with_start(Brief.done, Item(id="m"),
                                                          start=None, message_id="m")
    assert (ack.status, ack.run_id, ack.started) == ("accepted", 1, True)
