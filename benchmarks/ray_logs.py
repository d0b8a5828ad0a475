"""What shipping the host actors' logs to the drivers costs (`runtime/ray/_logs`).

Run from the repository root:

    .venv/bin/python benchmarks/ray_logs.py

On a local Ray instance started here, one actor stands in for a host actor: it logs
records under `corral.bench` in a loop, and the driver follows them as a runtime does
(`LogFollower`). Measured:

1. the actor's cost per record (`log.info` with a formatted message) with the shipper
   attached, against the same logger with a handler that drops every record (the
   peer: what a record costs with nowhere to go), in microseconds;
2. the time from a record's creation in the actor to its arrival in the driver's
   logging (p50 / p99 over paced records, 200 per second);
3. a burst the shipper cannot keep up with (20,000 records at once): how many reach
   the driver, and how many the actor dropped (its queue holds 1,000);
4. the log relay actor's RSS after all of it.

Results: a table on stdout and benchmarks/results/ray_logs.json.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import ray

from corral.runtime.ray import _logs as ray_logs

RESULTS = Path(__file__).resolve().parent / "results" / "ray_logs.json"
NAMESPACE = "bench-logs"


class Logger:
    """Stands in for a host actor: logs under `corral.bench`."""

    def __init__(self) -> None:
        self.log = logging.getLogger("corral.bench")

    def ship(self) -> None:
        ray_logs.ship_logs(NAMESPACE, "bench-actor")

    def cost(self, count: int, shipped: bool) -> float:
        """Microseconds per `log.info` call, shipped or dropped."""
        drop = logging.NullHandler()
        if not shipped:
            self.log.propagate = False
            self.log.addHandler(drop)
        self.log.setLevel(logging.INFO)
        began = time.perf_counter()
        for n in range(count):
            self.log.info("record %d of shard %d", n, 3)
        elapsed = time.perf_counter() - began
        self.log.propagate = True
        self.log.removeHandler(drop)
        return elapsed / count * 1e6

    def paced(self, count: int, per_second: float) -> None:
        for n in range(count):
            self.log.info("paced %d", n)
            time.sleep(1 / per_second)

    def burst(self, count: int) -> int:
        shipper = ray_logs._shipper
        before = shipper.dropped if shipper else 0
        for n in range(count):
            self.log.info("burst %d", n)
        return (shipper.dropped if shipper else 0) - before


class Arrivals(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: dict[str, list[float]] = {"paced": [], "burst": [], "record": []}

    def emit(self, record: logging.LogRecord) -> None:
        kind = record.getMessage().split(" ", 1)[0]
        self.seen.setdefault(kind, []).append(time.time() - record.created)


async def _until(arrivals: Arrivals, kind: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(arrivals.seen[kind]) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


def _relay_rss() -> float | None:
    for proc in psutil.process_iter(["cmdline"]):
        if any("LogRelay" in part for part in proc.info["cmdline"] or ()):
            return float(proc.memory_info().rss) / 2**20
    return None


async def main() -> dict[str, Any]:
    actor = ray.remote(Logger).options(num_cpus=0).remote()
    arrivals = Arrivals()
    logging.getLogger("corral.bench").addHandler(arrivals)
    logging.getLogger("corral.bench").setLevel(logging.INFO)
    follower = ray_logs.LogFollower(NAMESPACE)
    follower.open()
    count = 20_000
    dropped_us = await actor.cost.remote(count, False)
    await actor.ship.remote()
    shipped_us = await actor.cost.remote(count, True)
    await _until(arrivals, "record", count, 60)
    paced = 1_000
    await actor.paced.remote(paced, 200.0)
    await _until(arrivals, "paced", paced, 30)
    lat = sorted(arrivals.seen["paced"])
    burst = 20_000
    dropped = await actor.burst.remote(burst)
    await _until(arrivals, "burst", burst - dropped, 30)
    await asyncio.sleep(2)
    await follower.close()
    return {
        "per_record_us": {"shipped": round(shipped_us, 2), "dropped (peer)": round(dropped_us, 2),
                          "ratio": round(shipped_us / dropped_us, 2)},
        "cost_records_arrived": len(arrivals.seen["record"]),
        "latency_ms": {"p50": round(statistics.median(lat) * 1e3, 1),
                       "p99": round(lat[int(len(lat) * 0.99) - 1] * 1e3, 1),
                       "arrived": len(lat), "sent": paced},
        "burst": {"sent": burst, "dropped_in_actor": dropped,
                  "arrived": len(arrivals.seen["burst"])},
        "relay_rss_mb": _relay_rss(),
    }


def run() -> None:
    temp = tempfile.mkdtemp(prefix="corral-rl-")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, _temp_dir=temp,
             log_to_driver=False, namespace=NAMESPACE)
    try:
        result = asyncio.run(main())
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    result["conditions"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                            "ray": ray.__version__, "load": os.getloadavg()[0]}
    cost, lat, burst = result["per_record_us"], result["latency_ms"], result["burst"]
    print("| measure | corral shipper | peer (record dropped) | ratio |")
    print("|---|---|---|---|")
    print(f"| actor cost per log.info | {cost['shipped']} us | {cost['dropped (peer)']} us "
          f"| {cost['ratio']} |")
    print(f"| actor -> driver latency, paced 200/s | p50 {lat['p50']} ms, p99 {lat['p99']} ms "
          f"({lat['arrived']}/{lat['sent']} arrived) | - | - |")
    print(f"| burst of {burst['sent']} | {burst['arrived']} arrived, "
          f"{burst['dropped_in_actor']} dropped in the actor | - | - |")
    print(f"| log relay actor RSS | {result['relay_rss_mb']:.0f} MB | - | - |"
          if result["relay_rss_mb"] else "| log relay RSS | not found | - | - |")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    run()
