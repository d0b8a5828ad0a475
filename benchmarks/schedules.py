"""Schedule fan-out: N schedules due in the same second on one host, time until all fired.

Run from the repository root:

    .venv/bin/python benchmarks/schedules.py            # N = 10,000, 3 rounds
    .venv/bin/python benchmarks/schedules.py --quick    # N = 500, 1 round (a smoke run)

Each round, in a fresh process per way, interleaved so a noisy neighbour costs each the
same:

- `schedules`: N schedules, each signalling (with start) its own entity, every one with
  its first tick in the same second T (`Interval(every=86400, offset=T mod 86400)`),
  created before T on a local runtime (one host, all shards, SQLite in WAL with
  `synchronous=FULL`). The figure is the time from T until every schedule fired (its
  signal accepted, committed, and the schedule advanced: `fired = 1` on every row), and
  until every entity applied its tick;
- `signal_many` (the ceiling): the same N signal-with-starts to N entities sent at T by
  one caller through `Runtime.signal_many` in batches of 1,000: the acceptance path a
  schedule's tick takes, without the schedule.

Prints the medians and the ratio; writes benchmarks/results/schedules.json
(`--quick`: schedules-quick.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import corral

ROOT = Path(__file__).resolve().parent.parent
LEAD = 3.0  # seconds between the end of setup and T (creating 10,000 takes ~2 s)


class Tick(BaseModel):
    n: int = 0


class Target(corral.Entity):
    def __init__(self) -> None:
        self.ticks = 0

    @corral.signal
    def tick(self, t: Tick) -> None:
        self.ticks += 1


def _sql(db: str, query: str) -> int:
    import sqlite3

    with sqlite3.connect(db, timeout=30) as conn:
        return int(conn.execute(query).fetchone()[0])


async def _until(done: Any, poll: float = 0.02) -> float:
    while not done():
        await asyncio.sleep(poll)
    return time.time()


def _applied_all(rt: corral.Runtime, n: int) -> bool:
    host = rt.host
    assert host is not None
    applied = sum(1 for s in host.shards.values() for a in s.resident()
                  if a.applied_seq >= 1)
    return applied >= n


async def one_round(way: str, n: int, db: str) -> dict[str, float]:
    async with corral.open_runtime(db, entities=[Target]) as rt:
        refs = [rt.ref(Target, f"t-{i}") for i in range(n)]
        if way == "schedules":
            t = math.ceil(time.time() + LEAD + n / 5000)
            spec = corral.Interval(every=86400, offset=t % 86400)
            for chunk in range(0, n, 500):
                await asyncio.gather(*(rt.schedules.create(
                    f"s-{i}", refs[i], Target.tick, Tick(), start=None, spec=spec,
                    overlap=corral.Overlap.ALLOW) for i in range(chunk, min(n, chunk + 500))))
            assert time.time() < t, "setup overran T: raise LEAD"
            await asyncio.sleep(t - time.time())
            fired = await _until(lambda: _sql(db, "SELECT count(*) FROM schedules WHERE "
                                                  "fired >= 1") >= n)
        else:
            t = math.ceil(time.time() + 1)
            await asyncio.sleep(t - time.time())
            items = [corral.SignalItem(ref, Target.tick, Tick(), start=None) for ref in refs]
            for chunk in range(0, n, 1000):
                await rt.signal_many(items[chunk:chunk + 1000])
            fired = time.time()
        applied = await _until(lambda: _applied_all(rt, n))
    return {"fired": fired - t, "applied": applied - t}


def _child(way: str, n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(one_round(way, n, str(Path(tmp) / "s.db")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("WAY", "N"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child[0], int(args.child[1]))))
        return
    n, rounds = (500, 1) if args.quick else (10_000, 3)
    ways = ("schedules", "signal_many")
    results: dict[str, list[dict[str, float]]] = {w: [] for w in ways}
    for _ in range(rounds):
        for way in ways:
            out = subprocess.run([sys.executable, __file__, "--child", way, str(n)],
                                 check=True, capture_output=True, text=True, cwd=ROOT)
            results[way].append(json.loads(out.stdout.strip().splitlines()[-1]))
    median = {w: {k: statistics.median(r[k] for r in results[w]) for k in ("fired", "applied")}
              for w in ways}
    ratio = {k: median["schedules"][k] / median["signal_many"][k] for k in ("fired", "applied")}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    report = {"n": n, "rounds": rounds, "median_seconds": median, "ratio": ratio,
              "rounds_seconds": results, "load_average": os.getloadavg(),
              "cpus": os.cpu_count(), "commit": commit}
    print(f"{n} due in one second, medians of {rounds} (seconds from T):")
    print(f"{'way':<12} {'all fired':>10} {'all applied':>12}")
    for w in ways:
        print(f"{w:<12} {median[w]['fired']:>10.2f} {median[w]['applied']:>12.2f}")
    print(f"{'ratio':<12} {ratio['fired']:>10.2f} {ratio['applied']:>12.2f}")
    name = "schedules-quick.json" if args.quick else "schedules.json"
    (ROOT / "benchmarks" / "results" / name).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
