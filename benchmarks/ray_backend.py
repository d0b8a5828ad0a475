"""corral on Ray against the naive design: one named Ray actor per entity.

Run from the repository root:

    .venv/bin/python benchmarks/ray_backend.py           # full run (~3-5 min on 2 cores)
    .venv/bin/python benchmarks/ray_backend.py --quick   # smoke run (~1-2 min)

Both sides get the same calls, issued all at once from one driver (asyncio for corral,
pipelined ObjectRefs for the naive side), on a local Ray instance started here:

1. signal-with-start over 1,000 distinct keys (each key gets one signal that starts it);
2. 10,000 signal-with-starts to 10 keys (already running: the steady state);
3. memory per entity.

corral: `open_runtime(backend="ray")`; the deployment's shard actors are created and
warmed first (a deployment is long-lived; the warm-up time is reported). Every send is
validated, deduplicated and committed to SQLite (WAL, synchronous=FULL) before its ack.

naive: per send, `NaiveEntity.options(name=key, get_if_exists=True, lifetime="detached",
num_cpus=0).remote(start)` then `.add.remote(payload)`; the entity is a plain Python
list inside its own actor process. Nothing is durable and nothing deduplicates: it is
the cheapest thing that gives the same addressing. One actor is one process (~87 MB
RSS), so the naive side of workload 1 runs only 50 keys (20 with `--quick`): 1,000
actors would need ~50 GB here. Its keys/s is that run's rate, an
*optimistic* extrapolation to 1,000 keys (more processes only get slower).

Memory: naive = PSS (and RSS) of one naive actor process, i.e. one entity; corral = the
RSS growth of all shard actor processes, right after the warm-up, while they start
20,000 entities (4,000 with `--quick`), divided by that count (the SQLite page cache
growth and every runtime structure included).

Results: a table on stdout and benchmarks/results/ray_backend.json (the quick run writes
ray_backend-quick.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import ray
from pydantic import BaseModel

import corral
from corral.runtime import stop_ray_hosts

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "ray_backend.json"
QUICK_RESULTS = HERE / "results" / "ray_backend-quick.json"


# -- the entity, both ways -------------------------------------------------------------


class Start(BaseModel):
    tenant: str


class Ping(BaseModel):
    n: int
    text: str


class Counter(corral.Entity):
    """Two fields and one signal handler: the same state as `NaiveEntity`."""

    def __init__(self, init: Start) -> None:
        self.tenant = init.tenant
        self.pings: list[int] = []

    @corral.signal
    def ping(self, p: Ping) -> None:
        self.pings.append(p.n)

    @corral.query
    def count(self) -> int:
        return len(self.pings)


class NaiveEntity:
    """The naive design's entity: a named Ray actor holding the same state."""

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.pings: list[int] = []

    def ping(self, payload: dict[str, Any]) -> int:
        self.pings.append(Ping.model_validate(payload).n)
        return len(self.pings)

    def pid(self) -> int:
        return os.getpid()


TEXT = "The customer replied: the replacement part arrived, but the fan still rattles."


# -- corral ----------------------------------------------------------------------------


async def corral_burst(rt: corral.Runtime, sends: list[tuple[str, int]]) -> float:
    """All `sends` (key, n) as concurrent signal_with_start calls; returns seconds."""
    start = Start(tenant="acme")
    t0 = time.perf_counter()
    acks = await asyncio.gather(*(
        rt.ref(Counter, key).signal_with_start(Counter.ping, Ping(n=n, text=TEXT), start=start)
        for key, n in sends))
    elapsed = time.perf_counter() - t0
    assert all(a.status == "accepted" for a in acks)
    return elapsed


async def shard_pids(rt: corral.Runtime) -> list[int]:
    backend: Any = rt.backend
    pids = set()
    for index in range(rt.router.shards):
        handle = await backend._handle(index, "Counter")
        pids.add((await handle.info.remote())["pid"])
    return sorted(pids)


def rss(pids: list[int]) -> int:
    return sum(psutil.Process(pid).memory_info().rss for pid in pids)


async def run_corral(store: str, namespace: str, shards: int, keys: int, hot_keys: int,
                     signals: int, memory_entities: int) -> dict[str, Any]:
    async with corral.open_runtime(store, entities=[Counter], backend="ray", deploy=True,
                                   namespace=namespace, shards=shards) as rt:
        # Warm-up: create every shard actor (once per deployment) and host an entity on each.
        t0 = time.perf_counter()
        warm = [f"warm-{i}" for i in range(shards * 8)]
        await corral_burst(rt, [(k, 0) for k in warm])
        warmup = time.perf_counter() - t0

        # Memory first, on fresh shard processes (no freed heap from earlier work to reuse).
        pids = await shard_pids(rt)
        before = rss(pids)
        t0 = time.perf_counter()
        for lo in range(0, memory_entities, 2000):
            await corral_burst(rt, [(f"mem-{i}", 0) for i in
                                    range(lo, min(lo + 2000, memory_entities))])
        started = time.perf_counter() - t0
        await asyncio.sleep(0.5)  # let the shards finish applying
        grown = rss(pids) - before

        distinct = await corral_burst(rt, [(f"key-{i}", 0) for i in range(keys)])
        hot = [f"hot-{i}" for i in range(hot_keys)]
        await corral_burst(rt, [(k, 0) for k in hot])  # running before the measured window
        steady = await corral_burst(rt, [(hot[n % hot_keys], n) for n in range(signals)])
        applied = sum([await rt.ref(Counter, k).query(Counter.count) for k in hot])
        assert applied == signals + hot_keys, (applied, signals + hot_keys)
        return {
            "shards": shards, "shard_processes": len(pids), "warmup_s": warmup,
            "distinct_keys": keys, "distinct_s": distinct, "distinct_per_s": keys / distinct,
            "hot_keys": hot_keys, "signals": signals, "signals_s": steady,
            "signals_per_s": signals / steady,
            "memory_entities": memory_entities, "memory_start_s": started,
            "shard_rss_total": rss(pids), "rss_growth": grown,
            "bytes_per_entity": grown / memory_entities,
        }


# -- naive -----------------------------------------------------------------------------


def naive_get(cls: Any, namespace: str, key: str) -> Any:
    return cls.options(name=key, namespace=namespace, get_if_exists=True, lifetime="detached",
                       num_cpus=0).remote("acme")


def naive_burst(cls: Any, namespace: str, sends: list[tuple[str, int]]) -> float:
    t0 = time.perf_counter()
    refs = [naive_get(cls, namespace, key).ping.remote({"n": n, "text": TEXT})
            for key, n in sends]
    ray.get(refs)
    return time.perf_counter() - t0


def run_naive(namespace: str, keys: int, hot_keys: int, signals: int) -> dict[str, Any]:
    cls = ray.remote(NaiveEntity)
    names: list[str] = []
    try:
        names += [f"key-{i}" for i in range(keys)]
        distinct = naive_burst(cls, namespace, [(k, 0) for k in names])
        pids = ray.get([naive_get(cls, namespace, k).pid.remote() for k in names])
        mem = [psutil.Process(pid).memory_full_info() for pid in pids]
        pss = sum(m.pss for m in mem) / len(mem)
        rss_each = sum(m.rss for m in mem) / len(mem)
        hot = [f"hot-{i}" for i in range(hot_keys)]
        names += hot
        naive_burst(cls, namespace, [(k, 0) for k in hot])
        steady = naive_burst(cls, namespace, [(hot[n % hot_keys], n) for n in range(signals)])
    finally:
        for name in names:
            try:
                ray.kill(ray.get_actor(name, namespace=namespace))
            except ValueError:
                continue
    return {
        "distinct_keys": keys, "distinct_s": distinct, "distinct_per_s": keys / distinct,
        "hot_keys": hot_keys, "signals": signals, "signals_s": steady,
        "signals_per_s": signals / steady, "pss_per_entity": pss, "rss_per_entity": rss_each,
    }


# -- the run ---------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (smaller counts)")
    parser.add_argument("--shards", type=int, default=4,
                        help="corral shard count (default 4: one process per shard, 2 cores)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    quick = args.quick
    keys, hot_keys, signals = 1000, 10, 10_000
    naive_keys = 20 if quick else 50
    memory_entities = 4000 if quick else 20_000
    out = args.out or (QUICK_RESULTS if quick else RESULTS)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    temp = tempfile.mkdtemp(prefix="corral-bench-")
    load0 = os.getloadavg()
    print(f"corral on Ray vs one actor per entity; {os.cpu_count()} CPUs, load {load0[0]:.2f}, "
          f"ray {ray.__version__}, {'quick' if quick else 'full'} run", flush=True)
    ray.init(include_dashboard=False, _temp_dir=temp, log_to_driver=False,
             namespace="corral-bench")
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    try:
        print("corral ...", flush=True)
        c = asyncio.run(run_corral(str(Path(temp) / "corral.db"), namespace, args.shards, keys,
                                   hot_keys, signals, memory_entities))
        stop_ray_hosts(namespace)
        print("naive ...", flush=True)
        n = run_naive(f"naive-{namespace}", naive_keys, hot_keys, signals)
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)

    distinct_ratio = c["distinct_per_s"] / n["distinct_per_s"]
    signals_ratio = c["signals_per_s"] / n["signals_per_s"]
    memory_ratio = n["pss_per_entity"] / c["bytes_per_entity"]
    rows = [
        ("signal-with-start, 1,000 distinct keys", f"{c['distinct_per_s']:,.0f} keys/s",
         f"{n['distinct_per_s']:,.1f} keys/s*", f"{distinct_ratio:,.0f}x", ">= 20x"),
        ("10,000 signals to 10 running keys", f"{c['signals_per_s']:,.0f} /s",
         f"{n['signals_per_s']:,.0f} /s", f"{signals_ratio:,.1f}x", ">= 20x"),
        ("memory per entity", f"{c['bytes_per_entity']:,.0f} B",
         f"{n['pss_per_entity'] / 1e6:,.1f} MB PSS", f"{memory_ratio:,.0f}x", ">= 10,000x"),
    ]
    print()
    print(f"{'workload':<40} {'corral':>16} {'naive':>18} {'ratio':>10} {'goal':>11}")
    for name, cv, nv, ratio, goal in rows:
        print(f"{name:<40} {cv:>16} {nv:>18} {ratio:>10} {goal:>11}")
    print(f"\n* naive ran {naive_keys} distinct keys ({naive_keys} actor processes, "
          f"{n['rss_per_entity'] / 1e6:.0f} MB RSS / {n['pss_per_entity'] / 1e6:.0f} MB PSS "
          f"each); 1,000 would need ~{1000 * n['pss_per_entity'] / 1e9:.0f} GB (PSS). Its rate "
          f"is extrapolated from those {naive_keys}: optimistic for the naive side.")
    print(f"  corral: {c['shards']} shard actors (warm-up {c['warmup_s']:.1f} s, once per "
          f"deployment); every ack is a durable SQLite commit, deduplicated by message id; "
          f"naive: nothing durable, no dedupe.")
    print(f"  corral memory: shard processes grew {c['rss_growth'] / 1e6:.1f} MB RSS while "
          f"starting {c['memory_entities']:,} entities ({c['memory_start_s']:.1f} s); "
          f"naive: one process per entity.")
    load1 = os.getloadavg()
    result = {
        "quick": quick, "corral": c, "naive": n,
        "ratios": {"distinct_keys": distinct_ratio, "signals": signals_ratio,
                   "memory": memory_ratio},
        "notes": {
            "naive_distinct_extrapolated_from_keys": naive_keys,
            "naive_memory": "PSS of one naive actor process (= one entity)",
            "corral_memory": "RSS growth of all shard processes / entities started",
        },
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "ray": ray.__version__, "sqlite": sqlite3.sqlite_version,
                    "load_start": load0, "load_end": load1},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
