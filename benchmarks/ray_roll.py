"""A rolling deploy on Ray (`roll_ray_hosts`) against stopping the actors, under a stream.

A deployment of 16 shard actors runs release 1 (`_roll_release1.Tally`), with four
running entities per shard, on one local Ray instance; this process streams signals to
them from 8 concurrent senders (release 1 clients). Each round:

1. **roll**: `roll_ray_hosts` replaces every shard actor with one running release 2
   (`_roll_release2`), one shard at a time, through the graceful hand-off. Reported:
   the time to roll all shards, each shard's pause (old holder stopped -> new holder
   recovered, `RollStep.pause`), the slowest acknowledgement a caller saw during the
   roll, and the calls the client sent again (re-routed after `ShardMovedError`,
   or retried while an actor was unavailable).
2. **stop (peer)**: the stop-the-world deploy it replaces: `stop_ray_hosts` under the
   same stream, then `deploy` of the release again (fresh host actors). Reported: the
   slowest acknowledgement a caller saw (every shard is down at once until its new
   host has started and recovered).

Every acknowledged signal must then be applied exactly once (checked on the entities'
own records). Timings are the one machine's wall clock; 2 cores shared with Ray's own
processes, so absolute figures are pessimistic.

    .venv/bin/python benchmarks/ray_roll.py                # 3 rounds per store
    .venv/bin/python benchmarks/ray_roll.py --quick        # 1 round
    .venv/bin/python benchmarks/ray_roll.py --no-postgres  # SQLite only

Prints a table and writes benchmarks/results/ray_roll.json (`--quick`: ray_roll-quick.json).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _pg
import _roll_release1 as release1
import _roll_release2 as release2

import corral
from corral.runtime import roll_ray_hosts, stop_ray_hosts

HERE = Path(__file__).resolve().parent
SHARDS = 16
KEYS_PER_SHARD = 4
SENDERS = 8
RUNTIME_ENV = {"env_vars": {"PYTHONPATH": str(HERE), "RAY_AUTH_MODE": "disabled"}}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


class Stream:
    """`SENDERS` senders signalling the keys round-robin; each ack's latency and time."""

    def __init__(self, rt: corral.Runtime, keys: list[str], who: str) -> None:
        self.rt, self.keys, self.who = rt, keys, who
        self.acked: list[tuple[str, str, float, float]] = []  # key, id, sent at, latency
        self.errors: list[str] = []
        self.failed_at: list[float] = []  # when each error was seen
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._send(s)) for s in range(SENDERS)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _send(self, s: int) -> None:
        n = s
        while not self._stop.is_set():
            key, mid = self.keys[n % len(self.keys)], f"{self.who}-{n}"
            n += SENDERS
            began = time.monotonic()
            try:
                await self.rt.ref(release1.Tally, key).signal(
                    release1.Tally.add, release1.Item(id=mid), message_id=mid)
            except Exception as err:
                self.errors.append(f"{mid}: {type(err).__name__}: {err}")
                self.failed_at.append(time.monotonic())
                await asyncio.sleep(0.01)  # a stopped deployment answers at once
            else:
                self.acked.append((key, mid, began, time.monotonic() - began))

    def slowest_between(self, start: float, end: float) -> float:
        return max((lat for _, _, t, lat in self.acked if start <= t + lat and t <= end),
                   default=0.0)


async def one_round(store: str, n: int) -> dict[str, Any]:
    namespace = f"roll-bench-{uuid.uuid4().hex[:6]}"
    try:
        async with corral.open_runtime(store, backend="ray", deploy=True, namespace=namespace,
                                       shards=SHARDS, entities=[release1.Tally],
                                       ray_options={"runtime_env": RUNTIME_ENV}) as rt:
            keys: list[str] = []
            i = 0
            while len(keys) < SHARDS * KEYS_PER_SHARD:
                key = f"t-{i}"
                i += 1
                if sum(rt.router.shard_of("Tally", k) == rt.router.shard_of("Tally", key)
                       for k in keys) < KEYS_PER_SHARD:
                    keys.append(key)
            for key in keys:
                await rt.ref(release1.Tally, key).signal_with_start(
                    release1.Tally.add, release1.Item(id=f"{key}-first"),
                    start=release1.Start(tenant="t"), message_id=f"{key}-first")
            stream = Stream(rt, keys, f"r{n}")
            stream.start()
            await asyncio.sleep(1.0)
            backend: Any = rt.backend
            before = collections.Counter(backend.retries)
            t0 = time.monotonic()
            report = await asyncio.to_thread(roll_ray_hosts, namespace, [release2.Tally],
                                             actor_options={"runtime_env": RUNTIME_ENV})
            t1 = time.monotonic()
            retries = dict(collections.Counter(backend.retries) - before)
            await asyncio.sleep(1.0)
            t2 = time.monotonic()
            await asyncio.to_thread(stop_ray_hosts, namespace)  # then the release again:
            await asyncio.to_thread(  # no client starts hosts, an operator deploys
                corral.runtime.deploy, namespace, app="_roll_release2:Tally", store=store,
                runtime_env=RUNTIME_ENV, shards=SHARDS)
            t3 = time.monotonic()
            await asyncio.sleep(1.0)
            while stream.acked and stream.acked[-1][2] < t3:  # until an ack after the stop
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            await stream.stop()
            lost = doubled = 0
            for key in keys:
                ref = rt.ref(release1.Tally, key)
                while (d := await ref.describe()).applied_seq != d.accepted_seq:
                    await asyncio.sleep(0.05)
                items = await ref.query(release1.Tally.applied)
                counts = collections.Counter(items)
                doubled += sum(c > 1 for c in counts.values())
                lost += sum(mid not in counts for k, mid, _, _ in stream.acked if k == key)
            pauses = [s.pause * 1000 for s in report.steps]
            return {
                "roll_s": t1 - t0, "shards_moved": len(report.steps),
                "pause_p50_ms": pct(pauses, 0.5), "pause_p99_ms": pct(pauses, 0.99),
                "pause_max_ms": max(pauses, default=0.0),
                "roll_slowest_ack_ms": stream.slowest_between(t0, t1) * 1000,
                "stop_slowest_ack_ms": stream.slowest_between(t2, time.monotonic()) * 1000,
                "steady_ack_p50_ms": statistics.median(
                    lat for _, _, t, lat in stream.acked if t < t0) * 1000,
                "retries": retries, "errors": len(stream.errors),
                "roll_errors": sum(t0 <= t <= t1 for t in stream.failed_at),
                "error_samples": stream.errors[:3], "acked": len(stream.acked),
                "lost": lost, "doubled": doubled,
            }
    finally:
        await asyncio.to_thread(stop_ray_hosts, namespace)


async def measure(store: str, rounds: int) -> dict[str, Any]:
    runs = []
    for n in range(rounds):
        r = await one_round(store, n)
        print(f"  round {n + 1}: rolled {r['shards_moved']} shards in {r['roll_s']:.1f} s, "
              f"pause p50 {r['pause_p50_ms']:.0f} ms p99 {r['pause_p99_ms']:.0f} ms; slowest "
              f"ack {r['roll_slowest_ack_ms']:.0f} ms (stop: {r['stop_slowest_ack_ms']:.0f} ms);"
              f" retries {r['retries']}; errors {r['errors']} ({r['roll_errors']} during the"
              f" roll); lost {r['lost']}, doubled "
              f"{r['doubled']} of {r['acked']}", flush=True)
        runs.append(r)
    pauses = [r["pause_p50_ms"] for r in runs]
    return {"runs": runs,
            "roll_s_median": statistics.median(r["roll_s"] for r in runs),
            "pause_p50_ms": statistics.median(pauses),
            "pause_p99_ms": max(r["pause_p99_ms"] for r in runs),
            "roll_slowest_ack_ms": max(r["roll_slowest_ack_ms"] for r in runs),
            "stop_slowest_ack_ms": max(r["stop_slowest_ack_ms"] for r in runs),
            "lost": sum(r["lost"] for r in runs), "doubled": sum(r["doubled"] for r in runs),
            "errors": sum(r["errors"] for r in runs)}


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'store':<10}{'roll 16':>9}{'pause p50':>11}{'p99':>8}{'slowest ack':>13}"
             f"{'stop: slowest':>15}{'ratio':>7}{'errors':>8}{'lost':>6}{'twice':>7}"]
    for store, r in results.items():
        ratio = r["stop_slowest_ack_ms"] / max(r["roll_slowest_ack_ms"], 1e-9)
        lines.append(f"{store:<10}{r['roll_s_median']:>8.1f}s{r['pause_p50_ms']:>9.0f}ms"
                     f"{r['pause_p99_ms']:>6.0f}ms{r['roll_slowest_ack_ms']:>11.0f}ms"
                     f"{r['stop_slowest_ack_ms']:>13.0f}ms{ratio:>6.1f}x{r['errors']:>8}"
                     f"{r['lost']:>6}{r['doubled']:>7}")
    return "\n".join(lines)


async def amain(args: argparse.Namespace, server: Any) -> dict[str, Any]:
    import ray

    rounds = 1 if args.quick else 3
    temp = tempfile.mkdtemp(prefix="corral-roll-")
    ray.init(include_dashboard=False, _temp_dir=temp, log_to_driver=False,
             namespace="corral-bench", runtime_env=RUNTIME_ENV)
    results: dict[str, dict[str, Any]] = {}
    try:
        results = await _pg.on_stores("ray_roll", server, lambda s: measure(s, rounds))
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    print()
    print(table(results))
    return {"benchmark": "ray_roll", "rounds": rounds, "shards": SHARDS,
            "entities": SHARDS * KEYS_PER_SHARD, "senders": SENDERS, "lease_ttl_s": 10.0,
            "machine": _pg.machine(ray=ray.__version__),
            "results": results}


def main() -> None:
    args = _pg.arguments(__doc__, quick="1 round instead of 3").parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    _pg.run_and_write(lambda server: amain(args, server), args=args, name="ray_roll")


if __name__ == "__main__":
    main()
