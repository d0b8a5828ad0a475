"""Shard hand-off pause: a graceful hand-off against a plain lease takeover, per shard.

Host processes share one store (SQLite file, then a PostgreSQL database) with 16 shards
and resident entities, while this process streams signals to them (`host=False`). Each
round, with fresh host processes:

1. **graceful**: host A holds every shard; host B asks for all of them
   (`LocalHost.request_shards`); A sees the request on its renewal tick, drains each
   shard and releases it to B, which takes it at the next epoch.
   Pause = B took the shard (lease written, running entities read) - A stopped it.
2. **killed holder**: A leaves; host C starts beside B; B is SIGKILLed. C takes each
   shard at its next renewal tick, having found the shard's OS (SQLite) or advisory
   (PostgreSQL) lock free. Pause = C took it - the kill.
3. **hung holder**: host D starts beside C; C is SIGSTOPped (alive, its locks held):
   D takes each shard when its lease expires. Pause = D took it - the stop.

Times come from each host's lifecycle events (`lease handed off` carries when the
shard was stopped; `lease taken` is logged once the new holder read the shard's running
entities: from then on it serves the shard, activating on demand what a message needs,
while the rest load in the background until `shard recovered`) on the one machine's
wall clock. The lease term is `TTL` (renewal ticks every third of it), so a
request waits up to TTL/3 to be noticed: that wait is reported apart (`notice`), it is
not a pause (the holder still serves meanwhile). At the end every acknowledged signal
must have been applied exactly once.

    .venv/bin/python benchmarks/handoff.py                # 5 rounds per store
    .venv/bin/python benchmarks/handoff.py --quick        # 1 round
    .venv/bin/python benchmarks/handoff.py --no-postgres  # SQLite only

Prints a table and writes benchmarks/results/handoff.json (`--quick`: handoff-quick.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import random
import signal
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
SHARDS = 16
TTL = 3.0
ENTITIES = 160  # ten per shard on average, each resident on its host
RATE = 200.0  # signals per second streamed during the rounds


class Mark(BaseModel):
    mid: str


class Applied(BaseModel):
    count: int
    chain: str


def chained(chain: str, mid: str) -> str:
    """A digest of the ids applied so far, in order (one more id: `mid`)."""
    return hashlib.blake2b(f"{chain}{mid}".encode(), digest_size=8).hexdigest()


class Counter(corral.Entity):
    """Counts the signals it applied and chains their ids: checked at the end against
    the acknowledged ones (none lost, none twice, none out of order)."""

    count: int
    chain: str

    def __init__(self, init: Mark) -> None:
        self.count = 0
        self.chain = ""

    @corral.signal
    def note(self, msg: Mark) -> None:
        self.count += 1
        self.chain = chained(self.chain, msg.mid)

    @corral.query
    def applied(self) -> Applied:
        return Applied(count=self.count, chain=self.chain)


# -- the host processes ------------------------------------------------------------------


class _EventFile(logging.Handler):
    """Writes each lifecycle event about a lease as one JSON line (with its time)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._out = open(path, "a", buffering=1)  # noqa: SIM115 (open for the process's life)

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", "")
        if event.startswith("lease"):
            self._out.write(json.dumps({"event": event, "t": record.created,
                                        "shard": getattr(record, "shard", None),
                                        "stopped_at": getattr(record, "stopped_at", None)})
                            + "\n")


async def host_child(role: str, store: str, events: str) -> None:
    """`hold`: host what is free; `take`: host, and ask for every shard. Until SIGTERM."""
    log = logging.getLogger("corral.lifecycle")
    log.setLevel(logging.INFO)
    log.addHandler(_EventFile(events))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with corral.open_runtime(store, entities=[Counter], shards=SHARDS,
                                   lease_ttl=TTL) as rt:
        assert rt.host is not None
        if role == "take":
            with open(events, "a") as out:  # noqa: ASYNC230 (one short line)
                out.write(json.dumps({"event": "requested", "t": time.time()}) + "\n")
            await rt.host.request_shards(range(SHARDS), timeout=60)
        await stop.wait()


# -- this process: the rounds ---------------------------------------------------------------


class Host:
    """One host process and its event file."""

    def __init__(self, role: str, store: str, tmp: Path, name: str) -> None:
        self.events = tmp / f"{name}.jsonl"
        self.events.touch()
        self.proc = asyncio.create_subprocess_exec(
            sys.executable, __file__, "--host", role, store, str(self.events),
            env={**os.environ, "PYTHONPATH": str(HERE)})
        self.process: Any = None

    async def start(self) -> Host:
        self.process = await self.proc
        return self

    def read(self, event: str) -> list[dict[str, Any]]:
        lines = self.events.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == event]

    async def wait_for(self, event: str, count: int, timeout: float = 60.0
                       ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(found := self.read(event)) < count:
            if self.process.returncode is not None:
                raise SystemExit(f"a host exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {count} '{event}' events")
            await asyncio.sleep(0.02)
        return found

    def signal(self, sig: int) -> float:
        self.process.send_signal(sig)
        return time.time()

    async def end(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()


def pauses(taken: list[dict[str, Any]], since: dict[int, float]) -> list[float]:
    """Per shard, ms from `since[shard]` to its (last) `lease taken` in `taken`."""
    last = {e["shard"]: e["t"] for e in taken}
    return [(last[s] - t) * 1000 for s, t in since.items()]


async def one_round(store: str, tmp: Path, n: int, a: Host) -> tuple[dict[str, list[float]],
                                                                    Host]:
    """The three moves of one round, starting from `a` holding every shard; returns the
    pauses and the host that holds every shard at the end."""
    out: dict[str, list[float]] = {}
    b = await Host("take", store, tmp, f"b{n}").start()
    taken = await b.wait_for("lease taken", SHARDS)
    handed = {e["shard"]: e["stopped_at"] for e in await a.wait_for("lease handed off",
                                                                     SHARDS)}
    requested = b.read("requested")[0]["t"]
    out["graceful"] = pauses(taken, handed)
    out["notice"] = [(t - requested) * 1000 for t in handed.values()]
    a.signal(signal.SIGTERM)
    await a.process.wait()
    c = await Host("hold", store, tmp, f"c{n}").start()
    # c is up and ticking (it holds nothing yet); kill at a random phase of its ticks.
    await asyncio.sleep(TTL / 2 + random.uniform(0, TTL / 3))
    killed = b.signal(signal.SIGKILL)
    out["killed"] = pauses(await c.wait_for("lease taken", SHARDS), dict.fromkeys(
        range(SHARDS), killed))
    await b.end()
    d = await Host("hold", store, tmp, f"d{n}").start()
    await asyncio.sleep(TTL / 2 + random.uniform(0, TTL / 3))
    stopped = c.signal(signal.SIGSTOP)
    out["hung"] = pauses(await d.wait_for("lease taken", SHARDS, timeout=10 * TTL),
                         dict.fromkeys(range(SHARDS), stopped))
    await c.end()
    # d took the shards on expiry, without their locks (c held them): it locks them at
    # its next renewal. Until then a host starting would find them free and take them.
    await asyncio.sleep(TTL / 2)
    return out, d


async def stream(rt: corral.Runtime, acked: dict[str, list[str]], stop: asyncio.Event
                 ) -> None:
    keys = list(acked)
    n = 0
    began = time.monotonic()
    while not stop.is_set():
        key = random.choice(keys)
        mid = f"m{n}"
        await rt.ref(Counter, key).signal_with_start(Counter.note, Mark(mid=mid),
                                                     start=Mark(mid=""), message_id=mid)
        acked[key].append(mid)
        n += 1
        await asyncio.sleep(max(0.0, began + n / RATE - time.monotonic()))


async def measure(store: str, rounds: int, *, log: Any = print) -> dict[str, Any]:
    samples: dict[str, list[float]] = {"graceful": [], "notice": [], "killed": [], "hung": []}
    acked: dict[str, list[str]] = {f"k{i}": [] for i in range(ENTITIES)}
    with tempfile.TemporaryDirectory(prefix="corral-handoff-") as tmp_dir:
        tmp = Path(tmp_dir)
        hosts: list[Host] = []
        try:
            holder = await Host("hold", store, tmp, "a0").start()
            hosts.append(holder)
            await holder.wait_for("lease taken", SHARDS)
            async with corral.open_runtime(store, entities=[Counter], shards=SHARDS,
                                           host=False) as rt:
                stop = asyncio.Event()
                sender = asyncio.create_task(stream(rt, acked, stop))
                await asyncio.sleep(1.0)  # every entity started and resident
                for n in range(rounds):
                    got, holder = await one_round(store, tmp, n, holder)
                    hosts.append(holder)
                    for kind, values in got.items():
                        samples[kind].extend(values)
                    log(f"  round {n + 1}/{rounds}: graceful p50 "
                        f"{statistics.median(got['graceful']):.1f} ms, killed "
                        f"{statistics.median(got['killed']):.0f} ms, hung "
                        f"{statistics.median(got['hung']):.0f} ms")
                stop.set()
                await sender
                await check(rt, acked)
        finally:
            for host in hosts:
                await host.end()
    return {kind: summary(values) for kind, values in samples.items()}


async def check(rt: corral.Runtime, acked: dict[str, list[str]]) -> None:
    """Every acknowledged signal applied exactly once, in order."""
    deadline = time.monotonic() + 30
    for key, ids in acked.items():
        want = Applied(count=len(ids), chain=functools.reduce(chained, ids, ""))
        while (got := await rt.ref(Counter, key).query(Counter.applied)) != want:
            if time.monotonic() > deadline:
                raise SystemExit(f"{key}: applied {got}, acknowledged {want}")
            await asyncio.sleep(0.05)


def summary(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 \
        else values * 99
    return {"shards": len(values), "p50_ms": q[49], "p99_ms": q[98], "max_ms": values[-1]}


def table(results: dict[str, dict[str, Any]]) -> str:
    header = (f"{'store':<10}{'move':<44}{'shards':>7}{'p50 ms':>10}{'p99 ms':>10}"
              f"{'max ms':>10}")
    lines = [header, "-" * len(header)]
    names = {"graceful": "graceful hand-off: stopped -> taken",
             "killed": "holder SIGKILLed: kill -> taken (lock)",
             "hung": "holder hung (SIGSTOP): stop -> taken (expiry)",
             "notice": "(graceful: request -> holder stopped it)"}
    for store, r in results.items():
        for kind, name in names.items():
            row = r[kind]
            lines.append(f"{store:<10}{name:<44}{row['shards']:>7}{row['p50_ms']:>10.1f}"
                         f"{row['p99_ms']:>10.1f}{row['max_ms']:>10.1f}")
        ratio = r["killed"]["p50_ms"] / max(r["graceful"]["p50_ms"], 1e-9)
        lines.append(f"{'':<10}p50 ratio killed/graceful: {ratio:.1f}x; hung/graceful: "
                     f"{r['hung']['p50_ms'] / max(r['graceful']['p50_ms'], 1e-9):.0f}x")
    return "\n".join(lines)


async def amain(args: argparse.Namespace, server: Any) -> dict[str, Any]:
    rounds = 1 if args.quick else 5
    results = await _pg.on_stores("handoff", server, lambda store: measure(store, rounds))
    print()
    print(table(results))
    return {"benchmark": "handoff", "rounds": rounds, "shards": SHARDS, "lease_ttl_s": TTL,
            "entities": ENTITIES, "rate_per_s": RATE,
            "machine": _pg.machine(),
            "results": results}


def main() -> None:
    parser = _pg.arguments(__doc__, quick="1 round instead of 5")
    parser.add_argument("--host", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.host:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(host_child(*args.host))
        return
    _pg.run_and_write(lambda server: amain(args, server), args=args, name="handoff")


if __name__ == "__main__":
    main()
