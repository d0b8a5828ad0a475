"""Takeover after a crash with K running entities (issue 42, item 2): a part of
`benchmarks/scale.py` (see its contract: one `measure(engine, url, quick)`).

For each K, on a store of its own (a SQLite file beside `url`, or a database beside
`url`'s on the same PostgreSQL server):

1. a host **process** (`python -m benchmarks._scale_takeover URL K`) starts K `Idle`
   entities (each applies its start and one signal), records its progress, says so,
   and idles with all K resident;
2. it is killed with **SIGKILL** (its leases stay behind, taken over at once: the
   kernel drops its SQLite locks, the server its PostgreSQL sessions);
3. a pure client (`host=False`) accepts one signal for a `Ledger` entity started with
   the others: the one pending message, journaled with no host to apply it;
4. a new host opens here, on the store opened before (its connections are not the
   host's). Figures: `first applied` (ms until the `Ledger`'s handler ran) and `all
   activated` (ms until the K + 1 running entities were loaded:
   `corral_activations_total`, read once no shard has any left to start: a scrape
   walks every resident entity, and polled every millisecond from the open it took
   CPU from the host it measures), each counted two ways:
   - `... from taken`: from the lease of the shard taken (the issue's criterion: "within
     100 ms of taking a shard"): its acquisition time is the lease row's `expires_at`
     less the host's `lease_ttl` (the store's clock when `AcquireLeasesOp` ran: the
     machine's here, PostgreSQL's server runs on it), read before the first renewal
     could move it. The `Ledger`'s shard for `first applied`, the first shard taken for
     `all activated`. The `lease taken` lifecycle event does not mark it: it is logged
     once the shard's recovery read is done (`shard recovered`: all loaded);
   - `... from open`: from just before `open_runtime` is entered (the host's open, its
     registry and hosting rows, included).

    python -m benchmarks._scale_takeover --quick   # standalone, SQLite and PostgreSQL
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import corral
from corral.metrics import REGISTRY
from corral.persistence import Store, open_store

ROOT = Path(__file__).resolve().parents[1]
SHARDS = 16  # open_runtime's default for a local host
SIZES = (100, 1_000, 10_000)
QUICK_SIZES = (100, 1_000)
BATCH = 1_000  # signal_many items per call while filling
READY = "ready"

APPLIED_AT: list[float] = []  # time.time() of each Ledger signal applied here


class Idle(corral.Entity):
    """A running entity with nothing pending: it applied its start and one signal."""

    def __init__(self) -> None:
        self.pokes = 0

    @corral.signal
    def poke(self) -> None:
        self.pokes += 1


class Ledger(corral.Entity):
    """The entity with the one pending message: its handler notes when it ran."""

    def __init__(self) -> None:
        self.notes = 0

    @corral.signal
    def note(self) -> None:
        self.notes += 1
        APPLIED_AT.append(time.time())


ENTITIES: list[type[corral.Entity]] = [Idle, Ledger]


def _activations() -> int:
    total = 0.0
    for etype in ("Idle", "Ledger"):
        total += REGISTRY.get_sample_value("corral_activations_total",
                                           {"entity_type": etype}) or 0.0
    return int(total)


async def fill(url: str, k: int) -> None:
    """The host process of step 1: K idle entities and the ledger, all resident."""
    async with corral.open_runtime(url, entities=ENTITIES) as rt:
        assert rt.host is not None
        for first in range(0, k, BATCH):
            await rt.signal_many([
                corral.SignalItem(rt.ref(Idle, f"idle-{n}"), Idle.poke, start=None)
                for n in range(first, min(k, first + BATCH))])
        await rt.ref(Ledger, "ledger").start(start=None)
        host = rt.host
        while sum(a.is_ready and a.applied_seq >= 1 and a.mailbox_depth == 0
                  for s in host.shards.values() for a in s.activations()) < k + 1:
            await asyncio.sleep(0.05)
        while await host.record_progress():  # a round records at most PROGRESS_ROWS
            pass  # then the store knows that nothing is pending but the ledger's
        print(READY, flush=True)
        await asyncio.Event().wait()


async def _killed_host(url: str, k: int) -> None:
    """Steps 1 and 2: a host process with K resident entities, SIGKILLed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks._scale_takeover", url, str(k), cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")) if p)},
        stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=600)
        if line.decode().strip() != READY:
            raise RuntimeError(f"the host process for K={k} did not get ready "
                               f"(exit {await proc.wait()})")
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        await proc.wait()


async def _takeover(url: str, k: int) -> dict[str, float]:
    """Steps 3 and 4: {case: ms} (see the module docstring)."""
    async with corral.open_runtime(url, entities=ENTITIES, host=False) as client:
        await client.ref(Ledger, "ledger").signal(Ledger.note)
    APPLIED_AT.clear()
    before = _activations()
    store = await open_store(url, shards=SHARDS)  # opened first: its pool is not the host's
    try:
        return await _host_open(url, store, k, before)
    finally:
        await store.close()


async def _host_open(url: str, store: Store, k: int, before: int) -> dict[str, float]:
    start = time.time()
    async with corral.open_runtime(store, entities=ENTITIES) as rt:
        host = rt.host
        assert host is not None
        first = last = None
        taken: dict[int, float] | None = None
        while first is None or last is None:
            now = time.time()
            if first is None and APPLIED_AT:
                first = APPLIED_AT[0]
                taken = await _taken_at(url, host.owner, host.lease_ttl)
                if time.time() - start >= host.lease_ttl / 3:
                    raise RuntimeError("the leases were read after their first renewal")
            if last is None and not any(s.recovering for s in host.shards.values()) \
                    and _activations() - before >= k + 1:
                last = now
            await asyncio.sleep(0.001)
        assert taken is not None
        ledger = next(i for i, s in host.shards.items() if s.get("Ledger", "ledger"))
    return {"first applied from taken": (first - taken[ledger]) * 1000,
            "first applied from open": (first - start) * 1000,
            "all activated from taken": (last - min(taken.values())) * 1000,
            "all activated from open": (last - start) * 1000}


async def _taken_at(url: str, owner: str, ttl: float) -> dict[int, float]:
    """{shard: when `owner` took its lease} (by the store's clock), from the lease rows
    as `AcquireLeasesOp` wrote them (`expires_at` = then + `ttl`): read before a renewal."""
    sql = "SELECT shard, expires_at FROM leases WHERE owner = ?"
    if "://" not in url:  # a SQLite file
        with contextlib.closing(sqlite3.connect(url)) as db:
            rows = db.execute(sql, (owner,)).fetchall()
    else:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            rows = await conn.fetch(sql.replace("?", "$1"), owner)
        finally:
            await conn.close()
    return {int(shard): float(expires) - ttl for shard, expires in rows}


@contextlib.asynccontextmanager
async def _store_for(engine: str, url: str, k: int) -> AsyncIterator[str]:
    """A store of its own for size `k`, beside `url` (dropped after, on PostgreSQL)."""
    if engine == "sqlite":
        yield f"{url}.k{k}"
        return
    import asyncpg  # the postgres extra: present wherever a PostgreSQL URL is given

    parts = urlsplit(url)
    name = f"{parts.path.lstrip('/')}_takeover_{k}"
    admin = await asyncpg.connect(url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with contextlib.suppress(Exception):
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def measure(engine: str, url: str, quick: bool) -> list[dict[str, object]]:
    """The takeover figures for K = 100 / 1,000 / 10,000 (quick: 100 / 1,000)."""
    figures: list[dict[str, object]] = []
    for k in QUICK_SIZES if quick else SIZES:
        async with _store_for(engine, url, k) as store:
            await _killed_host(store, k)
            cases = await _takeover(store, k)
        for case, value in cases.items():
            figures.append({"item": "takeover", "case": case, "size": k,
                            "value": round(value, 1), "unit": "ms"})
    return figures


async def _standalone(quick: bool, postgres: bool) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _pg

    with tempfile.TemporaryDirectory() as tmp:
        for figure in await measure("sqlite", str(Path(tmp) / "store.db"), quick):
            print("sqlite  ", figure)
    if postgres:
        with _pg.throwaway_server() as server:
            async with server.database("takeover") as url:
                for figure in await measure("postgres", url, quick):
                    print("postgres", figure)


if __name__ == "__main__":
    if len(sys.argv) == 1 or sys.argv[1].startswith("--"):
        asyncio.run(_standalone("--quick" in sys.argv, "--no-postgres" not in sys.argv))
    else:
        from benchmarks._scale_takeover import fill as fill_here  # one module, one build

        asyncio.run(fill_here(sys.argv[1], int(sys.argv[2])))
