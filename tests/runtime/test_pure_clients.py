"""What a pure client (`host=False`) accepts is applied by the host that takes its shard.

A pure client only routes: it computes each key's shard and writes it on the entity's
row, and the host that takes that shard recovers the entity from its row
(`_shard.recover`: `running_entities(shards)`). The two must route by the same shard count,
the store's, whatever the client was given: a client handed a `Store` object without
`shards=` routed by 16, so in a store of fewer shards its entities sat on rows of
shards no host ever takes. They stayed RUNNING with a backlog and were never applied
(the lost apply reported with the PostgreSQL fault proxy; issue 39, item 5).
"""

from __future__ import annotations

import corral
from corral.persistence import open_store
from entities import Reply, Start, Ticket
from procs import wait_until

# Fixed keys: routed by 16, all but a sixteenth of keys miss the shard of a 1-shard store.
KEYS = [f"ticket-client-{i}" for i in range(8)]


async def test_a_pure_clients_acknowledged_starts_are_applied_by_the_host_that_takes_their_shard(
    db_path: str,
) -> None:
    store = await open_store(db_path, shards=1)
    try:
        async with corral.open_runtime(store, entities=[Ticket], host=False) as client:
            for key in KEYS:
                ack = await client.ref(Ticket, key).signal_with_start(
                    Ticket.reply, Reply(text="m1"), start=Start(tenant="acme"),
                    message_id="m1")
                assert (ack.status, ack.started) == ("accepted", True)
    finally:
        await store.close()

    async with corral.open_runtime(db_path, entities=[Ticket], shards=1) as host:

        async def all_applied() -> bool:
            infos = [await host.ref(Ticket, key).describe() for key in KEYS]
            return all(i.applied_seq == i.accepted_seq == 1 for i in infos)
        await wait_until(all_applied, "the new host applies every acknowledged start")
        for key in KEYS:
            assert (await host.ref(Ticket, key).query(Ticket.status)).inbox == ["acme:m1"]
