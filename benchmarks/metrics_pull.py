"""What a scrape of a Ray deployment costs: pulling every host actor's series.

Run from the repository root (starts a local Ray instance of its own, loopback only):

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/metrics_pull.py [--shards 4 16]

For each shard count it opens a Ray runtime, sends a few signals to every shard (so each
shard actor exists and holds series), then times, over `ROUNDS`
scrapes:

- `pull`: `Runtime.host_metrics()`, what `corral metrics --namespace` and the dashboard's
  `/metrics` do at each scrape (one Ray call per host actor, all at once, the answers
  parsed, labelled `host` and merged), then rendered as the text a scrape returns;
- `ping`: the ceiling, the same Ray calls at once to a method that does nothing
  (`check_definitions({})`);
- `local`: the peer, the same workload hosted by this process on the local backend,
  whose scrape renders its own `corral.metrics.exposition()`.

Prints a table (p50 and p99 in ms, bytes per scrape, pull / ping) and writes
benchmarks/results/metrics_pull.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from accept import write_json
from pydantic import BaseModel

import corral
import corral.metrics

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "metrics_pull.json"
ROUNDS = 40
KEYS_PER_SHARD = 4


class Item(BaseModel):
    id: str


class Gauge(corral.Entity):
    def __init__(self) -> None:
        self.n = 0

    @corral.signal
    def add(self, item: Item) -> None:
        self.n += 1


def _quantiles(seconds: list[float]) -> tuple[float, float]:
    ordered = sorted(seconds)
    return statistics.median(ordered) * 1000, ordered[int(0.99 * (len(ordered) - 1))] * 1000


async def _timed(call: Callable[[], Awaitable[Any]]) -> list[float]:
    took = []
    for _ in range(ROUNDS):
        began = time.perf_counter()
        await call()
        took.append(time.perf_counter() - began)
    return took


async def _workload(rt: corral.Runtime, shards: int) -> dict[int, list[str]]:
    """KEYS_PER_SHARD keys of each shard, each sent one signal."""
    keys: dict[int, list[str]] = {k: [] for k in range(shards)}
    n = 0
    while any(len(v) < KEYS_PER_SHARD for v in keys.values()):
        key = f"k-{n}"
        n += 1
        shard = rt.router.shard_of("Gauge", key)
        if len(keys[shard]) < KEYS_PER_SHARD:
            keys[shard].append(key)
    await asyncio.gather(*(rt.ref(Gauge, key).signal_with_start(
        Gauge.add, Item(id="1"), start=None) for ks in keys.values() for key in ks))
    return keys


async def measure(tmp: Path, shards: int) -> dict[str, Any]:
    # The peer: the same workload hosted by this process (the local backend), whose
    # scrape renders its own registry.
    async with corral.open_runtime(str(tmp / f"local{shards}.db"), entities=[Gauge],
                                   shards=shards) as rt:
        await _workload(rt, shards)

        async def local() -> bytes:
            return corral.metrics.exposition()

        await _timed(local)
        local_p50, local_p99 = _quantiles(await _timed(local))
        local_bytes = len(await local())
    namespace = f"bench-pull-{uuid.uuid4().hex[:6]}"
    async with corral.open_runtime(str(tmp / f"ray{shards}.db"), entities=[Gauge],
                                   backend="ray", deploy=True, namespace=namespace,
                                   shards=shards) as rt:
        keys = await _workload(rt, shards)
        backend: Any = rt.backend
        handles = [await backend.actor("Gauge", ks[0]) for ks in keys.values()]

        async def pull() -> bytes:
            return corral.metrics.exposition(await rt.host_metrics())

        async def ping() -> None:
            await asyncio.gather(*(h.check_definitions.remote({}) for h in handles))

        text = await pull()
        result: dict[str, Any] = {
            "shards": shards, "host_actors": len(handles), "bytes": len(text),
            "local": {"p50_ms": round(local_p50, 2), "p99_ms": round(local_p99, 2)},
            "local_bytes": local_bytes}
        for name, call in (("pull", pull), ("ping", ping)):
            await _timed(call)  # warm
            p50, p99 = _quantiles(await _timed(call))
            result[name] = {"p50_ms": round(p50, 2), "p99_ms": round(p99, 2)}
    corral.runtime.stop_ray_hosts(namespace)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[4, 16])
    args = parser.parse_args()
    import ray

    temp = tempfile.mkdtemp(prefix="corral-bp-")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, _temp_dir=temp,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}})
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = [asyncio.run(measure(Path(tmp), s)) for s in args.shards]
    finally:
        ray.shutdown()
    print(f"{'shards':>6} {'actors':>6} {'bytes':>7} {'local':>6} | {'pull p50':>8} "
          f"{'p99':>7} | {'ping p50':>8} {'p99':>7} | {'local p50':>9} {'p99':>7} | pull/ping")
    for r in rows:
        print(f"{r['shards']:>6} {r['host_actors']:>6} {r['bytes']:>7} {r['local_bytes']:>6} | "
              f"{r['pull']['p50_ms']:>8} {r['pull']['p99_ms']:>7} | "
              f"{r['ping']['p50_ms']:>8} {r['ping']['p99_ms']:>7} | "
              f"{r['local']['p50_ms']:>9} {r['local']['p99_ms']:>7} | "
              f"{r['pull']['p50_ms'] / max(r['ping']['p50_ms'], 1e-9):.1f}x")
    write_json(RESULTS, {"benchmark": "metrics_pull", "rounds": ROUNDS,
                         "python": platform.python_version(),
                         "load": os.getloadavg(), "rows": rows})


if __name__ == "__main__":
    main()
