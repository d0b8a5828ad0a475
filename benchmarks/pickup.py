"""Pickup latency: how soon a signal accepted by a non-hosting process is applied.

Several processes may share one store; only the lease holder of a shard applies its
messages, and it learns of messages other processes accepted by tailing the journal.
On SQLite the host checks the file's data version every `poll_interval` (5 ms); on
PostgreSQL the accepting transaction sends a NOTIFY that the host's session hears, and
the host tails when its next check (also every `poll_interval`) finds one heard. This
measures, side by side in one run, on each store:

* **local**: the sender is the hosting process (the entry is handed over in memory);
* **remote**: the sender is another process with `host=False` (journal tailing).

Remote latency is from the moment the sender's ack returned (the message is committed)
to the moment the owner's handler applied it; both processes read the same wall clock.
Local latency is from the moment the send began: the hosting process applies a signal
to an idle entity with a sync handler before the send returns, so from its ack it would
be negative. Senders send at a steady rate (open loop), one message at a time. The
PostgreSQL side runs on a throwaway server this script starts (`_pg.py`: fsync=on,
synchronous_commit=on) and stops at the end.

    .venv/bin/python benchmarks/pickup.py                # 5 s per side
    .venv/bin/python benchmarks/pickup.py --quick        # 1 s per side
    .venv/bin/python benchmarks/pickup.py --no-postgres  # SQLite only

Prints a table and writes benchmarks/results/pickup.json (`--quick`: pickup-quick.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _pg
from pydantic import BaseModel

import corral

HERE = Path(__file__).resolve().parent
RATE = 200.0  # messages per second, per side
KEY = "ticket-1"
POLL_INTERVAL = 0.005  # open_runtime's default, passed explicitly so the table can say it
GOAL_PG_REMOTE_P50_MS = 2.0


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


async def send(rt: corral.Runtime, prefix: str, duration: float, *, from_ack: bool = True
               ) -> dict[str, float]:
    """Send at RATE for `duration` seconds; message id -> wall time its ack returned (or,
    `from_ack=False`, its send began)."""
    ref = rt.ref(Probe, KEY)
    acked: dict[str, float] = {}
    start, n = time.monotonic(), 0
    while time.monotonic() - start < duration:
        n += 1
        number = int(prefix) * 1_000_000 + n
        began = time.time()
        await ref.signal_with_start(Probe.ping, Ping(n=number), start=None,
                                    message_id=f"m-{number}")
        acked[f"m-{number}"] = time.time() if from_ack else began
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


async def measure(store: str, duration: float, *, log: Any = print) -> tuple[Row, Row]:
    """Local, then remote pickup latency on the (empty) store at `store`."""
    with tempfile.TemporaryDirectory() as tmp:
        async with corral.open_runtime(store, entities=[Probe],
                                       poll_interval=POLL_INTERVAL) as rt:
            log(f"local : sending {RATE:.0f}/s for {duration:g} s from the hosting process")
            local = await send(rt, "1", duration, from_ack=False)
            out = str(Path(tmp) / "acked.json")
            log(f"remote: sending {RATE:.0f}/s for {duration:g} s from a host=False process")
            child = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--sender", store, "2", str(duration), out,
                env={**os.environ, "PYTHONPATH": str(HERE)},
            )
            try:
                if await child.wait() != 0:
                    raise SystemExit("the sender process failed")
            except BaseException:  # interrupted: do not leave the sender running
                if child.returncode is None:
                    child.kill()
                    await child.wait()
                raise
            remote = json.loads(await asyncio.to_thread(Path(out).read_text))
            deadline = time.monotonic() + 10
            applied: dict[str, float] = {}
            while time.monotonic() < deadline:
                applied = await rt.ref(Probe, KEY).query(Probe.applied_at)
                if all(m in applied for m in remote):
                    break
                await asyncio.sleep(0.05)
        return summarize(local, applied), summarize(remote, applied)


async def measure_stores(duration: float, server: Any, *, log: Any = print
                         ) -> dict[str, dict[str, Any]]:
    """`measure` on a fresh SQLite file, then (with a `_pg.Server`) a fresh database."""
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="corral-pickup-") as tmp:
        log("sqlite (polling the file's data version):")
        local, remote = await measure(str(Path(tmp) / "pickup.db"), duration, log=log)
        results["sqlite"] = {"mechanism": "polling", "local": local, "remote": remote}
    if server is not None:
        log("postgres (LISTEN/NOTIFY):")
        async with server.database("pickup") as url:
            local, remote = await measure(url, duration, log=log)
        results["postgres"] = {"mechanism": "LISTEN/NOTIFY", "local": local,
                               "remote": remote}
    return results


def table(results: dict[str, dict[str, Any]]) -> str:
    """One line per store and sender."""
    header = (f"{'store':<26}{'sender':<34}{'messages':>9}{'p50 ms':>9}{'p99 ms':>9}"
              f"{'max ms':>9}")
    lines = [header, "-" * len(header)]
    for store, r in results.items():
        label = f"{store} ({r['mechanism']})"
        for name, side in (("hosting process: send->applied", "local"),
                           ("host=False process: ack->applied", "remote")):
            row = r[side]
            lines.append(f"{label:<26}{name:<34}{row['messages']:>9.0f}{row['p50_ms']:>9.2f}"
                         f"{row['p99_ms']:>9.2f}{row['max_ms']:>9.2f}")
    return "\n".join(lines)


def verdict(results: dict[str, dict[str, Any]]) -> str:
    """The remote p50 of each store, and PostgreSQL's against its goal."""
    remote = ", ".join(f"{store} {r['remote']['p50_ms']:.2f} ms" for store, r in results.items())
    parts = [f"remote pickup p50: {remote} (poll_interval {POLL_INTERVAL * 1000:g} ms)"]
    pg = results.get("postgres")
    if pg is not None:
        p50 = pg["remote"]["p50_ms"]
        met = "met" if p50 <= GOAL_PG_REMOTE_P50_MS else "MISSED"
        parts.append(f"postgres remote p50 {p50:.2f} ms: goal <= {GOAL_PG_REMOTE_P50_MS:g} ms "
                     f"{met} (sqlite remote p50 {results['sqlite']['remote']['p50_ms']:.2f} ms)")
    return "\n".join(parts)


async def amain(args: argparse.Namespace, server: Any) -> dict[str, Any]:
    duration = 1.0 if args.quick else 5.0
    if server is not None:
        settings = await server.settings()
        print("postgres: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    results = await measure_stores(duration, server)
    print()
    print(table(results))
    print(verdict(results))
    sqlite = results["sqlite"]
    data: dict[str, Any] = {
        "benchmark": "pickup", "rate_per_s": RATE, "seconds_per_side": duration,
        "poll_interval_s": POLL_INTERVAL,
        "machine": _pg.machine(),
        # The SQLite side keeps the keys it always had; the PostgreSQL side is beside it.
        "local": sqlite["local"], "remote": sqlite["remote"],
        "local_from": "send began", "remote_from": "ack returned",
    }
    if server is not None:
        data["postgres"] = {**results["postgres"], "server": settings,
                            "goal_remote_p50_ms": GOAL_PG_REMOTE_P50_MS}
    return data


def main() -> None:
    parser = _pg.arguments(__doc__, quick="1 s per side instead of 5 s")
    parser.add_argument("--sender", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sender:
        store, prefix, duration, out = args.sender
        acked = asyncio.run(sender_child(store, prefix, float(duration)))
        Path(out).write_text(json.dumps(acked))
        return
    _pg.run_and_write(lambda server: amain(args, server), args=args, name="pickup")


if __name__ == "__main__":
    main()
