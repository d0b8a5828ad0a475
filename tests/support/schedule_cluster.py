"""For tests/ray/test_ray_schedules_cluster.py: `python schedule_cluster.py --store S
--temp T --out F`.

A `ray.cluster_utils.Cluster` of its own (a head and two worker nodes, `ray_clusters`).
The host actors hold two shards; a schedule ticks every second into a `Counter` on
shard 0; once it has fired a few ticks, the node of shard 0's host actor is removed
without grace. The restarted host actor on the other node takes the shard and the
schedule with it. Writes a JSON report: the message ids of every tick in the journal,
the ticks the counter applied, and shard 0's host before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import corral
from ray_clusters import on_cluster
from ray_workers import RUNTIME_ENV, host_info
from schedule_entities import Beat, Counter
from stores import sql

NAMESPACE = "schedule-node-loss"
TICKS = "SELECT message_id FROM journal WHERE message_id LIKE 'schedule:beat@%'"


async def _until(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.05)


async def _scenario(cluster: Any, store: str) -> dict[str, Any]:
    def fired() -> int:
        return len(sql(store, TICKS))

    async with corral.open_runtime(
        store, entities=[Counter], backend="ray", deploy=True, namespace=NAMESPACE, shards=2,
        lease_ttl=30.0,  # a stale lease never expires here: takeover is by fencing
        ray_options={"runtime_env": RUNTIME_ENV, "resources": {"corral": 0.01}},
    ) as rt:
        key = next(k for k in (f"beat-{i}" for i in range(100))
                   if rt.router.shard_of("Counter", k) == 0)
        ref = rt.ref(Counter, key)
        await rt.schedules.create("beat", ref, Counter.beat, Beat(), start=None,
                                  spec=corral.Interval(every=1), overlap=corral.Overlap.ALLOW)

        async def ticked(n: int) -> bool:
            return fired() >= n
        await _until(lambda: ticked(3), "three ticks before the loss")
        before = await host_info(NAMESPACE, 0)
        assert before is not None
        victim = next(n for n in cluster.worker_nodes if n.node_id == before["node_id"])
        at_loss = fired()
        await asyncio.to_thread(cluster.remove_node, victim, False)

        async def moved() -> bool:
            now = await host_info(NAMESPACE, 0)
            return now is not None and now["node_id"] != before["node_id"]
        await _until(moved, "shard 0 back on another node")
        after = await host_info(NAMESPACE, 0)
        restarted = fired()
        await _until(lambda: ticked(restarted + 3), "three ticks after the restart")
        await rt.schedules.pause("beat")
        ids = sorted(row[0] for row in sql(store, TICKS))

        async def applied() -> bool:
            return await ref.query(Counter.beats) >= len(ids)
        await _until(applied, "every tick fired applied")
        await asyncio.sleep(1.5)  # a tick applied twice would show by now
        beats = await ref.query(Counter.beats)
        info = await rt.schedules.describe("beat")
    return {"ids": ids, "beats": beats, "at_loss": at_loss, "before": before, "after": after,
            "fired": info.fired, "skipped": info.skipped}


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--store", "--temp", "--out"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    report = on_cluster(args.temp, NAMESPACE, lambda cluster: _scenario(cluster, args.store))
    Path(args.out).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
