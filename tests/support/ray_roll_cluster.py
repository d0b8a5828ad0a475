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
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from ray_clusters import on_cluster
from ray_workers import RUNTIME_ENV

SHARDS = 4
NAMESPACE = "roll-cluster"


async def roll(store: str) -> dict[str, Any]:
    from ray_roll_stream import Deployment, actors, roll_under_stream

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
    return on_cluster(temp, NAMESPACE, lambda _: roll(store))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--store", "--temp", "--out"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args(argv)
    Path(args.out).write_text(json.dumps(run(args.store, args.temp), default=repr))


if __name__ == "__main__":
    main(sys.argv[1:])
