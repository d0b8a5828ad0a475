"""Driver of tests/ray/test_ray_placement.py's cluster tests (and of
benchmarks/placement.py): elastic placement on a multi-node Ray cluster.

    python ray_placement_cluster.py --store URL_OR_PATH --temp DIR --out FILE
        [--workers 2] [--add 2] [--drain [--undrain]] [--remove] [--shards 16]
        [--total 3000]

Starts a `ray.cluster_utils.Cluster` (a head for the driver and Ray tasks, `--workers`
worker nodes that can run host actors), starts every entity (counters, passivated
alarms under durable timers, gates waiting for a durable signal) and streams
`signal_with_start` calls from the driver (concurrent senders) and from Ray tasks on
the head while, in turn: `--add` workers join (the placer moves shards to them until
max - min <= 1 shard per host), one worker is drained and removed (or undrained,
`--undrain`: it takes its share back, and is drained again), and another is removed
without grace (`remove_node`). Drains and undrains go through the `corral nodes`
command (`corral nodes drain --json`, `drain_node` underneath), and `corral nodes`
lists the nodes after the drain. Writes the assignment after each phase, the
moves and their pauses, every ack, what each entity applied, and the timers' and
waits' outcomes as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter as Tally
from pathlib import Path
from typing import Any

import corral
from corral.runtime.ray._directory import assignment
from ray_clusters import on_cluster
from ray_workers import (
    RUNTIME_ENV,
    Alarm,
    Counter,
    Gate,
    Item,
    Seen,
    Start,
    Verdict,
    Wake,
    signal_counted,
)

NAMESPACE, KEYS, SENDERS, TASKS = "placement", 32, 6, 2
ENTITIES = [Counter, Alarm, Gate]


def options(store: str, shards: int) -> dict[str, Any]:
    return {"store": store, "entities": ENTITIES, "backend": "ray", "namespace": NAMESPACE,
            "shards": shards, "lease_ttl": 10.0, "deploy": True,
            "ray_options": {"runtime_env": RUNTIME_ENV, "resources": {"corral": 0.01}}}


def task_stream(store: str, shards: int, who: str, keys: list[str], stop_file: str
                ) -> list[list[str]]:
    """A Ray task (on the head: one machine) sending signals round-robin to `keys` until
    `stop_file` exists; its acks."""
    async def send() -> list[list[str]]:
        acked: list[list[str]] = []
        async with corral.open_runtime(**options(store, shards)) as rt:
            n = 0
            while not os.path.exists(stop_file):  # noqa: ASYNC240 (a stat per send)
                key, mid = keys[n % len(keys)], f"{who}-{n}"
                n += 1
                await rt.ref(Counter, key).signal_with_start(
                    Counter.add, Item(id=mid), start=Start(tenant="t"), message_id=mid)
                acked.append([key, mid])
        return acked
    return asyncio.run(send())


def loads(namespace: str) -> dict[str, int]:
    """Shards per host actor, as the directory says."""
    return dict(Tally(assignment(namespace).values()))


async def wait_balanced(hosts: int, timeout: float = 180.0) -> float:
    """Seconds until `hosts` host actors hold the shards within one of each other."""
    began = time.monotonic()
    while True:
        load = await asyncio.to_thread(loads, NAMESPACE)
        if len(load) == hosts and max(load.values()) - min(load.values()) <= 1:
            return time.monotonic() - began
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"not balanced over {hosts} hosts: {load}")
        await asyncio.sleep(0.05)


def corral_command(address: str, *argv: str) -> str:
    """What `corral ARGV --namespace NAMESPACE --address ADDRESS` printed, run as an
    operator would: a process of its own, joining the cluster (blocking)."""
    done = subprocess.run(
        [sys.executable, "-m", "corral", *argv, "--namespace", NAMESPACE, "--address", address],
        capture_output=True, text=True, timeout=240, check=False,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    if done.returncode != 0:
        raise RuntimeError(f"corral {' '.join(argv)} exited {done.returncode}: {done.stderr}")
    return done.stdout


async def corral_json(address: str, *argv: str) -> Any:
    return json.loads(await asyncio.to_thread(corral_command, address, *argv, "--json"))


async def scenario(cluster: Any, args: argparse.Namespace) -> dict[str, Any]:
    import ray

    report: dict[str, Any] = {"phases": {}, "steps": []}
    async with corral.open_runtime(**options(args.store, args.shards)) as rt:
        keys = [f"p-{i}" for i in range(KEYS)]
        for key in keys:
            await rt.ref(Counter, key).signal_with_start(
                Counter.add, Item(id=f"{key}-first"), start=Start(tenant="t"),
                message_id=f"{key}-first")
        alarm_due = time.time() + args.alarm_after
        alarms = [rt.ref(Alarm, f"alarm-{i}") for i in range(4)]
        gates = [rt.ref(Gate, f"gate-{i}") for i in range(4)]
        for ref in alarms:
            await ref.signal_with_start(Alarm.poke, start=Wake(at=alarm_due))
        for gate in gates:
            await gate.start(start=Start(tenant="t"))
        report["phases"]["start"] = await asyncio.to_thread(loads, NAMESPACE)
        report["balanced_at_start_s"] = await wait_balanced(args.workers)
        acked: list[tuple[str, str]] = [(k, f"{k}-first") for k in keys]
        errors: list[str] = []
        stop = asyncio.Event()
        stop_file = str(Path(args.out).with_suffix(".stop"))
        remote = ray.remote(task_stream).options(resources={"head": 0.01}, max_retries=3)
        tasks = [remote.remote(args.store, args.shards, f"task{t}", keys, stop_file)
                 for t in range(TASKS)]

        async def sender(s: int) -> None:
            n = 0
            while not stop.is_set():
                key, mid = keys[(n * SENDERS + s) % len(keys)], f"driver{s}-{n}"
                n += 1
                if await signal_counted(rt, key, mid, errors):
                    acked.append((key, mid))

        async def after(count: int) -> None:
            deadline = time.monotonic() + 180
            while len(acked) < count:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the stream stalled at {len(acked)} acks: {errors[:3]}")
                await asyncio.sleep(0.01)

        async def phases() -> None:
            step = args.total // 5
            hosts = args.workers
            if args.add:
                await after(step)
                joined = time.monotonic()
                for _ in range(args.add):
                    cluster.add_node(num_cpus=1, resources={"corral": 1},
                                     node_ip_address="127.0.0.1")
                await asyncio.to_thread(cluster.wait_for_nodes)
                hosts += args.add
                await wait_balanced(hosts)
                report["join_to_balanced_s"] = time.monotonic() - joined
                report["phases"]["joined"] = await asyncio.to_thread(loads, NAMESPACE)
            workers = list(cluster.worker_nodes)
            if args.drain:
                await after(len(acked) + step)
                drained = await corral_json(cluster.address, "nodes", "drain",
                                            workers[0].node_id)
                hosts -= 1
                report["drain_s"] = drained["seconds"]
                report["drained_node"] = drained["node_id"]
                report["drain_stopped"] = drained["stopped"]
                report["steps"] = drained["steps"]
                await wait_balanced(hosts)
                report["phases"]["drained"] = await asyncio.to_thread(loads, NAMESPACE)
                report["nodes_drained"] = await corral_json(cluster.address, "nodes")
                if args.undrain:  # it takes its share back, and is drained again
                    report["undrain_text"] = await asyncio.to_thread(
                        corral_command, cluster.address, "nodes", "undrain",
                        drained["node_id"])
                    hosts += 1
                    await wait_balanced(hosts)
                    report["phases"]["undrained"] = await asyncio.to_thread(loads, NAMESPACE)
                    report["nodes_undrained_text"] = await asyncio.to_thread(
                        corral_command, cluster.address, "nodes")
                    report["drain_text"] = await asyncio.to_thread(
                        corral_command, cluster.address, "nodes", "drain", drained["node_id"])
                    hosts -= 1
                    await wait_balanced(hosts)
                else:
                    await asyncio.to_thread(cluster.remove_node, workers[0], True)
            if args.remove:
                await after(len(acked) + step)
                victim = workers[-1]
                removed = time.monotonic()
                await asyncio.to_thread(cluster.remove_node, victim, False)
                hosts -= 1
                while any(victim.node_id[:12] in h for h in
                          await asyncio.to_thread(loads, NAMESPACE)):
                    if time.monotonic() - removed > 180:
                        raise TimeoutError("the lost node's shards were never re-placed")
                    await asyncio.sleep(0.05)
                report["lost_to_replaced_s"] = time.monotonic() - removed
                report["lost_node"] = victim.node_id
                await wait_balanced(hosts)
                report["phases"]["lost"] = await asyncio.to_thread(loads, NAMESPACE)
            await after(len(acked) + step)
            stop.set()

        senders = [asyncio.create_task(sender(s)) for s in range(SENDERS)]
        try:
            await phases()
        finally:
            stop.set()
            await asyncio.gather(*senders)
            Path(stop_file).touch()  # noqa: ASYNC240
        from_tasks = [a for acks in await asyncio.to_thread(ray.get, tasks) for a in acks]
        for gate in gates:
            await gate.deliver(Gate.verdict, Verdict(approved=True, by="op"), key="v")
        report["gates"] = [(await g.result(timeout=120)).by for g in gates]
        report["alarms"] = [await a.result(timeout=120) - alarm_due for a in alarms]
        applied: dict[str, list[str]] = {}
        settled = True
        for key in keys:
            seen: Seen = await rt.ref(Counter, key).query(Counter.seen)
            applied[key] = seen.items
            d = await rt.ref(Counter, key).describe()
            settled = settled and d.applied_seq == d.accepted_seq
        placer = ray.get_actor(f"corral/{NAMESPACE}/placer", namespace=NAMESPACE)
        report["moves"] = (await placer.state.remote())["moves"]
        report.update(acked=[list(a) for a in acked] + from_tasks, errors=errors,
                      applied=applied, settled=settled,
                      retries=dict(rt.backend.retries))  # type: ignore[attr-defined]
    return report


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--store", "--temp", "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--add", type=int, default=2)
    parser.add_argument("--drain", action="store_true")
    parser.add_argument("--undrain", action="store_true")
    parser.add_argument("--remove", action="store_true")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--total", type=int, default=3000)
    parser.add_argument("--alarm-after", type=float, default=20.0)
    args = parser.parse_args(argv)
    report = on_cluster(args.temp, NAMESPACE, lambda c: scenario(c, args), workers=args.workers)
    Path(args.out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
