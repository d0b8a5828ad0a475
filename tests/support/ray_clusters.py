"""The multi-node Ray cluster of the cluster drivers (`ray_workers.py node-loss`,
`ray_pg_cluster.py`, `ray_roll_cluster.py`, `ray_placement_cluster.py`,
`step_cluster.py`): a `ray.cluster_utils.Cluster` on loopback, in the driver's own
process, so it never clashes with the session's Ray."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

__all__ = ["on_cluster"]


def on_cluster(temp: str, namespace: str,
               work: Callable[[Any], Coroutine[Any, Any, dict[str, Any]]], *,
               workers: int = 2, resources: Mapping[str, float] | None = None
               ) -> dict[str, Any]:
    """`work(cluster)` on a fresh `Cluster`, with this process connected as the driver
    (Ray namespace `namespace`, `ray_workers.RUNTIME_ENV`); its report, with
    `cluster_start_s`.

    The head has 2 CPUs and the resource `head` (for the driver's Ray tasks);
    `workers` worker nodes have 1 CPU and `resources` each (default `{"corral": 1}`,
    what the drivers' host actors ask for). Health checks are fast: a node removed
    without grace is seen dead in ~1.5 s. Session files go under `temp`."""
    import ray
    from ray.cluster_utils import Cluster

    from ray_workers import RUNTIME_ENV

    os.makedirs(os.path.join(temp, "ray"), exist_ok=True)
    started = time.monotonic()
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 2, "resources": {"head": 1}, "node_ip_address": "127.0.0.1",
        "include_dashboard": False, "temp_dir": temp,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                           "health_check_initial_delay_ms": 0},
    })
    try:
        for _ in range(workers):
            cluster.add_node(num_cpus=1, resources=dict(resources or {"corral": 1}),
                             node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=namespace, runtime_env=RUNTIME_ENV,
                 _node_ip_address="127.0.0.1", log_to_driver=False)
        up = time.monotonic() - started
        try:
            report = asyncio.run(work(cluster))
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]
    report["cluster_start_s"] = up
    return report
