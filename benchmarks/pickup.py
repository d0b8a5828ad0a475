"""Pickup latency: how soon a signal accepted by a non-hosting process is applied.

Several processes may share one store file; only the lease holder of a shard applies its
messages, and it learns of messages other processes accepted by tailing the journal
(every `poll_interval`). This measures, side by side in one run:

* **local**: the sender is the hosting process (the entry is handed over in memory);
* **remote**: the sender is another process with `host=False` (journal tailing).

Latency is from the moment the sender's ack returned (the message is committed) to the
moment the owner's handler applied it; both processes read the same wall clock. Senders
send at a steady rate (open loop), one message at a time.

    .venv/bin/python benchmarks/pickup.py            # 5 s per side
    .venv/bin/python benchmarks/pickup.py --quick    # 1 s per side

Prints a table and writes benchmarks/results/pickup.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

import corral

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "pickup.json"
RATE = 200.0  # messages per second, per side
KEY = "ticket-1"


class Ping(BaseModel):
    n: int


class Probe(corral.Entity):
    """Records when each signal was applied (wall clock)."""

    def __init__(self) -> None:
        self.applied: dict[str, float] = {}

    @corral.signal
    def ping(self, p: Ping) -> None:
        self.applied[f"m-{p.n}"] = time.time()

    @corral.query
    def applied_at(self) -> dict[str, float]:
        return self.applied


async def send(rt: corral.Runtime, prefix: str, duration: float) -> dict[str, float]:
    """Send at RATE for `duration` seconds; message id -> wall time its ack returned."""
    ref = rt.ref(Probe, KEY)
    acked: dict[str, float] = {}
    start, n = time.monotonic(), 0
    while time.monotonic() - start < duration:
        n += 1
        number = int(prefix) * 1_000_000 + n
        await ref.signal_with_start(Probe.ping, Ping(n=number), start=None,
                                    message_id=f"m-{number}")
        acked[f"m-{number}"] = time.time()
        await asyncio.sleep(max(0.0, start + n / RATE - time.monotonic()))
    return acked


async def sender_child(store: str, prefix: str, duration: float) -> dict[str, float]:
    async with corral.open_runtime(store, entities=[Probe], host=False) as rt:
        return await send(rt, prefix, duration)


Row = dict[str, float]


def summarize(acked: dict[str, float], applied: dict[str, float]) -> Row:
    lat = sorted((applied[m] - t) * 1000 for m, t in acked.items() if m in applied)
    missing = sum(1 for m in acked if m not in applied)
    assert not missing, f"{missing} acknowledged messages were never applied"
    q = statistics.quantiles(lat, n=100)
    return {"messages": len(lat), "p50_ms": q[49], "p99_ms": q[98], "max_ms": lat[-1]}


async def run(duration: float) -> tuple[Row, Row]:
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "pickup.db")
        async with corral.open_runtime(store, entities=[Probe]) as rt:
            print(f"local : sending {RATE:.0f}/s for {duration:.0f} s from the hosting process")
            local = await send(rt, "1", duration)
            out = str(Path(tmp) / "acked.json")
            print(f"remote: sending {RATE:.0f}/s for {duration:.0f} s from a host=False process")
            child = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--sender", store, "2", str(duration), out,
                env={**os.environ, "PYTHONPATH": str(HERE)},
            )
            if await child.wait() != 0:
                raise SystemExit("the sender process failed")
            remote = json.loads(await asyncio.to_thread(Path(out).read_text))
            deadline = time.monotonic() + 10
            applied: dict[str, float] = {}
            while time.monotonic() < deadline:
                applied = await rt.ref(Probe, KEY).query(Probe.applied_at)
                if all(m in applied for m in remote):
                    break
                await asyncio.sleep(0.05)
        return summarize(local, applied), summarize(remote, applied)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 s per side instead of 5 s")
    parser.add_argument("--sender", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sender:
        store, prefix, duration, out = args.sender
        acked = asyncio.run(sender_child(store, prefix, float(duration)))
        Path(out).write_text(json.dumps(acked))
        return
    duration = 1.0 if args.quick else 5.0
    local, remote = asyncio.run(run(duration))
    print(f"\n{'sender':<28}{'messages':>9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for name, row in (("hosting process (local)", local), ("host=False process (remote)",
                                                           remote)):
        print(f"{name:<28}{row['messages']:>9.0f}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}"
              f"{row['max_ms']:>9.2f}")
    print(f"remote / local p50: {remote['p50_ms'] / local['p50_ms']:.1f}x "
          f"(poll_interval 5 ms; the remote side waits for the owner's next journal poll)")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "pickup", "rate_per_s": RATE, "seconds_per_side": duration,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg": os.getloadavg()},
        "local": local, "remote": remote,
        "remote_over_local_p50": remote["p50_ms"] / local["p50_ms"],
    }, indent=1))
    print(f"wrote {RESULTS.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
