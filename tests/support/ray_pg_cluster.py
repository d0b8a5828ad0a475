"""Driver of tests/ray/test_ray_cluster_postgres.py: corral on a multi-node Ray cluster whose
only store is a PostgreSQL database.

    python ray_pg_cluster.py --store URL --temp DIR --out FILE --total N

Starts a `ray.cluster_utils.Cluster` (a head and two worker nodes, fast health checks),
spreads the shard actors over the workers, streams `signal_with_start` calls from the
driver (concurrent senders) and from Ray tasks on the head node, removes the worker
node of shard 0 without grace once a fifth of the stream is acknowledged, and keeps
streaming until N calls are acknowledged in all. Writes what every actor reported
(node, store), every ack, what each entity applied, and the recovery time as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import corral
from ray_clusters import on_cluster
from ray_workers import (
    ENTITIES,
    RUNTIME_ENV,
    Counter,
    Item,
    Seen,
    Start,
    host_info,
    signal_counted,
)

SHARDS, KEYS, SENDERS, TASKS = 4, 16, 8, 2
NAMESPACE = "pg-cluster"


def task_stream(store: str, who: str, keys: list[str], count: int) -> list[list[str]]:
    """A Ray task sending `count` signals round-robin to `keys`; its acks (key, mid).

    Retried by Ray if its node dies: it sends the same message ids again, which the
    store answers as duplicates, so the acks it returns cover every call it made."""
    async def send() -> list[list[str]]:
        acked: list[list[str]] = []
        async with corral.open_runtime(store, entities=ENTITIES, backend="ray",  # a client
                                       namespace=NAMESPACE, shards=SHARDS) as rt:
            for n in range(count):
                key, mid = keys[n % len(keys)], f"{who}-{n}"
                await rt.ref(Counter, key).signal_with_start(
                    Counter.add, Item(id=mid), start=Start(tenant="t"), message_id=mid)
                acked.append([key, mid])
        return acked
    return asyncio.run(send())


async def stream(cluster: Any, store: str, total: int) -> dict[str, Any]:
    import ray

    async with corral.open_runtime(
        store, entities=ENTITIES, backend="ray", deploy=True, namespace=NAMESPACE, shards=SHARDS,
        lease_ttl=30.0,  # a dead holder's lease is taken by fencing, never by expiry
        ray_options={"runtime_env": RUNTIME_ENV, "resources": {"corral": 0.01},
                     "scheduling_strategy": "SPREAD"},
    ) as rt:
        keys = [f"pg-{i}" for i in range(KEYS)]
        assert {rt.router.shard_of("Counter", k) for k in keys} == set(range(SHARDS))
        for key in keys:  # start every entity, so every shard actor exists
            await rt.ref(Counter, key).signal_with_start(
                Counter.add, Item(id=f"{key}-first"), start=Start(tenant="t"),
                message_id=f"{key}-first")
        placed: dict[int, Any] = {i: await host_info(NAMESPACE, i) for i in range(SHARDS)}
        victim = next(n for n in cluster.worker_nodes if n.node_id == placed[0]["node_id"])
        acked: list[tuple[str, str, float]] = [(k, f"{k}-first", 0.0) for k in keys]
        errors: list[str] = []
        removed_at: list[float] = []
        recovered_at: list[float] = []
        per_task = total // 5
        remote = ray.remote(task_stream).options(resources={"head": 0.01}, max_retries=3)
        tasks = [remote.remote(store, f"task{t}", keys, per_task) for t in range(TASKS)]
        driver_total = total - TASKS * per_task

        async def sender(s: int) -> None:
            n = s
            while n < driver_total:
                key, mid = keys[n % len(keys)], f"driver-{n}"
                n += SENDERS
                if await signal_counted(rt, key, mid, errors):
                    acked.append((key, mid, time.monotonic()))

        async def remover() -> None:
            deadline = time.monotonic() + 120
            while len(acked) < driver_total // 5:
                if time.monotonic() > deadline:
                    raise TimeoutError("the stream never got going")
                await asyncio.sleep(0.01)
            removed_at.append(time.monotonic())
            await asyncio.to_thread(cluster.remove_node, victim, False)
            while (now := await host_info(NAMESPACE, 0)) is None or \
                    now["node_id"] == placed[0]["node_id"]:
                if time.monotonic() > deadline:
                    raise TimeoutError("shard 0 never came back on another node")
                await asyncio.sleep(0.02)
            recovered_at.append(time.monotonic())

        await asyncio.gather(remover(), *(sender(s) for s in range(SENDERS)))
        from_tasks = [ack for acks in await asyncio.to_thread(ray.get, tasks) for ack in acks]
        after = {i: await host_info(NAMESPACE, i) for i in range(SHARDS)}
        applied: dict[str, list[str]] = {}
        described = []
        for key in keys:
            seen: Seen = await rt.ref(Counter, key).query(Counter.seen)
            applied[key] = seen.items
            described.append(await rt.ref(Counter, key).describe())
    t0 = removed_at[0]
    return {
        "placed": placed, "after": after,
        "acked": [[k, m] for k, m, _ in acked] + from_tasks,
        "errors": errors, "applied": applied,
        "settled": all(d.applied_seq == d.accepted_seq for d in described),
        "recovery_s": recovered_at[0] - t0,
        "acked_after_recovery": sum(t > recovered_at[0] for _, _, t in acked),
        "lost_node": placed[0]["node_id"],
    }


def run(store: str, temp: str, total: int) -> dict[str, Any]:
    return on_cluster(temp, NAMESPACE, lambda cluster: stream(cluster, store, total))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--store", "--temp", "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--total", type=int, default=5000)
    args = parser.parse_args(argv)
    Path(args.out).write_text(json.dumps(run(args.store, args.temp, args.total)))


if __name__ == "__main__":
    main(sys.argv[1:])
