"""Flow control on the Ray backend: the bound is checked in the shard actor's accepting
transaction (with the actor's own applied seq), and the typed error, with its fields,
reaches the caller across the Ray call."""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Iterator

import pytest

import corral
from corral.runtime._ray import stop_hosts
from flow_entities import BOUND, Bounded, Item, Seen
from procs import sql, wait_until

SENDS = 200


@pytest.fixture
def namespace(ray_address: str) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    yield name
    stop_hosts(name)


async def test_a_hot_entity_on_ray_refuses_over_its_bound_and_applies_each_accepted_once(
    db_path: str, namespace: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Bounded], backend="ray",
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
