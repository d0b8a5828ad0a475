"""Elastic placement on Ray (issue 25): many shards on few host actors against one
actor per shard, and shards following nodes in and out of a cluster.

Run from the repository root:

    .venv/bin/python benchmarks/placement.py           # full run (~6-10 min on 2 cores)
    .venv/bin/python benchmarks/placement.py --quick   # smoke run (~3-4 min)

1. **Layout**, on a local one-node Ray instance started here, SQLite store: 256 shards
   on 4 host actors (`hosts=4`, the new layout) against 16 shards on 16 host actors
   (`hosts=16`: one process per shard, as every Ray deployment was before). For each:
   the seconds until every shard is placed, signal-with-start throughput over 10,000
   entities with 200 concurrent senders, the RSS of the host processes (total and per
   host) and its growth per entity, and the CPU the idle hosts burn (lease renewals,
   journal tailing, housekeeping of every shard they hold) over 10 s.
2. **Membership**, on a `ray.cluster_utils.Cluster` (a head for the driver and Ray
   tasks, 2 worker nodes, 2 more joining; `tests/support/ray_placement_cluster.py`)
   with 16 shards on a SQLite store, under a stream of signals from 6 driver senders
   and 2 Ray tasks: the seconds from the nodes joining to a balanced assignment (max -
   min <= 1 shard per host), the pause of every moved shard (rebalance and drain, p50 /
   p99), the drain's duration, the seconds until a node removed without grace has its
   shards on other nodes, and acknowledged signals lost or applied twice (0 expected).

What one 2-core machine cannot show: every "node" shares the same two cores and disk,
so throughput does not grow with nodes here (it shrinks as processes are added), and a
move's pause includes CPU contention from every other process. The figures that carry
over to a real cluster are the counts (processes, moves per round, shards per host),
memory per process and per entity, and the pause per shard (bounded by one recovery of
the shard's entities from the store plus a hand-off poll); time to balance on a real
cluster is about `moves / MOVES_PER_ROUND` placer rounds of 1 s plus the new hosts'
start (~0.5-1 s per process), independent of the node count.

Results: tables on stdout and benchmarks/results/placement.json (`--quick`:
placement-quick.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import ray
from _roll_release1 import Item, Start, Tally  # importable by the host actors

import corral
from corral.runtime import stop_ray_hosts
from corral.runtime.ray._directory import assignment

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DRIVER = ROOT / "tests" / "support" / "ray_placement_cluster.py"
RUNTIME_ENV = {"env_vars": {"PYTHONPATH": str(HERE), "RAY_AUTH_MODE": "disabled"}}


def host_pids(namespace: str) -> dict[str, int]:
    pids = {}
    for name in set(assignment(namespace).values()):
        pids[name] = ray.get(ray.get_actor(name, namespace=namespace).info.remote())["pid"]
    return pids


def rss(pids: dict[str, int]) -> int:
    return sum(psutil.Process(pid).memory_info().rss for pid in pids.values())


def cpu_seconds(pids: dict[str, int]) -> float:
    total = 0.0
    for pid in pids.values():
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


async def layout(store_dir: Path, shards: int, hosts: int, entities: int, sends: int
                 ) -> dict[str, Any]:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    store = str(store_dir / f"{namespace}.db")
    began = time.monotonic()
    try:
        async with corral.open_runtime(store, entities=[Tally], backend="ray", deploy=True,
                                       namespace=namespace, shards=shards, hosts=hosts,
                                       ray_options={"runtime_env": RUNTIME_ENV}) as rt:
            placed_s = time.monotonic() - began
            pids = await asyncio.to_thread(host_pids, namespace)
            await asyncio.sleep(2.0)
            cpu0, idle0 = await asyncio.to_thread(cpu_seconds, pids), time.monotonic()
            await asyncio.sleep(10.0)
            idle_cpu = (await asyncio.to_thread(cpu_seconds, pids) - cpu0) / (
                time.monotonic() - idle0)
            rss0 = await asyncio.to_thread(rss, pids)
            keys = [f"e-{i}" for i in range(entities)]
            sem = asyncio.Semaphore(200)

            async def send(n: int) -> None:
                async with sem:
                    await rt.ref(Tally, keys[n % entities]).signal_with_start(
                        Tally.add, Item(id=str(n)), start=Start(tenant="t"))

            await asyncio.gather(*(send(n) for n in range(entities)))  # every entity started
            rss1 = await asyncio.to_thread(rss, pids)
            t0 = time.monotonic()
            await asyncio.gather(*(send(n) for n in range(entities, entities + sends)))
            rate = sends / (time.monotonic() - t0)
            per_host = [psutil.Process(p).memory_info().rss for p in pids.values()]
    finally:
        await asyncio.to_thread(stop_ray_hosts, namespace)
    return {"shards": shards, "hosts": len(pids), "placed_s": placed_s,
            "idle_host_cpu_share": idle_cpu, "signals_per_s": rate,
            "rss_total_mb": rss1 / 2**20, "rss_per_host_mb": statistics.mean(per_host) / 2**20,
            "bytes_per_entity": (rss1 - rss0) / entities, "entities": entities}


def membership(quick: bool) -> dict[str, Any]:
    temp = tempfile.mkdtemp(prefix="corral-bp-")
    out = Path(temp) / "result.json"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": str(ROOT / "tests" / "support"), "RAY_TMPDIR": temp,
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    try:
        proc = subprocess.run(
            [sys.executable, str(DRIVER), "--store", str(Path(temp) / "corral.db"),
             "--temp", temp, "--out", str(out), "--workers", "2", "--add", "2", "--drain",
             "--remove", "--shards", "16", "--total", "1000" if quick else "3000"],
            env=env, capture_output=True, timeout=900, check=False)
        if proc.returncode:
            raise SystemExit(proc.stdout.decode()[-3000:] + proc.stderr.decode()[-3000:])
        report: dict[str, Any] = json.loads(out.read_text())
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    acked = {(k, m) for k, m in report["acked"]}
    lost = sum(1 for k, m in acked if m not in report["applied"][k])
    doubled = sum(len(items) - len(set(items)) for items in report["applied"].values())
    pauses = sorted(s["pause"] for s in report["moves"] + report["steps"]
                    if s["old_actor"] and s["pause"] > 0)
    return {"join_to_balanced_s": report["join_to_balanced_s"],
            "drain_s": report["drain_s"], "drained_shards": len(report["steps"]),
            "lost_node_replaced_s": report["lost_to_replaced_s"],
            "moves": len(report["moves"]), "graceful_pauses": len(pauses),
            "pause_p50_ms": 1000 * pauses[len(pauses) // 2],
            "pause_p99_ms": 1000 * pauses[min(len(pauses) - 1, int(len(pauses) * 0.99))],
            "acked": len(acked), "lost": lost, "applied_twice": doubled,
            "errors": len(report["errors"]), "phases": report["phases"],
            "cluster_start_s": report["cluster_start_s"]}


async def layouts(quick: bool) -> list[dict[str, Any]]:
    entities, sends = (2_000, 4_000) if quick else (10_000, 20_000)
    store_dir = Path(tempfile.mkdtemp(prefix="corral-bl-"))
    try:
        return [await layout(store_dir, shards, hosts, entities, sends)
                for shards, hosts in ((16, 16), (256, 4))]
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
             runtime_env=RUNTIME_ENV)
    try:
        rows = asyncio.run(layouts(args.quick))
    finally:
        ray.shutdown()
    print(f"{'layout':<22}{'placed s':>9}{'signals/s':>11}{'RSS MB':>9}{'MB/host':>9}"
          f"{'B/entity':>10}{'idle CPU':>10}")
    for r in rows:
        print(f"{r['shards']:>3} shards on {r['hosts']:>2} hosts {r['placed_s']:>9.1f}"
              f"{r['signals_per_s']:>11.0f}{r['rss_total_mb']:>9.0f}"
              f"{r['rss_per_host_mb']:>9.0f}{r['bytes_per_entity']:>10.0f}"
              f"{100 * r['idle_host_cpu_share']:>9.1f}%")
    old, new = rows
    print(f"256/4 against 16/16: throughput x{new['signals_per_s'] / old['signals_per_s']:.2f},"
          f" host RSS x{new['rss_total_mb'] / old['rss_total_mb']:.2f}, idle CPU "
          f"x{new['idle_host_cpu_share'] / max(old['idle_host_cpu_share'], 1e-9):.2f}")
    cluster = membership(args.quick)
    print(f"\nmembership (16 shards, 2 workers + 2 joining, drain one, lose one): "
          f"join -> balanced {cluster['join_to_balanced_s']:.1f} s; {cluster['moves']} moves;"
          f" pause p50 {cluster['pause_p50_ms']:.0f} ms, p99 {cluster['pause_p99_ms']:.0f} ms"
          f" ({cluster['graceful_pauses']} graceful moves); drain {cluster['drain_s']:.2f} s "
          f"({cluster['drained_shards']} shards); lost node's shards re-placed in "
          f"{cluster['lost_node_replaced_s']:.1f} s; {cluster['acked']} acks, "
          f"{cluster['lost']} lost, {cluster['applied_twice']} applied twice, "
          f"{cluster['errors']} caller errors")
    results = {"layouts": rows, "membership": cluster, "quick": args.quick,
               "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "load": os.getloadavg()}}
    out = HERE / "results" / ("placement-quick.json" if args.quick else "placement.json")
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
