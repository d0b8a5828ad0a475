"""A declared rename on the Ray backend (issue 22): shard actors running the new code
accept a client still on the old code (the definition check treats a declared rename
as compatible), and its old-name signals reach the renamed handler. The entity module
`rename_entities` is imported by name on the workers (`tests/` is on their path)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import corral
from corral.runtime.ray._connection import stop_hosts
from procs import wait_until
from rename_entities import Reply, TicketV1, TicketV2


@pytest.fixture
def namespace(ray_address: str) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    yield name
    stop_hosts(name)


async def test_actors_on_the_renamed_code_accept_a_client_on_the_old_code_and_apply_its_old_name(
        db_path: str, namespace: str) -> None:
    key = f"ticket-{uuid.uuid4().hex[:10]}"
    options = {"backend": "ray", "namespace": namespace, "shards": 2}
    async with corral.open_runtime(db_path, entities=[TicketV2], deploy=True, lease_ttl=5.0,
                                   **options) as new:
        ref = new.ref(TicketV2, key)
        await ref.signal_with_start(TicketV2.reply_from_customer, Reply(text="new"), start=None)
        async with corral.open_runtime(db_path, entities=[TicketV1], host=False,
                                       **options) as old:
            old_ref = old.ref(TicketV1, key)
            for text in ("a", "b"):
                await old_ref.signal(TicketV1.customer_reply, Reply(text=text))

        async def applied() -> bool:
            return len((await ref.query(TicketV2.replies)).texts) == 3
        await wait_until(applied, "the old client's signals are applied")
        assert (await ref.query(TicketV2.replies)).texts == ["v2:new", "v2:a", "v2:b"]
        assert await ref.dead_letters() == []
