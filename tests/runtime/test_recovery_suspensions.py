"""A shard being taken knows its suspended runs before anything activates one of its
entities (guarantee 14): a message routed to it while it still reads its recovery waits
for that read. An activation made before would not know it resumes a suspended run: the
fixed code would run on and the run stay marked suspended (and a failing attempt would
count from 1 again)."""

from __future__ import annotations

import asyncio
import time

import corral
from corral.persistence import Fence, open_store
from corral.runtime._clock import SystemClock
from corral.runtime.client._router import Router
from corral.runtime.host._shard import Shard, recover
from entities import Reply, fresh_key
from procs import wait_until
from stores import sql
from test_suspended_runs import BUG, Begin, Toggled, _suspended

SHARDS = 16


async def test_a_message_routed_while_the_shard_reads_its_recovery_finds_the_run_suspended(
    db_path: str,
) -> None:
    key = fresh_key()
    BUG["on"] = True
    try:
        async with corral.open_runtime(db_path, entities=[Toggled], shards=SHARDS) as rt:
            ref = rt.ref(Toggled, key)
            await ref.signal_with_start(Toggled.reply, Reply(text="r0"),
                                        start=Begin(tenant="a"))
            await _suspended(ref)
            await ref.signal(Toggled.reply, Reply(text="r1"))
    finally:
        BUG["on"] = False  # the fix, deployed with the next host
    store = await open_store(db_path, shards=SHARDS)
    try:
        index = Router(SHARDS).shard_of("Toggled", key)
        taken = await store.acquire_leases("next-host", [index], 10.0)
        definition = Toggled._corral_definition  # type: ignore[attr-defined]
        shard = Shard(Fence(index, "next-host", taken[index]), store,
                      {"Toggled": definition}, SystemClock())
        late = (await store.journal("Toggled", key, run_id=1, after_seq=0))[-1]
        recovering = asyncio.create_task(recover([shard], store, time.time()))  # before
        shard.route(late)  # it has read anything, the tail hands it the run's latest signal
        await recovering

        def answered() -> bool:
            act = shard.get("Toggled", key)
            return act is not None and act.entity is not None \
                and act.entity.answered == ["r0", "r1"]  # type: ignore[attr-defined]
        await wait_until(answered, "the fixed code answers both replies")
        await wait_until(lambda: sql(db_path, "SELECT count(*) FROM suspensions WHERE key = ?",
                                     key) == [(0,)],
                         "the resumed run's suspension is cleared", timeout=10.0)
        await shard.stop()
    finally:
        BUG["on"] = True
        await store.release_leases("next-host")
        await store.close()
