"""The census reads counters and index seeks, never a walk of the entities (issue 42).

Entities by type and status, dead letters, open signal waits and suspended runs come
from `census_counts`, kept by the transactions that write those rows: after a mixed
workload through the `Store` API (racing starts from two writers, a refused
`accept_all`, closes, failures, terminations, continue-as-new, re-runs, retention, dead
letters recorded, replayed, discarded and overflowing, waits opened, delivered, timed
out and closed by their run's end, suspensions recorded, retried, cleared and ended
with their run) they equal a GROUP BY of the rows. The census and the key-prefix
search across types read what they count or seek: their plans (SQLite's EXPLAIN QUERY
PLAN, PostgreSQL's EXPLAIN on a store large enough for a scan to tempt the planner)
never scan `entities` or `runs`, and their SQLite VM steps at 20,000 entities, with
dead letters, open waits and suspensions in proportion, are within 1.5x of those at
2,000 (`read_work`).
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

import corral
from acceptances import acc, fence_for, opened
from corral.persistence import DeliveryRequest, EntryKind, Suspension, open_store
from corral.persistence._census import census, recount
from corral.persistence._pg_txn import numbered
from corral.persistence._reads import dead_letters, list_entities
from corral.persistence._sqlite_txn import SqliteTxn
from corral.persistence._txn import Txn, drive
from stores import is_postgres, sql, vm_steps

SHARDS = 4
COMPLETED, FAILED = corral.RunStatus.COMPLETED, corral.RunStatus.FAILED


# What each counter counts, (etype, what, shard, count) from the rows themselves.
_TRUTH = (
    "SELECT etype, status, shard, count(*) FROM entities GROUP BY etype, status, shard",
    "SELECT d.etype, 'dead_letters', e.shard, count(*) FROM dead_letters d JOIN entities e "
    "ON e.etype = d.etype AND e.key = d.key GROUP BY d.etype, e.shard",
    "SELECT etype, 'open_waits', shard, count(*) FROM signal_waits WHERE status = 'open' "
    "GROUP BY etype, shard",
    "SELECT s.etype, 'suspended_runs', e.shard, count(*) FROM suspensions s JOIN entities e "
    "ON e.etype = s.etype AND e.key = s.key AND e.run_id = s.run_id "
    "WHERE e.status = 'running' GROUP BY s.etype, e.shard",
)


def _truth(location: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for q in _TRUTH for r in sql(location, q))


def _counters(location: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in sql(
        location, "SELECT etype, what, shard, n FROM census_counts WHERE n <> 0"))


def _whats(rows: list[tuple[Any, ...]]) -> set[str]:
    return {r[1] for r in rows}


def _delivery(key: str, name: str, delivery_key: str) -> DeliveryRequest:
    return DeliveryRequest("E", key, 1, name, delivery_key, '{"ok":true}', None, "buffer")


async def test_the_entity_counters_equal_the_rows_after_a_mixed_workload(
        db_path: str) -> None:
    async with opened(db_path, SHARDS) as store, opened(db_path, SHARDS) as other:
        fence = await fence_for(store, 1)
        # Racing signal-with-starts from two writers: one start per key.
        await asyncio.gather(*(s.accept(acc(f"k{i}", f"{n}-{w}"))
                               for i in range(6) for n in range(3)
                               for w, s in enumerate((store, other))))
        await store.accept(acc("t", "x", etype="T", shard=2))
        # A refused all-or-nothing batch starts nothing (its start rolled back, after a
        # terminate flushed it).
        with pytest.raises(corral.BatchRefusedError):
            await store.accept_all([acc("never", "a"), acc("never", "end", start=None,
                                                            kind=EntryKind.TERMINATE),
                                    acc("nope", "b", start=None)])
        # Start and terminate in one batch; terminate a running one.
        await store.accept_many([acc("brief", "a"), acc("brief", "end", start=None,
                                                        kind=EntryKind.TERMINATE)])
        await store.accept(acc("k0", "end", start=None, kind=EntryKind.TERMINATE))
        assert await store.close_run(fence, "E", "k1", 1, applied_seq=6, status=COMPLETED,
                                     result=None, error=None)
        pending = await store.journal("E", "k2", run_id=1, after_seq=0)
        assert await store.close_run(fence, "E", "k2", 1, applied_seq=0, status=FAILED,
                                     result=None, error="boom", force=True,
                                     pending=pending)
        assert await store.continue_as_new(fence, "E", "k3", 1, applied_seq=6,
                                           next_input="{}", carried=()) == 2
        await store.accept(acc("k1", "again"))  # a re-run of a closed entity
        await _dead_letters_waits_and_suspensions(store, fence)
        assert _whats(_counters(db_path)) >= {"dead_letters", "open_waits", "suspended_runs"}
        assert _counters(db_path) == _truth(db_path)
        purged = await store.purge_closed("E", 1e12, limit=10)
        assert purged.entities == 4  # "brief", "k0", "k2", "k6" ("k1" runs again)
        assert _counters(db_path) == _truth(db_path)
        found = await store.census()
        assert found.entities == tuple(sql(
            db_path, "SELECT etype, status, count(*) FROM entities GROUP BY etype, status "
            "ORDER BY etype, status"))
        assert found.dead_letters == (("E", 2),)  # k5's first and overflow (k2's purged)
        assert found.suspended_runs == (("E", 1),)  # k4's
        assert found.open_waits == (("E", 1),)  # k5's "approval"


async def _dead_letters_waits_and_suspensions(store: Any, fence: Any) -> None:
    """Dead letters, waits and suspensions coming and going on shard 1's entities."""
    # Suspensions: recorded and retried (k4, kept), cleared once resumed (k5), ended
    # with their run by a terminate (k6) and by continue-as-new (k3's second run).
    for attempt in (1, 2):
        await store.suspend_run(fence, Suspension("E", "k4", 1, "RuntimeError", attempt,
                                                  1.0, 9.0))
    await store.suspend_run(fence, Suspension("E", "k5", 1, "RuntimeError", 1, 1.0, 9.0))
    await store.clear_suspension(fence, "E", "k5", 1)
    await store.accept(acc("k6", "a"))
    await store.suspend_run(fence, Suspension("E", "k6", 1, "RuntimeError", 1, 1.0, 9.0))
    await store.suspend_run(fence, Suspension("E", "k3", 2, "RuntimeError", 1, 1.0, 9.0))
    # Waits: one left open (k5 "approval"), one delivered, one timed out by its host and
    # one by a delivery past its deadline (the store's clock), one closed by its run's
    # terminate (k6), one by continue-as-new (k3), one buffered then taken.
    for name, deadline in (("approval", None), ("delivered", None), ("late", 5.0),
                           ("later", 5.0)):
        await store.open_wait(fence, "E", "k5", 1, name, deadline=deadline, now=1.0)
    assert (await store.deliver(_delivery("k5", "delivered", "d1"))).status == "delivered"
    await store.expire_wait(fence, "E", "k5", 1, "late", now=6.0)
    assert (await store.deliver(_delivery("k5", "later", "d3"))).status == "stale"
    assert (await store.deliver(_delivery("k4", "early", "d2"))).status == "buffered"
    await store.open_wait(fence, "E", "k4", 1, "early", deadline=None, now=1.0)
    await store.open_wait(fence, "E", "k6", 1, "w", deadline=None, now=1.0)
    await store.open_wait(fence, "E", "k3", 2, "w", deadline=None, now=1.0)
    await store.accept(acc("k6", "end", start=None, kind=EntryKind.TERMINATE))
    assert await store.continue_as_new(fence, "E", "k3", 2, applied_seq=6,
                                       next_input="{}", carried=()) == 3
    # Dead letters: recorded (twice: idempotent), replayed, discarded, an acceptance
    # over its entity's backlog kept as one, and k2's (its forced close) purged.
    entries = await store.journal("E", "k5", run_id=1, after_seq=0)
    ids = [await store.record_dead_letter(fence, e, error="e", traceback="", attempts=1,
                                          failed_at=1.0) for e in (*entries[:3], entries[0])]
    assert len(set(ids)) == 3
    await store.replay_dead_letter("E", "k5", 1, ids[1], accepted_at=2.0)
    assert await store.discard_dead_letter("E", "k5", ids[2])
    assert not await store.discard_dead_letter("E", "k5", ids[2])
    overflowed = await store.accept(acc("k4", "over", max_backlog=1, overflow="dead_letter"))
    assert overflowed.dead_letter_id is not None


async def test_recount_rebuilds_the_counters_from_the_rows(db_path: str) -> None:
    async with opened(db_path, SHARDS) as store:
        for i in range(5):
            await store.accept(acc(f"k{i}", "m", shard=i % SHARDS))
        fence = await fence_for(store, 1)
        await store.suspend_run(fence, Suspension("E", "k1", 1, "RuntimeError", 1, 1.0, 9.0))
        await store.open_wait(fence, "E", "k1", 1, "w", deadline=None, now=1.0)
        first = (await store.journal("E", "k1", run_id=1, after_seq=0))[0]
        await store.record_dead_letter(fence, first, error="e", traceback="", attempts=1,
                                       failed_at=1.0)
    sql(db_path, "DELETE FROM census_counts")
    sql(db_path, "INSERT INTO census_counts VALUES ('E', 'running', 0, 99)")
    await _on_store(db_path, recount)
    assert _whats(_counters(db_path)) == {"running", "dead_letters", "open_waits",
                                          "suspended_runs"}
    assert _counters(db_path) == _truth(db_path)


# -- plans and work: index seeks and counters, never a walk ---------------------------


class _Recording(Txn):
    """A read-only `Txn` over an engine's own, recording each statement it runs."""

    def __init__(self, inner: Txn) -> None:
        super().__init__()
        self.inner, self.statements = inner, list[tuple[str, tuple[Any, ...]]]()
        self.GREATEST = inner.GREATEST  # type: ignore[misc]
        self.ROW_CURSOR = inner.ROW_CURSOR  # type: ignore[misc]
        self.PAGE_RANGE = inner.PAGE_RANGE  # type: ignore[misc]

    async def fetchone(self, query: str, *args: Any) -> Sequence[Any] | None:
        self.statements.append((query, args))
        return await self.inner.fetchone(query, *args)

    async def fetchall(self, query: str, *args: Any) -> list[Sequence[Any]]:
        self.statements.append((query, args))
        return await self.inner.fetchall(query, *args)

    async def fetchall_replanned(self, query: str, *args: Any) -> list[Sequence[Any]]:
        self.statements.append((query, args))
        return await self.inner.fetchall_replanned(query, *args)

    async def clock(self) -> float:
        return await self.inner.clock()

    def starts_with(self, column: str, prefix: str) -> tuple[str, tuple[Any, ...]]:
        return self.inner.starts_with(column, prefix)


_READS: dict[str, Callable[[Txn], Awaitable[object]]] = {
    "census": census,
    # Fewer matches than a page, past the cursor's type: every type is sought.
    "prefix across types": lambda q: list_entities(q, None, None, 50, ("A", "k-0"), "k-0000100"),
}


async def _on_store(location: str, read: Callable[[Txn], Awaitable[Any]]) -> Any:
    """`read` through an engine's `Txn` on its own connection (committed after)."""
    if not is_postgres(location):
        db = sqlite3.connect(location, isolation_level=None)
        try:
            return drive(read(SqliteTxn(db=db)))  # type: ignore[arg-type]
        finally:
            db.close()
    import asyncpg

    from corral.persistence._pg_txn import PgTxn
    conn = await asyncpg.connect(location)
    try:
        return await read(PgTxn(conn=conn, token="test"))
    finally:
        await conn.close()


def _build(location: str, entities: int, *, in_proportion: bool = False) -> None:
    """`entities` entities of types A, B, C (closed but for 30 running, 10 behind), their
    runs, a few dead letters, open waits and suspensions, and a delivered wait for one
    entity in ten (retained waits grow with the store), written in bulk, then counted
    (`recount`) and, on PostgreSQL, analyzed.

    `in_proportion`: as `benchmarks/_bulk.py`'s mix, dead letters, open waits and
    suspended runs grow with the entities (one entity in ten running, one in 100 with
    a suspended run, one in 100 with a dead letter, one in 1,000 with an open wait),
    and every shard's holder is live and vouches for its backlog (`_backlog`: the
    backlog's own cost, a seek per running entity without one, is not this test's)."""
    if is_postgres(location):
        series = f"generate_series(0, {entities - 1}) AS g(i)"
        pad = "lpad(i::text, 8, '0')"
        etype = "chr(65 + i % 3)"
    else:
        series = (f"(WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g "
                  f"WHERE i < {entities - 1}) SELECT i FROM g) g")
        pad = "substr('0000000' || i, -8, 8)"
        etype = "char(65 + i % 3)"
    more = " OR i % 10 = 5" if in_proportion else ""
    status = f"CASE WHEN i < 30{more} THEN 'running' ELSE 'completed' END"
    sql(location, f"INSERT INTO entities (etype, key, shard, run_id, status, next_seq, "
        f"updated_at) SELECT {etype}, 'k-' || {pad}, i % {SHARDS}, 1, {status}, "
        f"CASE WHEN i < 10 THEN 5 ELSE 2 END, 1.0 FROM {series}")
    sql(location, "INSERT INTO runs (etype, key, run_id, status, started_at, closed_at, "
        "first_seq) SELECT etype, key, 1, status, 1.0, CASE WHEN status = 'running' "
        "THEN NULL ELSE 2.0 END, 1 FROM entities")
    sql(location, "INSERT INTO journal (etype, key, seq, run_id, shard, kind, name, "
        f"message_id, payload, sender, accepted_at{', tick' if is_postgres(location) else ''}"
        ") SELECT etype, key, 4, 1, shard, 'signal', 'n', 'm', '{}', NULL, 3.0"
        f"{', 0' if is_postgres(location) else ''} FROM entities WHERE next_seq = 5")
    suspended, waiting = ((" OR key LIKE '%05'", " OR key LIKE '%005'") if in_proportion
                          else ("", ""))
    sql(location, "INSERT INTO suspensions SELECT etype, key, 1, shard, 'e', 1, 1.0, 2.0 "
        f"FROM entities WHERE status = 'running' AND (key < 'k-00000006'{suspended})")
    sql(location, "INSERT INTO signal_waits (etype, key, run_id, name, shard, status, "
        "opened_at) SELECT etype, key, 1, 'w', shard, 'open', 1.0 FROM entities "
        f"WHERE status = 'running' AND (key < 'k-00000020'{waiting})")
    sql(location, "INSERT INTO signal_waits (etype, key, run_id, name, shard, status, "
        "opened_at) SELECT etype, key, 1, 'w', shard, 'delivered', 1.0 FROM entities "
        "WHERE status <> 'running' AND key LIKE '%0'")
    for i in range(5):
        sql(location, "INSERT INTO dead_letters (etype, key, run_id, seq, message_id, name, "
            "payload, error, traceback, attempts, failed_at) "
            "VALUES ('A', ?, 1, 1, 'm', 'n', '{}', 'e', '', 1, 1.0)", f"k-{i * 3:08d}")
    if in_proportion:
        sql(location, "INSERT INTO dead_letters (etype, key, run_id, seq, message_id, name, "
            "payload, error, traceback, attempts, failed_at) SELECT etype, key, 1, 1, 'm', "
            "'n', '{}', 'e', '', 1, 1.0 FROM entities WHERE key LIKE '%07'")
        sql(location, "DELETE FROM leases")
        for shard in range(SHARDS):
            sql(location, "INSERT INTO leases (shard, owner, epoch, expires_at) "
                "VALUES (?, 'h', 1, 1e12)", shard)
            sql(location, "INSERT INTO backlogs (shard, etype, epoch, messages, entities, "
                "recorded_at) VALUES (?, '', 1, 0, 0, 1.0)", shard)
    if is_postgres(location):  # autovacuum's statistics (corral never analyzes SQLite)
        sql(location, "ANALYZE")


async def _built(location: str, entities: int, *, in_proportion: bool = False) -> None:
    store = await open_store(location, shards=SHARDS)
    await store.close()
    _build(location, entities, in_proportion=in_proportion)
    await _on_store(location, recount)


async def _plans(location: str, name: str) -> list[list[str]]:
    """The plan of every statement read `name` runs on the store at `location`."""
    recording = await _on_store(location, lambda q: _record(q, name))
    plans = []
    for query, args in recording:
        if is_postgres(location):
            explain = "EXPLAIN " + numbered(query)
            plans.append([str(r[0]) for r in await _on_store(
                location, lambda q, s=explain, a=args: q.conn.fetch(  # type: ignore[attr-defined]
                    s, *a))])
        else:
            plans.append([str(r[3]) for r in sql(location, "EXPLAIN QUERY PLAN " + query,
                                                  *args)])
    return plans


async def _record(q: Txn, name: str) -> list[tuple[str, tuple[Any, ...]]]:
    recording = _Recording(q)
    await _READS[name](recording)
    return recording.statements


# SQLite names a table by its alias in a plan: e (entities), r (runs).
_WALK = re.compile(r"^(SCAN|Seq Scan on|Parallel Seq Scan on) (entities|runs|e|r)\b"
                   r"|Seq Scan on (entities|runs)\b")


@pytest.mark.parametrize("name", sorted(_READS))
async def test_the_census_and_the_prefix_search_across_types_never_walk_the_entities(
        db_path: str, name: str) -> None:
    await _built(db_path, 20_000)
    plans = await _plans(db_path, name)
    assert plans
    for plan in plans:
        # A listing page is a subquery named `entities` (`page_with_progress`): SQLite's scan
        # of it, made (or run as a co-routine), reads the page.
        page = "MATERIALIZE entities" in plan or "CO-ROUTINE entities" in plan
        walks = [line for line in plan if _WALK.search(line.strip().lstrip("-> ").strip())
                 and not (page and line == "SCAN entities")]
        assert not walks, "\n".join(plan)


def read_work(location: str, read: Callable[[Txn], Awaitable[object]]) -> int:
    """SQLite VM steps of `read` on the store at `location`: work that the machine's
    load cannot change."""
    return vm_steps(location, read)[0]  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(_READS))
async def test_the_census_and_the_prefix_search_do_the_same_work_at_ten_times_the_entities(
        tmp_path: Any, name: str) -> None:
    work = []
    for entities in (2_000, 20_000):
        location = str(tmp_path / f"{entities}.db")
        await _built(location, entities)
        work.append(read_work(location, _READS[name]))
    assert work[1] <= 1.5 * work[0], work


async def test_the_census_does_the_same_work_at_ten_times_the_dead_letters_waits_and_suspensions(
        tmp_path: Any) -> None:
    work, found = [], []
    for entities in (2_000, 20_000):
        location = str(tmp_path / f"{entities}.db")
        await _built(location, entities, in_proportion=True)
        found.append(await _on_store(location, census))
        work.append(read_work(location, census))
    sizes = [(sum(n for _, n in c.dead_letters), sum(n for _, n in c.open_waits),
              sum(n for _, n in c.suspended_runs)) for c in found]
    # The fixed few (5 dead letters, 20 open waits, 6 suspended: k-00000005 among
    # them) and one in 100 / 1,000 / 100 entities: x8 / x1.9 / x8 the rows.
    assert sizes == [(25, 21, 25), (205, 39, 205)], sizes
    assert work[1] <= 1.5 * work[0], work


async def test_a_page_of_one_types_dead_letters_seeks_its_index_whatever_the_id_order(
        db_path: str) -> None:
    """Operators page one type's dead letters: a seek of `dead_letters_type`, never a
    walk of the primary key past every other type's letters (PostgreSQL chose that walk
    when the type's letters came last in id order: x39 from 10k to 1M entities)."""
    await _built(db_path, 2_000)
    for etype in ("A", "B", "C"):  # all of A's letters, then B's, then C's, in id order
        sql(db_path, "INSERT INTO dead_letters (etype, key, run_id, seq, message_id, name, "
            "payload, error, traceback, attempts, failed_at) SELECT ?, key, 1, 1, 'm', 'n', "
            "'{}', 'e', '', 1, 1.0 FROM entities", etype)
    if is_postgres(db_path):
        sql(db_path, "ANALYZE dead_letters")
    _READS["C's dead letters"] = lambda q: dead_letters(q, "C", None, 20, 0)
    try:
        [plan] = await _plans(db_path, "C's dead letters")
    finally:
        del _READS["C's dead letters"]
    assert "dead_letters_type" in "\n".join(plan), "\n".join(plan)
    page = await _on_store(db_path, lambda q: dead_letters(q, "C", None, 20, 0))
    assert [d.entity_type for d in page] == ["C"] * 20
    assert [d.id for d in page] == sorted(d.id for d in page)
