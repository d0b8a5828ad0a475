"""`PostgresStore`: what only the PostgreSQL store has, on a real PostgreSQL server.

What every store does is the contract suite's (`test_store_contract.py`, on both
engines). Here: its JSON flush of a batch's rows, its row locks and their waiters, its
server faults (a lost connection, a lock that never frees, a restart), NOTIFY, its
schema migrations and query plans, and the tail that orders commits by shard.
Store-level properties are tested on the store directly (two store objects are two
writers with their own pools, as two processes would be); multi-process properties with
`pg_worker.py` subprocesses; the whole runtime through `corral.open_runtime(store=...)`.
The server is a throwaway cluster for the session (`tests/support/pg.py`); each test gets
a fresh database (`pg_url`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

asyncpg = pytest.importorskip("asyncpg")

import corral  # noqa: E402
from acceptances import acc, fence_for  # noqa: E402
from corral import StoreUnavailableError  # noqa: E402
from corral.persistence import (  # noqa: E402
    Acceptance,
    AcceptResult,
    Fence,
    _pg_txn,
)
from corral.persistence._pg_schema import SCHEMA_VERSION as PG_SCHEMA_VERSION  # noqa: E402
from corral.persistence._pg_txn import _LOCK_AND_READ, _TRIM, LockPlan, PgTxn  # noqa: E402
from corral.persistence._postgres import PostgresStore, open_postgres_store  # noqa: E402
from mp_entities import Note, Recorder, Start  # noqa: E402
from pg import pg_url as pg_fixture  # noqa: E402, F401 (fixtures, found by name)
from pg import postgres_url as cluster_fixture  # noqa: E402, F401
from pg import restart_postgres  # noqa: E402
from procs import Worker, spawner, wait_until  # noqa: E402

SHARDS = 16
WORKER = Path(__file__).resolve().parents[1] / "support" / "pg_worker.py"

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")


# -- helpers ---------------------------------------------------------------------------


async def sql(url: str, query: str, *args: Any) -> list[Any]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()


async def lock_waiters(url: str) -> list[int]:
    """Backends of corral stores waiting for a lock."""
    rows = await sql(url, "SELECT pid FROM pg_stat_activity WHERE application_name = 'corral' "
                          "AND wait_event_type = 'Lock'")
    return [r[0] for r in rows]


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[PostgresStore]:
    s = await open_postgres_store(pg_url, shards=SHARDS)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def other(pg_url: str) -> AsyncIterator[PostgresStore]:
    """A second store on the same database: another writer, as another process has."""
    s = await open_postgres_store(pg_url, shards=SHARDS)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, WORKER) as start:
        yield start


@dataclass
class Held:
    """A write op that waits on `gate` inside its transaction (after `check`ing `fence`)."""

    gate: asyncio.Event
    reached: asyncio.Event
    fence: Fence | None = None
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        if self.fence is not None:
            plan.leases.add(self.fence.shard)

    async def apply(self, txn: PgTxn) -> str:
        if self.fence is not None:
            await txn.check(self.fence)
        self.reached.set()
        await self.gate.wait()
        await txn.conn.execute("INSERT INTO timers (etype, key, run_id, timer_id, shard, "
                               "due_at) VALUES ('Held', 'k', 1, 't', 0, 1e12)")
        return "held"


@pytest.fixture
def held() -> Iterator[Callable[..., Held]]:
    """Make `Held` ops; every gate still closed opens when the test ends, so a failing
    test never leaves a writer waiting (request it after the stores: it is torn down
    before them)."""
    made: list[Held] = []

    def make(fence: Fence | None = None) -> Held:
        made.append(Held(asyncio.Event(), asyncio.Event(), fence))
        return made[-1]

    yield make
    for op in made:
        op.gate.set()


# -- a batch's rows in one JSON flush -------------------------------------------------


async def test_rows_cross_the_json_flush_exactly_and_a_huge_batch_in_several_statements(
    store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A batch's rows travel as JSON (one parameter per table). Whatever a payload, key,
    # id or sender may hold comes back exactly; a batch beyond the size one jsonb value
    # can take goes in several statements of the same transaction.
    monkeypatch.setattr(_pg_txn, "_JSONB_BUDGET", 4_000)
    odd = ['{"t":"\\u0000 \\" \\\\ \u2028 \U0001f600 \u00e9"}', '{"t":"\\n\\t"}',
           '{"t":"' + "x" * 3_000 + '"}']
    sends = [acc(f"k-{i % 7} \u00e9\U0001f600", f"m-{i}\u2028", payload=odd[i % 3],
                 sender=None if i % 2 else "s\u00e9nder", start='{"s":"\u00e9"}'
                 )._replace(accepted_at=1796197118.3617861 + i / 7)  # any float, exactly
             for i in range(60)]
    assert len(_pg_txn._json_chunks([(a.payload,) for a in sends])) > 5
    before = store.commits
    results = await asyncio.gather(*(store.accept(a) for a in sends))
    assert store.commits == before + 1  # one transaction
    stored = {r[0]: r for r in await sql(
        pg_url, "SELECT j.message_id, j.key, j.payload, j.sender, j.accepted_at, "
                "d.payload_hash, j.seq FROM journal j JOIN dedupe d USING (etype, key, "
                "message_id)")}
    assert len(stored) == 60
    for a, result in zip(sends, results, strict=True):
        _, key, payload, sender, accepted_at, digest, seq = stored[a.message_id]
        assert (key, payload, sender, accepted_at, bytes(digest), seq) == (
            a.key, a.payload, a.sender, a.accepted_at, a.payload_hash, result.entry.seq)
    runs = await sql(pg_url, "SELECT key, start_input FROM runs")
    assert sorted(runs) == sorted((f"k-{i} \u00e9\U0001f600", '{"s":"\u00e9"}')
                                  for i in range(7))
    for i in range(7):  # every entity's seqs 1..n, none repeated
        seqs = sorted(r.entry.seq for a, r in zip(sends, results, strict=True)
                      if a.key.startswith(f"k-{i} "))
        assert seqs == list(range(1, len(seqs) + 1))


# -- leases and fencing ---------------------------------------------------------------


async def test_a_takeover_waits_for_a_fenced_write_in_flight_then_fences_its_writer(
    store: PostgresStore, other: PostgresStore, pg_url: str, held: Callable[..., Held],
) -> None:
    fence = await fence_for(store, 4, owner="old")
    op = held(fence)
    write = asyncio.create_task(store.write(op))
    await op.reached.wait()  # the old holder's write is past its fence check, uncommitted
    takeover = asyncio.create_task(other.acquire_leases("new", [4], 60.0, force=True))
    await wait_until(lambda: _has_lock_waiters(pg_url), "the takeover waits for the lease lock")
    assert not takeover.done()
    op.gate.set()
    assert await write == "held"  # ordered before the takeover: committed
    assert await takeover == {4: 2}
    with pytest.raises(corral.LeaseLostError):
        await store.write(held(fence))


async def _has_lock_waiters(url: str) -> bool:
    return bool(await lock_waiters(url))


# -- failures stay where they belong ---------------------------------------------------


@dataclass(frozen=True)
class NulOp:
    """Writes a value PostgreSQL refuses (NUL in text): fails in the server."""

    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        pass

    async def apply(self, txn: PgTxn) -> None:
        await txn.conn.execute("INSERT INTO timers (etype, key, run_id, timer_id, shard, "
                               "due_at) VALUES ($1, 'k', 1, 't', 0, 0)", "Ghost\x00")


@dataclass(frozen=True)
class HalfWrittenOp:
    """Writes a row, then fails with a bug that is not a refusal."""

    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        pass

    async def apply(self, txn: PgTxn) -> None:
        await txn.conn.execute("INSERT INTO timers (etype, key, run_id, timer_id, shard, "
                               "due_at) VALUES ('Ghost', 'k', 1, 't', 0, 0)")
        raise RuntimeError("op bug after a write")


async def test_a_failing_op_in_a_batch_fails_alone_and_leaves_the_connection_clean(
    store: PostgresStore, pg_url: str,
) -> None:
    sends = [store.accept(acc(f"k{n}", "m")) for n in range(20)]
    results = await asyncio.gather(store.write(NulOp()), *sends[:10], store.write(
        HalfWrittenOp()), *sends[10:], return_exceptions=True)
    bad, good = [results[0], results[11]], results[1:11] + results[12:]
    assert all(isinstance(r, AcceptResult) and r.started for r in good)
    assert all(type(e) is corral.StoreError for e in bad), bad
    assert bad[0] is not bad[1]
    assert isinstance(bad[0].__cause__, asyncpg.exceptions.CharacterNotInRepertoireError)
    assert isinstance(bad[1].__cause__, RuntimeError)
    assert await sql(pg_url, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                             "current_database() AND state LIKE 'idle in transaction%'") == [(0,)]
    assert (await store.accept(acc("k0", "next", start=None))).entry.seq == 2
    assert await sql(pg_url, "SELECT count(*) FROM timers") == [(0,)]
    assert (await sql(pg_url, "SELECT count(*) FROM journal"))[0][0] == 21


async def test_a_batch_that_fails_whole_gives_each_caller_its_own_error_with_a_cause(
    store: PostgresStore,
) -> None:
    errors = await asyncio.gather(*(store.write(HalfWrittenOp()) for _ in range(5)),
                                  return_exceptions=True)
    assert all(isinstance(e, corral.StoreError) for e in errors)
    assert len({id(e) for e in errors}) == 5
    assert all(isinstance(e.__cause__, RuntimeError) for e in errors
               if isinstance(e, BaseException))
    assert (await store.accept(acc("k", "m"))).started


async def test_a_connection_lost_mid_batch_fails_its_callers_retryably_then_reconnects(
    store: PostgresStore, pg_url: str,
) -> None:
    blocker = await asyncpg.connect(pg_url)
    try:
        await blocker.execute("BEGIN")
        await blocker.execute("SELECT * FROM shard_ticks WHERE shard = 1 FOR UPDATE")
        sends = [asyncio.create_task(store.accept(acc(f"k{n}", "m"))) for n in range(3)]
        await wait_until(lambda: _has_lock_waiters(pg_url), "the batch waits for the lock")
        [pid] = await lock_waiters(pg_url)
        await blocker.execute("SELECT pg_terminate_backend($1)", pid)
        errors = await asyncio.gather(*sends, return_exceptions=True)
        await blocker.execute("ROLLBACK")
    finally:
        await blocker.close()
    assert all(isinstance(e, StoreUnavailableError) for e in errors), errors
    assert all(e.retryable and e.committed is False for e in errors
               if isinstance(e, StoreUnavailableError))
    assert len({id(e) for e in errors}) == 3
    again = await asyncio.gather(*(store.accept(acc(f"k{n}", "m")) for n in range(3)))
    assert all(r.started for r in again)  # a new connection; nothing of the first committed


async def test_a_write_stuck_behind_a_lock_times_out_instead_of_hanging(pg_url: str) -> None:
    store = await open_postgres_store(pg_url, shards=SHARDS, timeout=0.5)
    blocker = await asyncpg.connect(pg_url)
    try:
        await blocker.execute("BEGIN")
        await blocker.execute("SELECT * FROM shard_ticks WHERE shard = 1 FOR UPDATE")
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError):
            await store.accept(acc("k", "m"))
        assert time.monotonic() - started < 5
        await blocker.execute("ROLLBACK")
        assert (await store.accept(acc("k", "m"))).started
    finally:
        await blocker.close()
        await store.close()


async def test_a_server_restart_fails_calls_retryably_and_the_store_recovers_by_itself(
    pg_url: str, other: PostgresStore,
) -> None:
    store = await open_postgres_store(pg_url, shards=SHARDS, poll_fallback=3600.0)
    try:
        assert await store.acquire_leases("h", [2], 600.0) == {2: 1}
        await store.accept(acc("k", "m0", shard=2))
        await asyncio.to_thread(restart_postgres, pg_url)  # every connection drops
        failures: list[BaseException] = []
        for s, mid in ((store, "m1"), (other, "m2")):
            await wait_until(lambda s=s, mid=mid: _retry(s, acc("k", mid, shard=2), failures),
                             "a send succeeds again", timeout=15)
        assert all(isinstance(e, StoreUnavailableError) for e in failures), failures
        entries = await store.journal("E", "k", run_id=1, after_seq=0)
        assert [e.message_id for e in entries] == ["m0", "m1", "m2"]  # none lost or twice
        await wait_until(lambda: _session_up(store), "the session reconnects", timeout=15)
        heard = store._session.received
        await other.accept(acc("k", "m3", shard=2, start=None))
        await wait_until(lambda: store._session.received > heard, "LISTEN works again")
        assert await other.acquire_leases("x", [2], 60.0) == {}  # its shard lock is back
    finally:
        await store.close()


async def _retry(store: PostgresStore, a: Acceptance, failures: list[BaseException]) -> bool:
    try:
        await store.accept(a)
    except corral.StoreError as err:
        failures.append(err)
        return False
    return True


async def _session_up(store: PostgresStore) -> bool:
    await store.foreign_commit_seen()  # reconnects the session when it is down
    return store._session._up()


# -- the versioned schema ---------------------------------------------------------------


async def test_a_store_that_cannot_be_reached_is_refused_at_once_and_retryably() -> None:
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="cannot open store") as caught:
        await open_postgres_store("postgresql://corral:secret@127.0.0.1:1/none", shards=4,
                                  timeout=2.0)
    assert time.monotonic() - started < 10
    assert "secret" not in str(caught.value)  # the password stays out of messages


async def test_a_store_at_schema_1_is_upgraded_and_keeps_its_entities(pg_url: str) -> None:
    async with corral.open_runtime(pg_url, entities=[Recorder], shards=SHARDS) as rt:
        await rt.ref(Recorder, "old").signal_with_start(
            Recorder.note, Note(mid="m-1"), start=Start(origin="v1"), message_id="m-1")
    # Back to what a corral of schema 1 wrote: no signal waits, no entities.updated_at.
    await sql(pg_url, "DROP TABLE signal_waits")
    await sql(pg_url, "ALTER TABLE entities DROP COLUMN updated_at")
    await sql(pg_url, "UPDATE meta SET v = '1' WHERE k = 'schema_version'")
    async with corral.open_runtime(pg_url, entities=[Recorder], shards=SHARDS) as rt:
        ref = rt.ref(Recorder, "old")
        dup = await ref.signal(Recorder.note, Note(mid="m-1"), message_id="m-1")
        assert (dup.status, dup.seq) == ("duplicate", 1)  # the old dedupe window
        await ref.signal(Recorder.note, Note(mid="m-2"), message_id="m-2")
        assert [e.key for e in (await rt.entities(Recorder)).items] == ["old"]
        assert (await rt.signal_waits()).items == []
    assert await sql(pg_url, "SELECT v FROM meta WHERE k = 'schema_version'") == \
        [(str(PG_SCHEMA_VERSION),)]
    assert (await sql(pg_url, "SELECT updated_at IS NOT NULL FROM entities")) == [(True,)]
    assert await sql(pg_url, "SELECT indexdef FROM pg_indexes WHERE indexname = 'dedupe_sweep'") \
        == [("CREATE INDEX dedupe_sweep ON public.dedupe USING btree (etype, key, seq) "
             "WHERE (seq > 0)",)]  # schema 3
    assert await sql(pg_url, "SELECT count(*) FROM suspensions") == [(0,)]  # schema 4


async def test_a_store_at_schema_3_gains_the_suspensions_table(pg_url: str) -> None:
    async with corral.open_runtime(pg_url, entities=[Recorder], shards=SHARDS) as rt:
        await rt.ref(Recorder, "old").signal_with_start(
            Recorder.note, Note(mid="m-1"), start=Start(origin="v1"), message_id="m-1")
    # Back to what a corral of schema 3 wrote: no suspensions table.
    await sql(pg_url, "DROP TABLE suspensions")
    await sql(pg_url, "UPDATE meta SET v = '3' WHERE k = 'schema_version'")
    async with corral.open_runtime(pg_url, entities=[Recorder], shards=SHARDS) as rt:
        ref = rt.ref(Recorder, "old")
        await ref.signal(Recorder.note, Note(mid="m-2"), message_id="m-2")
        assert (await ref.describe()).suspension is None
        assert [e.suspended for e in (await rt.entities(Recorder)).items] == [False]
    assert await sql(pg_url, "SELECT v FROM meta WHERE k = 'schema_version'") == \
        [(str(PG_SCHEMA_VERSION),)]
    assert await sql(pg_url, "SELECT count(*) FROM suspensions") == [(0,)]
    assert await sql(pg_url, "SELECT count(*) FROM pg_indexes WHERE indexname = "
                     "'suspensions_shard'") == [(1,)]


async def test_the_dedupe_sweep_reads_only_what_it_forgets_and_ids_keep_the_primary_key(
    store: PostgresStore, pg_url: str,
) -> None:
    """A snapshot's sweep reads the ids it forgets, never the whole window it keeps
    (up to 100,000 ids by default, every `SnapshotPolicy.every` messages): counted as
    the rows PostgreSQL's own EXPLAIN ANALYZE says the sweep's scans of `dedupe` read.
    And the index that makes it so is never the one that looks message ids up, not even
    in a generic plan made while the table is young (the trap of an earlier attempt:
    the planner picked a full (etype, key, seq) index over the primary key)."""
    window = 20_000
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(
            "INSERT INTO dedupe (etype, key, message_id, seq, run_id, payload_hash, "
            "accepted_at) SELECT 'T', 'k', 'id-' || lpad(g::text, 8, '0'), g, 1, "
            "'\\x00'::bytea, 1e9 FROM generate_series(1, $1) g", window)

        async def read(forget: int) -> tuple[int, int]:
            """(rows the sweep's scans of dedupe read, rows left) with ids up to
            `forget` past the count bound and every id too young for the age bound."""
            tx = conn.transaction()
            await tx.start()
            try:
                plan = json.loads(await conn.fetchval(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) {_TRIM}", "T", "k", 2, window, forget,
                    0.0, False))
                left = await conn.fetchval("SELECT count(*) FROM dedupe")
            finally:
                await tx.rollback()
            return sum(node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
                       + node.get("Rows Removed by Filter", 0)
                       for node in _plan_nodes(plan) if node.get("Relation Name") == "dedupe"
                       and "Scan" in node["Node Type"]), left

        assert await read(0) == (1, window)  # the first id, kept: nothing else is read
        rows, left = await read(500)
        assert left == window - 500
        assert rows <= 500 + 1 + 500  # the forgotten ids (read, then deleted) and the first kept

        for stats in ("young", "analyzed"):
            await conn.execute("SET plan_cache_mode = force_generic_plan")
            lookup = json.dumps(json.loads(await conn.fetchval(
                f"EXPLAIN (FORMAT JSON) {_LOCK_AND_READ}", ["T"], ["k"], ["T"], ["k"],
                ["id-00000001"])))
            assert "dedupe_pkey" in lookup, (stats, lookup)
            assert "dedupe_sweep" not in lookup, (stats, lookup)
            await conn.execute("RESET plan_cache_mode; ANALYZE dedupe")
    finally:
        await conn.close()


def _plan_nodes(plan: Any) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, depth first."""
    stack = [entry["Plan"] for entry in plan]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.get("Plans", ()))


# -- tailing other processes' acceptances ------------------------------------------------


async def test_the_tail_does_not_skip_an_entry_that_commits_after_a_later_one(
    store: PostgresStore, other: PostgresStore, held: Callable[..., Held],
) -> None:
    start = await other.journal_end()
    op = held()
    slow = asyncio.gather(store.accept(acc("slow", "m", shard=1)), store.write(op))
    await op.reached.wait()  # "slow" is written, numbered and uncommitted
    await other.accept(acc("fast", "m", shard=2))  # accepted after it, committed before it
    pos, seen = await other.journal_tail(start, frozenset({1, 2}))
    assert [e.key for e in seen] == ["fast"]
    op.gate.set()
    await slow
    pos, seen = await other.journal_tail(pos, frozenset({1, 2}))
    assert [e.key for e in seen] == ["slow"]
    assert await other.journal_tail(pos, frozenset({1, 2})) == (pos, [])


async def test_the_tail_orders_a_shards_entries_by_commit_and_skips_none(
    store: PostgresStore, other: PostgresStore, pg_url: str, held: Callable[..., Held],
) -> None:
    start = await other.journal_end()
    op = held()
    slow = asyncio.gather(store.accept(acc("a", "m", shard=3)), store.write(op))
    await op.reached.wait()
    fast = asyncio.create_task(other.accept(acc("b", "m", shard=3)))  # same shard: waits
    await wait_until(lambda: _has_lock_waiters(pg_url), "the second acceptance waits")
    assert await other.journal_tail(start, frozenset({3})) == (start, [])
    op.gate.set()
    await slow
    await fast
    _, seen = await other.journal_tail(start, frozenset({3}))
    assert [e.key for e in seen] == ["a", "b"]


async def test_the_tail_never_skips_an_entry_with_many_concurrent_acceptors(
    spawn: Callable[..., Worker], tmp_path: Path, pg_url: str, store: PostgresStore,
) -> None:
    go = tmp_path / "go"
    workers = [spawn(f"stream{i}", "stream", "--url", pg_url, "--go", str(go), "--out",
                     str(tmp_path / f"acks{i}.json"), "--index", str(i), "--count", "60",
                     "--senders", "20", "--keys", "400") for i in range(4)]
    pos, tailed = await store.journal_end(), []
    go.touch()

    async def drain() -> None:
        nonlocal pos
        while True:
            pos, entries = await store.journal_tail(pos, frozenset(range(SHARDS)), limit=50)
            tailed.extend((e.key, e.seq) for e in entries)
            if not entries:
                return

    while any(w.proc.poll() is None for w in workers):
        await drain()
        await asyncio.sleep(0.001)
    for worker in workers:
        worker.check_exited_cleanly()
    await drain()
    acked = [(a["key"], a["seq"]) for i in range(4)
             for a in json.loads((tmp_path / f"acks{i}.json").read_text())]
    assert len(acked) == 4 * 20 * 60
    assert len(tailed) == len(set(tailed))  # nothing twice
    assert set(tailed) == set(acked)  # nothing skipped


async def test_another_stores_commit_is_heard_at_once_and_our_own_is_not(
    pg_url: str, other: PostgresStore,
) -> None:
    store = await open_postgres_store(pg_url, shards=SHARDS, poll_fallback=3600.0)
    try:
        await store.acquire_leases("h", [5], 60.0)
        assert not await store.foreign_commit_seen()
        heard = store._session.received
        await store.accept(acc("k", "own", shard=5))  # held here: no notification at all
        await store.accept(acc("k1", "own", shard=9))  # notified, as our own
        await other.accept(acc("k2", "not-ours", shard=6))
        await wait_until(lambda: store._session.received == heard + 2, "both notifications")
        assert not await store.foreign_commit_seen()  # our own, and a shard we do not hold
        await other.accept(acc("k3", "theirs", shard=5))
        await wait_until(store.foreign_commit_seen, "the foreign commit is heard", timeout=5)
        assert not await store.foreign_commit_seen()
    finally:
        await store.close()


# -- multiple processes through the runtime -----------------------------------------------


async def test_signal_with_start_from_several_processes_starts_one_run_and_applies_all(
    spawn: Callable[..., Worker], tmp_path: Path, pg_url: str,
) -> None:
    go, fire, n, count = tmp_path / "go", tmp_path / "fire", 3, 100
    workers = [spawn(f"swarm{i}", "swarm", "--url", pg_url, "--go", str(go), "--fire",
                     str(fire), "--ready", str(tmp_path / f"ready{i}"), "--out",
                     str(tmp_path / f"out{i}.json"), "--key", "hot", "--index", str(i),
                     "--count", str(count)) for i in range(n)]
    store = await open_postgres_store(pg_url, shards=SHARDS, poll_fallback=3600.0)
    try:
        async with corral.open_runtime(store, entities=[Recorder], shards=SHARDS) as rt:
            go.touch()
            await wait_until(lambda: all((tmp_path / f"ready{i}").exists() for i in range(n)),
                             "the workers are ready", alive=workers)
            fire.touch()
            await wait_until(lambda: all(w.proc.poll() is not None for w in workers),
                             "the workers finish", timeout=60)
            for w in workers:
                w.check_exited_cleanly()
            acks = [a for i in range(n)
                    for a in json.loads((tmp_path / f"out{i}.json").read_text())]
            assert not [a for a in acks if "error" in a]
            assert sum(a["started"] for a in acks) == 1
            assert {a["run_id"] for a in acks} == {1}
            assert sorted(a["seq"] for a in acks) == list(range(1, n * count + 1))
            by_seq = [a["mid"] for a in sorted(acks, key=lambda a: a["seq"])]
            ref = rt.ref(Recorder, "hot")
            await wait_until(lambda: _caught_up(ref, n * count), "the host applies every "
                             "signal", timeout=10)  # heard through NOTIFY: the fallback is 1 h
            assert await ref.query(Recorder.applied_ids) == by_seq
    finally:
        await store.close()


async def _caught_up(ref: Any, seq: int) -> bool:
    """Hosted by this process (a live activation), with everything up to `seq` applied."""
    info = await ref.describe()
    return bool(info.hosted_here and info.applied_seq == seq)


async def test_a_host_killed_mid_stream_is_taken_over_and_every_ack_is_applied_once(
    spawn: Callable[..., Worker], tmp_path: Path, pg_url: str,
) -> None:
    # Its leases would outlive the test: only its session ending frees its shards.
    host = spawn("host", "host", "--url", pg_url, "--ready", str(tmp_path / "ready"),
                 "--lease-ttl", "600")
    await wait_until(lambda: (tmp_path / "ready").exists(), "the host holds its shards",
                     alive=[host])
    assert len(json.loads((tmp_path / "ready").read_text())["shards"]) == SHARDS
    keys = [f"t-{i}" for i in range(6)]
    client = await open_postgres_store(pg_url, shards=SHARDS)
    acked: dict[str, list[str]] = {k: [] for k in keys}
    try:
        async with corral.open_runtime(client, entities=[Recorder], shards=SHARDS,
                                       host=False) as rt:
            for n in range(60):
                key = keys[n % len(keys)]
                if n == 30:
                    host.sigkill()
                await rt.ref(Recorder, key).signal_with_start(
                    Recorder.note, Note(mid=f"m{n}"), start=Start(), message_id=f"m{n}")
                acked[key].append(f"m{n}")
        survivor = await open_postgres_store(pg_url, shards=SHARDS)
        try:
            async with corral.open_runtime(survivor, entities=[Recorder], shards=SHARDS,
                                           lease_ttl=1.0) as rt:
                await wait_until(lambda: rt.host is not None and len(rt.host.shards) == SHARDS,
                                 "the survivor takes every shard over at once", timeout=10)
                for key in keys:
                    ref = rt.ref(Recorder, key)
                    await wait_until(lambda r=ref, k=key: _caught_up(r, len(acked[k])),
                                     f"the survivor hosts {key} and applies all of it")
                    assert await ref.query(Recorder.applied_ids) == acked[key]  # once each
        finally:
            await survivor.close()
    finally:
        await client.close()


async def test_a_wait_for_a_foreign_commit_cancelled_as_the_commit_is_heard_ends_cancelled(
    pg_url: str, other: PostgresStore,
) -> None:
    """A host's journal tail waits here; closing, the host cancels it and awaits it. On
    Python < 3.12 `asyncio.wait_for` returned the event's result instead, the
    cancellation lost, when it came just after the notification woke the wait: the tail
    went on looping and the host's close waited for it forever (a host closed by SIGTERM
    never exited, `test_handoff.py`). Each round cancels one loop turn later after the
    notification was received, across that window."""
    store = await open_postgres_store(pg_url, shards=SHARDS, poll_fallback=3600.0)
    try:
        await store.acquire_leases("h", [5], 60.0)
        inside = 0  # rounds whose cancellation came while the wait had not returned yet
        for turns in range(8):
            waiting = asyncio.create_task(store.wait_foreign_commit(60.0))
            await asyncio.sleep(0)  # it waits
            heard = store._session.received
            # Watched while the commit returns (its writer gives its connection back
            # first, some loop turns after the notification may have been heard).
            accepting = asyncio.create_task(other.accept(acc(f"k{turns}", "theirs", shard=5)))
            while store._session.received == heard:
                await asyncio.sleep(0)
            for _ in range(turns):
                await asyncio.sleep(0)
            if not waiting.done():
                inside += 1
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
            await accepting
        assert inside  # some cancellation came while it waited: the window was not missed
    finally:
        await store.close()
