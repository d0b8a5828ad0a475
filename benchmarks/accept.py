"""Durable acceptance benchmark: corral `signal_with_start` against the store ceilings.

Run from the repository root:

    .venv/bin/python benchmarks/accept.py                # full run (~11-15 min on 2 cores)
    .venv/bin/python benchmarks/accept.py --quick        # smoke run (< 90 s)
    .venv/bin/python benchmarks/accept.py --no-postgres  # the SQLite rows only
    .venv/bin/python benchmarks/accept.py --progress     # recording progress: on vs off

Workloads (see benchmarks/README.md for the columns):

1. corral `signal_with_start` into 1 and into 10,000 entities with 1, 100 and 1,000
   closed-loop senders, on a real SQLite file (WAL, synchronous=FULL), `host=True` (the
   entities apply every signal in the same process), plus `host=False` rows (accept only).
2. The ceiling: plain aiosqlite writing the same rows (journal + dedupe row per signal,
   the runs row when an entity starts, one entities upsert per entity per batch) into the
   schema the store creates, with its pragmas and the same group commit (everything
   queued -> one transaction, one commit, one aiosqlite call per batch, one shared
   future), driven the same way.
3. Resident memory per hosted entity, minus the entity's own state (in a subprocess).
4. The store's `commits` / `ops_committed` counters, so the mean batch size is visible.
5. The same rows on PostgreSQL (a throwaway server this script starts and stops, `_pg.py`:
   fsync=on, synchronous_commit=on): corral on `open_runtime("postgresql://...")` against
   a plain asyncpg ceiling writing the same rows with the same group commit
   (`_pg_ceiling.py`).
6. Sequential `signal_with_start` latency (one sender, a fresh key per call) on both stores.
7. Pickup latency of a signal accepted by a `host=False` process, on both stores
   (`pickup.py`: polling on SQLite, LISTEN/NOTIFY on PostgreSQL).

8. `--progress` (on its own): the cost of hosts recording their progress in the store
   (`corral.runtime.host._progress`, once a second per shard): corral `host=True` with the
   recording on (as shipped) and off, rounds interleaved, on both stores; writes
   benchmarks/results/accept-progress.json.

Results are printed as tables and written to benchmarks/results/accept.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import platform
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import _pg
import aiosqlite
import asyncpg
import pickup
import psutil
from _pg_ceiling import PgCeilingWriter
from pydantic import BaseModel

import corral
import corral.persistence
import corral.runtime.host._progress as progress_module
from corral.persistence import canonical_json, is_postgres_url, open_sqlite_store, payload_hash
from corral.persistence._schema import PRAGMAS
from corral.runtime.client._boundary import new_message_id
from corral.runtime.client._router import Router

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "accept.json"
QUICK_RESULTS = HERE / "results" / "accept-quick.json"  # a smoke run never overwrites the full one
PROGRESS_RESULTS = HERE / "results" / "accept-progress.json"
SHARDS = 16
PRIME_SENDERS = 1000
STORES = ("sqlite", "postgres")
TEXT = "The customer replied: the replacement part arrived, but the fan still rattles. " * 2


# -- the entity under test -----------------------------------------------------------------


class Start(BaseModel):
    tenant: str


class Ping(BaseModel):
    n: int
    text: str


APPLIED = 0  # signals applied by hosted entities (all shards), for the applied/s column


class Counter(corral.Entity):
    """A small entity: two fields, one signal handler."""

    def __init__(self, init: Start) -> None:
        self.tenant = init.tenant
        self.count = 0

    @corral.signal
    def ping(self, p: Ping) -> None:
        global APPLIED
        self.count += 1
        APPLIED += 1


ETYPE = Counter._corral_definition.name


# -- measurement plumbing ------------------------------------------------------------------


class Counters(NamedTuple):
    """Counters sampled at the start and the end of a measured window."""

    commits: int
    ops_committed: int
    applied: int


@dataclass
class Round:
    """One measured window of one configuration."""

    acks_per_s: float
    p50_ms: float
    p99_ms: float
    acks: int
    commits: int
    ops_committed: int
    applied_per_s: float | None
    prime_s: float
    load1: float  # 1-minute load average at the end of the window (2 CPUs here)


@dataclass
class Row:
    """A configuration and its rounds; the reported numbers are the median round's."""

    store: str  # "sqlite" or "postgres"
    system: str
    entities: int
    senders: int
    host: bool | None
    rounds: list[Round] = field(default_factory=list)

    @property
    def median(self) -> Round:
        ordered = sorted(self.rounds, key=lambda r: r.acks_per_s)
        return ordered[(len(ordered) - 1) // 2]


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-quantile (0..1) of already sorted values, nearest rank."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values)) - 1))
    return sorted_values[index]


async def closed_loop(send: Callable[[int], Awaitable[None]], probe: Callable[[], Counters], *,
                      entities: int, senders: int, warmup: float, duration: float
                      ) -> tuple[float, list[float], Counters]:
    """Run `senders` closed loops of `send(random entity index)`.

    After `warmup` seconds a window of `duration` seconds is measured. Returns the
    window's length, the latencies (seconds) of the acks completed inside it, and how
    much the `probe` counters grew over it.
    """
    stop = False
    measuring = False
    latencies: list[float] = []
    clock = time.perf_counter
    rand = random.randrange

    async def sender() -> None:
        while not stop:
            t = clock()
            await send(rand(entities))
            if measuring:
                latencies.append(clock() - t)

    tasks = [asyncio.create_task(sender()) for _ in range(senders)]
    try:
        await asyncio.sleep(warmup)
        measuring, before, t0 = True, probe(), clock()
        await asyncio.sleep(duration)
        measuring, after, t1 = False, probe(), clock()
    finally:
        stop = True
        await asyncio.gather(*tasks)
    return t1 - t0, latencies, Counters(*(b - a for a, b in zip(before, after, strict=True)))


async def prime(send: Callable[[int], Awaitable[None]], entities: int) -> float:
    """Send one message to every entity (starting each), PRIME_SENDERS at a time."""
    t = time.perf_counter()
    indices: Iterator[int] = iter(range(entities))

    async def sender() -> None:
        for i in indices:
            await send(i)

    await asyncio.gather(*(sender() for _ in range(min(PRIME_SENDERS, entities))))
    return time.perf_counter() - t


def summarize(window: float, latencies: list[float], commits: int, ops: int,
              applied: int | None, prime_s: float) -> Round:
    latencies.sort()
    return Round(
        acks_per_s=len(latencies) / window,
        p50_ms=percentile(latencies, 0.50) * 1000,
        p99_ms=percentile(latencies, 0.99) * 1000,
        acks=len(latencies),
        commits=commits,
        ops_committed=ops,
        applied_per_s=None if applied is None else applied / window,
        prime_s=prime_s,
        load1=os.getloadavg()[0],
    )


# -- workload 1: corral ----------------------------------------------------------------------


async def run_corral(location: str, *, entities: int, senders: int, host: bool,
                     warmup: float, duration: float) -> Round:
    """signal_with_start through the public API into `entities` entities, on the store at
    `location` (a SQLite path or a PostgreSQL URL)."""
    keys = [f"ticket-{i}" for i in range(entities)]
    start = Start(tenant="acme")
    counter = [0]
    async with corral.open_runtime(location, entities=[Counter], shards=SHARDS,
                                   host=host) as rt:
        store: Any = rt.store

        async def send(i: int) -> None:
            counter[0] += 1
            await rt.ref(Counter, keys[i]).signal_with_start(
                Counter.ping, Ping(n=counter[0], text=TEXT), start=start)

        prime_s = await prime(send, entities)
        window, lat, grew = await closed_loop(
            send, lambda: Counters(store.commits, store.ops_committed, APPLIED),
            entities=entities, senders=senders, warmup=warmup, duration=duration)
    return summarize(window, lat, grew.commits, grew.ops_committed,
                     grew.applied if host else None, prime_s)


# -- workload 2: the ceiling -----------------------------------------------------------------

_JOURNAL_SQL = (
    "INSERT INTO journal (etype, key, seq, run_id, shard, kind, name, message_id, payload, "
    "sender, accepted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_DEDUPE_SQL = (
    "INSERT INTO dedupe (etype, key, message_id, seq, run_id, payload_hash, sender, "
    "accepted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_RUNS_SQL = (
    "INSERT INTO runs (etype, key, run_id, status, start_input, started_at, first_seq) "
    "VALUES (?, ?, ?, 'running', ?, ?, ?)"
)
_ENTITY_SQL = (
    "INSERT INTO entities (etype, key, shard, run_id, status, next_seq) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (etype, key) DO UPDATE SET run_id=excluded.run_id, status=excluded.status, "
    "next_seq=excluded.next_seq"
)

_Item = tuple[tuple[Any, ...], tuple[Any, ...], "tuple[Any, ...] | None", tuple[Any, ...]]


class _Batch:
    __slots__ = ("future", "items")

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future
        self.items: list[_Item] = []


class CeilingWriter:
    """The least a group-committing aiosqlite writer can do to store the same rows."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.commits = 0
        self.ops_committed = 0
        self._conn: aiosqlite.Connection | None = None
        self._batch: _Batch | None = None
        self._wakeup = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        # The schema as the store creates it (every migration: its indexes are written
        # too), as `PgCeilingWriter` does with `ensure_schema`.
        await (await open_sqlite_store(self.path, shards=SHARDS)).close()
        self._conn = await aiosqlite.connect(self.path, isolation_level=None)
        for pragma in PRAGMAS:
            await self._conn.execute(pragma)
        self._task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        self._closed = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        if self._conn is not None:
            await self._conn.close()

    async def write(self, item: _Item) -> None:
        batch = self._batch
        if batch is None:
            batch = self._batch = _Batch(asyncio.get_running_loop().create_future())
            self._wakeup.set()
        batch.items.append(item)
        await batch.future

    async def _loop(self) -> None:
        conn = self._conn
        assert conn is not None
        while not (self._closed and self._batch is None):
            await self._wakeup.wait()
            self._wakeup.clear()
            batch, self._batch = self._batch, None
            if batch is None:
                continue
            try:
                await conn._execute(self._apply, conn._conn, batch.items)  # type: ignore[no-untyped-call]
            except Exception as err:  # e.g. the schema changed under these statements
                batch.future.set_exception(RuntimeError(f"ceiling writer failed: {err!r}"))
            else:
                batch.future.set_result(None)

    def _apply(self, db: sqlite3.Connection, items: list[_Item]) -> None:
        db.execute("BEGIN IMMEDIATE")
        try:
            self._insert(db, items)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        self.commits += 1
        self.ops_committed += len(items)

    @staticmethod
    def _insert(db: sqlite3.Connection, items: list[_Item]) -> None:
        db.executemany(_JOURNAL_SQL, [i[0] for i in items])
        db.executemany(_DEDUPE_SQL, [i[1] for i in items])
        runs = [i[2] for i in items if i[2] is not None]
        if runs:
            db.executemany(_RUNS_SQL, runs)
        latest = {(i[3][0], i[3][1]): i[3] for i in items}  # one upsert per entity
        db.executemany(_ENTITY_SQL, list(latest.values()))


async def run_ceiling(location: str, *, entities: int, senders: int, warmup: float,
                      duration: float) -> Round:
    """The same rows, schema, pragmas and group commit, with no runtime around them: the
    aiosqlite writer for a SQLite path, the asyncpg one (`_pg_ceiling`) for a URL."""
    keys = [f"ticket-{i}" for i in range(entities)]
    router = Router(SHARDS)
    start_text = canonical_json(Start(tenant="acme").model_dump(mode="json"))
    state: dict[int, list[int]] = {}  # entity index -> [next_seq, shard]
    counter = [0]
    writer: CeilingWriter | PgCeilingWriter = (
        PgCeilingWriter(location, shards=SHARDS) if is_postgres_url(location)
        else CeilingWriter(location))
    await writer.open()
    try:
        async def send(i: int) -> None:
            key = keys[i]
            now = time.time()
            counter[0] += 1
            payload = canonical_json({"n": counter[0], "text": TEXT})
            st = state.get(i)
            runs_row = None
            if st is None:
                st = state[i] = [1, router.shard_of(ETYPE, key)]
                runs_row = (ETYPE, key, 1, start_text, now, 1)
            seq, shard = st
            st[0] = seq + 1
            mid = new_message_id()
            await writer.write((
                (ETYPE, key, seq, 1, shard, "signal", "ping", mid, payload, None, now),
                (ETYPE, key, mid, seq, 1, payload_hash("ping", payload), None, now),
                runs_row,
                (ETYPE, key, shard, 1, "running", seq + 1),
            ))

        prime_s = await prime(send, entities)
        window, lat, grew = await closed_loop(
            send, lambda: Counters(writer.commits, writer.ops_committed, 0),
            entities=entities, senders=senders, warmup=warmup, duration=duration)
    finally:
        await writer.close()
    return summarize(window, lat, grew.commits, grew.ops_committed, None, prime_s)


# -- workload 6: sequential signal_with_start latency --------------------------------------


async def run_sequential(location: str, *, host: bool, warmup: float, duration: float
                         ) -> Round:
    """One sender in a closed loop, a fresh key per call: every call starts an entity
    (runs row, entities row, journal and dedupe rows), so this is the latency of one
    `signal_with_start` that waits for its own commit alone."""
    start = Start(tenant="acme")
    counter = [0]
    async with corral.open_runtime(location, entities=[Counter], shards=SHARDS,
                                   host=host) as rt:
        store: Any = rt.store

        async def send(_: int) -> None:
            counter[0] += 1
            await rt.ref(Counter, f"fresh-{counter[0]}").signal_with_start(
                Counter.ping, Ping(n=counter[0], text=TEXT), start=start)

        window, lat, grew = await closed_loop(
            send, lambda: Counters(store.commits, store.ops_committed, APPLIED),
            entities=1, senders=1, warmup=warmup, duration=duration)
    return summarize(window, lat, grew.commits, grew.ops_committed,
                     grew.applied if host else None, 0.0)


# -- workload 3: memory per entity (run in a fresh subprocess) -------------------------------


def rss_bytes() -> int:
    """Resident set size after a full collection and returning freed heap to the OS."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return int(psutil.Process().memory_info().rss)


async def measure_memory(n: int, senders: int) -> dict[str, Any]:
    """RSS growth per hosted entity, minus the same entity's bare state.

    First `n` bare `Counter` instances are built the way a host builds them (start input
    parsed from its stored JSON) and kept alive; then a runtime is opened and `n` entities
    are started with one `signal_with_start` each; once every signal is applied the RSS
    growth per entity minus the bare size is corral's overhead per entity.
    """
    starts = [canonical_json({"tenant": f"tenant-{i}"}) for i in range(n)]
    rss0 = rss_bytes()
    bare = [Counter(Start.model_validate_json(text)) for text in starts]
    for entity in bare:
        entity.ping(Ping(n=1, text="x"))
    rss1 = rss_bytes()
    bare_per = (rss1 - rss0) / n
    global APPLIED
    APPLIED = 0
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        async with corral.open_runtime(os.path.join(tmp, "mem.db"), entities=[Counter],
                                       shards=SHARDS, host=True) as rt:
            rss2 = rss_bytes()
            indices = iter(range(n))
            t = time.perf_counter()

            async def sender() -> None:
                for i in indices:
                    await rt.ref(Counter, f"ticket-{i}").signal_with_start(
                        Counter.ping, Ping(n=1, text="x"),
                        start=Start.model_validate_json(starts[i]))

            await asyncio.gather(*(sender() for _ in range(senders)))
            accept_s = time.perf_counter() - t
            deadline = time.monotonic() + 300
            while n > APPLIED and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            applied_s = time.perf_counter() - t
            assert rt.host is not None
            hosted = sum(len(s) for s in rt.host.shards.values())
            rss3 = rss_bytes()
            store: Any = rt.store
            commits, ops = store.commits, store.ops_committed
    total_per = (rss3 - rss2) / n
    del bare
    return {
        "entities": n,
        "senders": senders,
        "hosted": hosted,
        "applied": APPLIED,
        "bare_entity_bytes": bare_per,
        "hosted_entity_bytes": total_per,
        "corral_overhead_bytes": total_per - bare_per,
        "goal_bytes": 2048,
        "rss_before_bare_mb": rss0 / 2**20,
        "rss_after_bare_mb": rss1 / 2**20,
        "rss_runtime_open_mb": rss2 / 2**20,
        "rss_entities_hosted_mb": rss3 / 2**20,
        "accept_s": accept_s,
        "starts_per_s": n / accept_s,
        "all_applied_s": applied_s,
        "commits": commits,
        "ops_committed": ops,
    }


def memory_in_subprocess(n: int, senders: int) -> dict[str, Any]:
    """Run `measure_memory` in a fresh interpreter, so earlier workloads leave no heap."""
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", str(n), "--senders", str(senders)],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- driver ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    entity_counts: tuple[int, ...]
    sender_counts: tuple[int, ...]
    host_false_senders: tuple[int, ...]
    rounds: int
    warmup: float
    duration: float
    memory_entities: int
    pickup_seconds: float  # per side and store (pickup.py)


FULL = Plan((1, 10_000), (1, 100, 1000), (1000,), rounds=3, warmup=1.0, duration=5.0,
            memory_entities=100_000, pickup_seconds=5.0)
QUICK = Plan((1, 1000), (1, 100, 1000), (1000,), rounds=1, warmup=0.3, duration=1.0,
             memory_entities=10_000, pickup_seconds=1.0)
PG_GOAL_SENDERS = (100, 1000)  # where the PostgreSQL ratio goal applies (issue 9)

Config = tuple[str, str, int, int, "bool | None"]  # store, system, entities, senders, host


def log(msg: str) -> None:
    print(msg, flush=True)


def fmt_round(r: Round) -> str:
    applied = "" if r.applied_per_s is None else f", applied {r.applied_per_s:,.0f}/s"
    batch = r.ops_committed / r.commits if r.commits else 0.0
    return (f"{r.acks_per_s:>9,.0f} acks/s  p50 {r.p50_ms:7.2f} ms  p99 {r.p99_ms:7.2f} ms  "
            f"{r.commits} commits, {batch:.1f} ops/commit{applied} (prime {r.prime_s:.1f} s, "
            f"load {r.load1:.1f})")


@contextlib.asynccontextmanager
async def fresh_store(store: str, tmp: str, name: str,
                      server: _pg.Server | None) -> AsyncIterator[str]:
    """A fresh SQLite file in `tmp`, or a fresh database on `server`; removed after."""
    if store == "postgres":
        assert server is not None
        async with server.database(name.lower().replace("-", "_")) as url:
            yield url
        return
    path = os.path.join(tmp, f"{name}.db")
    try:
        yield path
    finally:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path + suffix)


async def run_plan(plan: Plan, server: _pg.Server | None) -> list[Row]:
    """Every configuration on every store, `plan.rounds` times, interleaved."""
    stores = STORES if server is not None else STORES[:1]
    rows: dict[Config, Row] = {}
    configs: list[Config] = []
    for entities in plan.entity_counts:
        for senders in plan.sender_counts:
            for store in stores:  # each store's corral next to its own ceiling
                configs.append((store, "corral", entities, senders, True))
                if senders in plan.host_false_senders:
                    configs.append((store, "corral", entities, senders, False))
                configs.append((store, "ceiling", entities, senders, None))
    for cfg in configs:
        rows[cfg] = Row(*cfg)
    total = len(configs) * plan.rounds
    done = 0
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        for rnd in range(plan.rounds):
            for cfg in configs:  # interleaved, so load from elsewhere hits both sides alike
                store, system, entities, senders, host = cfg
                kw: dict[str, Any] = {"entities": entities, "senders": senders,
                                      "warmup": plan.warmup, "duration": plan.duration}
                name = f"r{rnd}-{system}-{entities}-{senders}-{host}"
                async with fresh_store(store, tmp, name, server) as location:
                    if system == "corral":
                        result = await run_corral(location, host=bool(host), **kw)
                    else:
                        result = await run_ceiling(location, **kw)
                rows[cfg].rounds.append(result)
                done += 1
                label = f"{system}{'' if host is None else f' host={host}'}"
                if store == "postgres":
                    label = f"pg {label}"
                log(f"[{done:>2}/{total}] round {rnd + 1} {label:<18} {entities:>6} entities "
                    f"{senders:>5} senders: {fmt_round(result)}")
    return list(rows.values())


PROGRESS_CONFIGS = ((10_000, 100), (10_000, 1000), (1, 100))  # (entities, senders)
CENSUS_ENTITIES = (10_000, 100_000)


async def run_recording_cost(server: _pg.Server | None) -> dict[str, Any]:
    """What one round of recording costs the store's writer (its rows in 16 fenced
    writes, one per shard, as a host makes them) at the cap and past it, and what a
    census read costs with half of the entities behind: median of 5, milliseconds."""
    stores = STORES if server is not None else STORES[:1]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        for store in stores:
            for entities in CENSUS_ENTITIES:
                async with fresh_store(store, tmp, f"cost-{entities}", server) as location:
                    out[f"{store} {entities}"] = await _recording_cost(location, entities)
                log(f"recording cost {store:<8} {entities:>7,} entities: "
                    + ", ".join(f"{k} {v:.1f} ms" for k, v in out[f"{store} {entities}"].items()))
    return out


async def _recording_cost(location: str, entities: int) -> dict[str, float]:
    store = await corral.persistence.open_store(location, shards=SHARDS)
    try:
        fences = []
        for shard in range(SHARDS):
            epoch = (await store.acquire_leases("bench", [shard], 600.0))[shard]
            fences.append(corral.persistence.Fence(shard, "bench", epoch))
        router, start = Router(SHARDS), canonical_json({"tenant": "acme"})
        for first in range(0, entities, 1000):
            accs = []
            for i in range(first, min(first + 1000, entities)):
                key = f"ticket-{i}"
                payload = canonical_json({"n": i, "text": TEXT})
                accs.append(corral.persistence.Acceptance(
                    ETYPE, key, router.shard_of(ETYPE, key), corral.persistence.EntryKind.SIGNAL,
                    "ping", new_message_id(), payload, payload_hash("ping", payload), None,
                    start, corral.IdReusePolicy.ALLOW_DUPLICATE, time.time()))
            await store.accept_many(accs)
        cost: dict[str, float] = {}
        for rows in (progress_module.PROGRESS_ROWS, 10_000):
            times = []
            for rnd in range(5):
                per_shard: dict[int, list[tuple[str, str, int, int]]] = {}
                for i in range(0, min(rows, entities)):
                    key = f"ticket-{i}"
                    per_shard.setdefault(router.shard_of(ETYPE, key), []).append(
                        (ETYPE, key, i % 2, rnd))  # half behind: seq 0 of 1
                t = time.perf_counter()
                await asyncio.gather(*(store.record_progress(fences[shard], batch, at=time.time())
                                       for shard, batch in per_shard.items()))
                times.append((time.perf_counter() - t) * 1000)
            cost[f"record {rows:,} rows"] = sorted(times)[2]
        times = []
        for _ in range(5):
            t = time.perf_counter()
            await store.census()
            times.append((time.perf_counter() - t) * 1000)
        cost["census"] = sorted(times)[2]
        return cost
    finally:
        await store.close()


async def run_progress(server: _pg.Server | None, rounds: int = 3) -> dict[str, Any]:
    """corral `host=True` with progress recorded (as shipped) and not, interleaved."""
    stores = STORES if server is not None else STORES[:1]
    shipped = progress_module.PROGRESS_INTERVAL
    found: dict[tuple[str, int, int, bool], list[Round]] = {}
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        for rnd in range(rounds):
            for store in stores:
                for entities, senders in PROGRESS_CONFIGS:
                    for recording in (True, False):
                        progress_module.PROGRESS_INTERVAL = shipped if recording else None
                        name = f"r{rnd}-progress-{entities}-{senders}-{recording}"
                        try:
                            async with fresh_store(store, tmp, name, server) as location:
                                result = await run_corral(location, entities=entities,
                                                          senders=senders, host=True,
                                                          warmup=1.0, duration=5.0)
                        finally:
                            progress_module.PROGRESS_INTERVAL = shipped
                        found.setdefault((store, entities, senders, recording), []
                                         ).append(result)
                        log(f"progress round {rnd + 1} {store:<8} {entities:>6} entities "
                            f"{senders:>5} senders recording={recording!s:<5}: "
                            f"{fmt_round(result)}")
    header = (f"{'store':<8} {'entities':>8} {'senders':>7} | {'on acks/s':>9} {'p99 ms':>7} "
              f"{'applied/s':>9} | {'off acks/s':>10} {'p99 ms':>7} {'applied/s':>9} | "
              f"{'ratio':>5}")
    lines, rows = [header, "-" * len(header)], []
    for store in stores:
        for entities, senders in PROGRESS_CONFIGS:
            on = sorted(found[(store, entities, senders, True)], key=lambda r: r.acks_per_s)
            off = sorted(found[(store, entities, senders, False)], key=lambda r: r.acks_per_s)
            a, b = on[(len(on) - 1) // 2], off[(len(off) - 1) // 2]
            ratio = a.acks_per_s / b.acks_per_s if b.acks_per_s else float("nan")
            lines.append(
                f"{store:<8} {entities:>8,} {senders:>7,} | {a.acks_per_s:>9,.0f} "
                f"{a.p99_ms:>7.2f} {a.applied_per_s or 0:>9,.0f} | {b.acks_per_s:>10,.0f} "
                f"{b.p99_ms:>7.2f} {b.applied_per_s or 0:>9,.0f} | {ratio:>5.2f}")
            rows.append({"store": store, "entities": entities, "senders": senders,
                         "recording": asdict(a), "not_recording": asdict(b), "ratio": ratio,
                         "recording_rounds_acks_per_s": [r.acks_per_s for r in on],
                         "not_recording_rounds_acks_per_s": [r.acks_per_s for r in off]})
    text = "\n".join(lines)
    log("")
    log(f"recording progress (every {shipped} s per shard) on vs off, host=True, median "
        f"of {rounds} round(s); ratio = on / off")
    log(text)
    cost = await run_recording_cost(server)
    return {"benchmark": "accept-progress", "started_at": time.time(), "cost_ms": cost,
            "progress_rows": progress_module.PROGRESS_ROWS,
            "progress_interval_s": shipped, "rounds": rounds, "rows": rows, "table": text,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "sqlite": sqlite3.sqlite_version, "loadavg_end": os.getloadavg()}}


async def run_latency(plan: Plan, server: _pg.Server | None) -> list[Row]:
    """Sequential signal_with_start (fresh keys) per store and host flag, interleaved."""
    stores = STORES if server is not None else STORES[:1]
    rows = {(store, host): Row(store, "sequential", 0, 1, host)
            for host in (True, False) for store in stores}
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        for rnd in range(plan.rounds):
            for (store, host), row in rows.items():
                async with fresh_store(store, tmp, f"r{rnd}-sequential-{host}",
                                       server) as location:
                    result = await run_sequential(location, host=bool(host),
                                                  warmup=plan.warmup, duration=plan.duration)
                row.rounds.append(result)
                log(f"sequential round {rnd + 1} {store:<8} host={host!s:<5}: "
                    f"{fmt_round(result)}")
    return list(rows.values())


def table(rows: list[Row], store: str = "sqlite", goal_senders: tuple[int, ...] | None = None
          ) -> tuple[str, list[dict[str, Any]]]:
    """The side-by-side table of `store` and its JSON rows (median rounds); the ratio
    goal is marked on every row, or only at `goal_senders`."""
    rows = [r for r in rows if r.store == store]
    ceiling_rows = {(r.entities, r.senders): r for r in rows if r.system == "ceiling"}
    ceilings = {k: r.median for k, r in ceiling_rows.items()}
    header = (f"{'entities':>8} {'senders':>7} {'host':>5} | {'corral/s':>9} {'p50 ms':>7} "
              f"{'p99 ms':>7} {'commits':>7} {'ops':>7} {'ops/commit':>10} {'applied/s':>9} | "
              f"{'ceiling/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'ops/commit':>10} | {'ratio':>5}")
    lines = [header, "-" * len(header)]
    out: list[dict[str, Any]] = []
    for r in rows:
        if r.system != "corral":
            continue
        c, m = ceilings[(r.entities, r.senders)], r.median
        ratio = m.acks_per_s / c.acks_per_s if c.acks_per_s else float("nan")
        batch = m.ops_committed / m.commits if m.commits else 0.0
        cbatch = c.ops_committed / c.commits if c.commits else 0.0
        applied = "-" if m.applied_per_s is None else f"{m.applied_per_s:,.0f}"
        in_goal = goal_senders is None or r.senders in goal_senders
        goal = "" if ratio >= 0.5 or not in_goal else " <0.5"
        lines.append(
            f"{r.entities:>8,} {r.senders:>7,} {r.host!s:>5} | {m.acks_per_s:>9,.0f} "
            f"{m.p50_ms:>7.2f} {m.p99_ms:>7.2f} {m.commits:>7,} {m.ops_committed:>7,} "
            f"{batch:>10.1f} {applied:>9} | "
            f"{c.acks_per_s:>9,.0f} {c.p50_ms:>7.2f} {c.p99_ms:>7.2f} {cbatch:>10.1f} | "
            f"{ratio:>5.2f}{goal}"
        )
        out.append({
            "entities": r.entities,
            "senders": r.senders,
            "host": r.host,
            "corral": asdict(m),
            "corral_rounds_acks_per_s": [x.acks_per_s for x in r.rounds],
            "corral_mean_ops_per_commit": batch,
            "ceiling": asdict(c),
            "ceiling_rounds_acks_per_s": [
                x.acks_per_s for x in ceiling_rows[(r.entities, r.senders)].rounds],
            "ceiling_mean_ops_per_commit": cbatch,
            "ratio": ratio,
            "rounds_ratio": [x.acks_per_s / y.acks_per_s if y.acks_per_s else None
                             for x, y in zip(r.rounds, ceiling_rows[(r.entities, r.senders)].rounds,
                                             strict=True)],
        })
    return "\n".join(lines), out


def latency_table(rows: list[Row]) -> tuple[str, list[dict[str, Any]]]:
    """Sequential latency, the stores side by side per host flag (median rounds)."""
    header = (f"{'store':<8} {'host':>5} | {'calls/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
              f"{'ops/commit':>10}")
    lines = [header, "-" * len(header)]
    out: list[dict[str, Any]] = []
    for r in sorted(rows, key=lambda r: (not r.host, STORES.index(r.store))):
        m = r.median
        batch = m.ops_committed / m.commits if m.commits else 0.0
        lines.append(f"{r.store:<8} {r.host!s:>5} | {m.acks_per_s:>8,.0f} {m.p50_ms:>7.2f} "
                     f"{m.p99_ms:>7.2f} {batch:>10.2f}")
        out.append({"store": r.store, "host": r.host, "median": asdict(m),
                    "rounds": [asdict(x) for x in r.rounds]})
    return "\n".join(lines), out


def memory_text(mem: dict[str, Any]) -> str:
    return (
        f"memory: {mem['entities']:,} entities hosted ({mem['hosted']:,} live, "
        f"{mem['applied']:,} signals applied): RSS +{mem['hosted_entity_bytes']:,.0f} B/entity, "
        f"bare instance {mem['bare_entity_bytes']:,.0f} B/entity -> corral overhead "
        f"{mem['corral_overhead_bytes']:,.0f} B/entity (goal <= {mem['goal_bytes']:,} B); "
        f"started at {mem['starts_per_s']:,.0f} entities/s (1 signal_with_start each, "
        f"{mem['senders']} senders), all applied after {mem['all_applied_s']:.1f} s; "
        f"{mem['commits']:,} commits, {mem['ops_committed'] / max(mem['commits'], 1):.1f} "
        "ops/commit"
    )


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def pg_header(settings: dict[str, str]) -> str:
    return (f"PostgreSQL {settings['server_version'].split()[0]} (fsync={settings['fsync']}, "
            f"synchronous_commit={settings['synchronous_commit']}, "
            f"wal_sync_method={settings['wal_sync_method']}, "
            f"full_page_writes={settings['full_page_writes']})")


async def amain(args: argparse.Namespace, server: _pg.Server | None) -> dict[str, Any]:
    if args.progress:
        return await run_progress(server)
    plan = QUICK if args.quick else FULL
    started = time.time()
    load0 = os.getloadavg()
    log(f"corral acceptance benchmark ({'quick' if args.quick else 'full'}): "
        f"{plan.rounds} round(s) of {plan.warmup:g} s warm-up + {plan.duration:g} s per row, "
        f"{os.cpu_count()} CPUs, load {load0[0]:.2f}, SQLite {sqlite3.sqlite_version}")
    settings: dict[str, str] = {}
    if server is not None:
        settings = await server.settings()
        log(f"postgres: a throwaway server on 127.0.0.1:{server.port} ({server.temp}): "
            + ", ".join(f"{k}={v}" for k, v in settings.items()))
    rows = await run_plan(plan, server)
    latency = await run_latency(plan, server)
    log(f"pickup: {pickup.RATE:.0f} signals/s for {plan.pickup_seconds:g} s per side ...")
    picked = await pickup.measure_stores(plan.pickup_seconds, server, log=log)
    log(f"memory: hosting {plan.memory_entities:,} entities in a fresh process ...")
    mem = await asyncio.to_thread(memory_in_subprocess, plan.memory_entities, PRIME_SENDERS)
    text, out = table(rows)
    log("")
    log("durable acceptance, signal_with_start, closed loop (median of "
        f"{plan.rounds} round(s); ratio = corral / ceiling, goal >= 0.5)")
    log(text)
    log("")
    log(memory_text(mem))
    result: dict[str, Any] = {
        "benchmark": "accept",
        "mode": "quick" if args.quick else "full",
        "started_at": started,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "aiosqlite": aiosqlite.__version__,
            "postgresql": settings.get("server_version"),
            "asyncpg": asyncpg.__version__,
            "platform": platform.platform(),
            "loadavg_start": load0,
        },
        "plan": asdict(plan),
        "settings": {"shards": SHARDS, "pragmas": list(PRAGMAS), "prime_senders": PRIME_SENDERS,
                     "payload_bytes": len(canonical_json({"n": 1000000, "text": TEXT}))},
        "rows": out,
        "memory": mem,
        "table": text,
    }
    if server is not None:
        pg_text, pg_out = table(rows, "postgres", PG_GOAL_SENDERS)
        log("")
        log(f"{pg_header(settings)}: the same closed loop, corral on PostgreSQL vs plain "
            f"asyncpg (median of {plan.rounds} round(s); ratio = corral / ceiling, goal >= 0.5 "
            "at 100 and 1,000 senders)")
        log(pg_text)
        result["postgres"] = {"server": settings, "goal_senders": list(PG_GOAL_SENDERS),
                              "rows": pg_out, "table": pg_text}
    lat_text, lat_out = latency_table(latency)
    log("")
    log("sequential signal_with_start: 1 sender, a fresh key per call (each starts an entity), "
        f"median of {plan.rounds} round(s)")
    log(lat_text)
    pick_text = pickup.table(picked)
    log("")
    log(f"pickup: a signal accepted by another process, until the owner's handler applied it "
        f"({pickup.RATE:.0f}/s for {plan.pickup_seconds:g} s per side)")
    log(pick_text)
    log(pickup.verdict(picked))
    result["sequential"] = lat_out
    result["sequential_table"] = lat_text
    result["pickup"] = {"rate_per_s": pickup.RATE, "seconds_per_side": plan.pickup_seconds,
                        "poll_interval_s": pickup.POLL_INTERVAL,
                        "goal_postgres_remote_p50_ms": pickup.GOAL_PG_REMOTE_P50_MS,
                        "stores": picked, "table": pick_text}
    result["machine"]["loadavg_end"] = os.getloadavg()
    result["elapsed_s"] = time.time() - started
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (< 90 s)")
    parser.add_argument("--no-postgres", action="store_true",
                        help="the SQLite rows only (no PostgreSQL server is started)")
    parser.add_argument("--out", help="where to write the JSON results (default: "
                        "results/accept.json, or results/accept-quick.json with --quick)")
    parser.add_argument("--progress", action="store_true",
                        help="only the cost of recording progress: on vs off (~8 min)")
    parser.add_argument("--memory-child", type=int, metavar="N", help=argparse.SUPPRESS)
    parser.add_argument("--senders", type=int, default=PRIME_SENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        print(json.dumps(asyncio.run(measure_memory(args.memory_child, args.senders))))
        return
    try:  # the server is stopped on the way out, Ctrl-C and SIGTERM included
        with contextlib.nullcontext(None) if args.no_postgres else _pg.throwaway_server() \
                as server:
            result = _pg.run(amain(args, server))
    except _pg.ServerUnavailable as err:
        raise SystemExit(f"{err}; or pass --no-postgres for the SQLite rows only") from None
    out_path = Path(args.out or (PROGRESS_RESULTS if args.progress else
                                 QUICK_RESULTS if args.quick else RESULTS))
    write_json(out_path, result)
    log(f"\nwrote {out_path}")


if __name__ == "__main__":
    main()
