"""Driver of tests/ray/test_ray_roll_cluster.py: a rolling deploy on a multi-node Ray
cluster whose only store is a PostgreSQL database.

    python ray_roll_cluster.py --store URL --temp DIR --out FILE

Starts a `ray.cluster_utils.Cluster` (a head and two worker nodes), spreads release 1's
shard actors over the workers, and rolls them to release 2 under the stream of
`ray_roll_stream` (driver clients of both releases, Ray tasks on the head node).
Writes the roll's steps, the acks, what each entity applied, the callers' errors and
where each actor ran, as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ray_roll_stream import Deployment, actors, roll_under_stream
from ray_workers import RUNTIME_ENV

SHARDS = 4
NAMESPACE = "roll-cluster"


async def roll(store: str) -> dict[str, Any]:
    keys = [f"rc-{i}" for i in range(4 * SHARDS)]
    dep = Deployment(store, NAMESPACE, SHARDS, keys, lease_ttl=10.0, ray_options={
        "runtime_env": RUNTIME_ENV, "resources": {"corral": 0.01},
        "scheduling_strategy": "SPREAD"})
    run = await roll_under_stream(dep, task_options={
        "runtime_env": RUNTIME_ENV, "resources": {"head": 0.01}})
    after = await actors(dep)
    return {"steps": [dataclasses.asdict(s) for s in run.steps],
            "before": run.before, "after": after, "errors": run.errors,
            "acked": sorted(run.acked), "applied": run.applied, "retries": run.retries}


def run(store: str, temp: str) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    os.makedirs(os.path.join(temp, "ray"), exist_ok=True)
    started = time.monotonic()
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 2, "resources": {"head": 1}, "node_ip_address": "127.0.0.1",
        "include_dashboard": False, "temp_dir": temp})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, resources={"corral": 1}, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=NAMESPACE, runtime_env=RUNTIME_ENV,
                 _node_ip_address="127.0.0.1", log_to_driver=False)
        up = time.monotonic() - started
        try:
            report = asyncio.run(roll(store))
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]
    report["cluster_start_s"] = up
    return report


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--store", "--temp", "--out"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args(argv)
    Path(args.out).write_text(json.dumps(run(args.store, args.temp), default=repr))


if __name__ == "__main__":
    main(sys.argv[1:])
