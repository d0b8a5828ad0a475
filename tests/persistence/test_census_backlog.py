"""The census's backlog: holders' summaries where a live lease vouches, exact elsewhere.

Through the `Store` API, as a holder writes them (`record_progress(backlog=)`, fenced):
a shard's summary is read only at the epoch of a live lease; a shard taken at a new
epoch, one whose holder does not know every entity's backlog, and one no live lease
holds are counted exactly from the rows; a type gone from a summary counts nothing.
(The summaries below are deliberately not the truth, so each number shows which source
it came from.) With every shard vouched for, the census's SQLite VM steps at 20,000
running entities are within 1.5x of those at 2,000.

A holder's summary of entities it has not activated is "not known" (`Shard.backlog`):
a host that recovered 20,000 running entities vouches only once every one is resident.
The work test therefore writes, for each shard, the summary such a host writes: the
shard's exact backlog (asserted equal to the rows), through the holder's own call.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

import corral
from acceptances import acc, fence_for, opened
from corral.persistence import ShardBacklog, TypeBacklog
from corral.persistence._backlog import EXACT, exact_sql
from corral.persistence._census import census, recount
from corral.persistence._sqlite_txn import SqliteTxn
from corral.persistence._txn import drive
from stores import is_postgres, sql, vm_steps

SHARDS = 4


def _exact(location: str) -> tuple[TypeBacklog, ...]:
    greatest = "greatest" if is_postgres(location) else "max"
    rows = sql(location, EXACT.format(greatest=greatest, shards=""))
    return tuple(TypeBacklog(r[0], int(r[1]), int(r[2]), r[3]) for r in sorted(rows))


async def test_summaries_count_only_at_a_live_leases_epoch_and_the_rest_is_exact(
        db_path: str) -> None:
    async with opened(db_path, SHARDS) as store:
        for shard, key in ((0, "a"), (1, "b"), (2, "c")):
            for mid in ("m1", "m2"):
                await store.accept(acc(key, mid, shard=shard))
        fences = [await fence_for(store, shard) for shard in range(3)]
        oldest = {key: sql(db_path, "SELECT min(accepted_at) FROM journal WHERE key = ?",
                           key)[0][0] for key in "abc"}
        assert _exact(db_path) == (TypeBacklog("E", 6, 3, min(oldest.values())),)
        forged = {"E": (100, 1, 1e9), "T": (7, 1, 2e9)}
        for fence in fences:
            await store.record_progress(fence, [], at=5.0, backlog=ShardBacklog(forged))
        # Shards 0-2 vouched for (their forged summaries), shard 3 exact (nothing).
        assert (await store.census()).backlog == (TypeBacklog("E", 300, 3, 1e9),
                                                  TypeBacklog("T", 21, 3, 2e9))
        # Shard 1: its holder no longer knows; shard 2: T is gone from its summary.
        await store.record_progress(fences[1], [], at=6.0, backlog=ShardBacklog(None))
        await store.record_progress(fences[2], [], at=6.0, backlog=ShardBacklog(
            {"E": (100, 1, 1e9)}, gone=("T",)))
        assert (await store.census()).backlog == (TypeBacklog("E", 202, 3, oldest["b"]),
                                                  TypeBacklog("T", 7, 1, 2e9))
        # Shard 0 taken by another holder (a new epoch, before its first round): exact.
        await store.acquire_leases("other", [0], 60.0, force=True)
        assert (await store.census()).backlog == (
            TypeBacklog("E", 104, 3, min(oldest["a"], oldest["b"])),)
        # Every lease gone: all exact.
        await store.release_leases("other")
        await store.release_leases("host")
        assert (await store.census()).backlog == _exact(db_path)


async def test_a_stale_fence_writes_no_summary(db_path: str) -> None:
    async with opened(db_path, SHARDS) as store:
        fence = await fence_for(store, 0)
        await store.acquire_leases("other", [0], 60.0, force=True)
        with pytest.raises(corral.LeaseLostError):
            await store.record_progress(fence, [], at=1.0,
                                        backlog=ShardBacklog({"E": (5, 1, 1.0)}))
        assert sql(db_path, "SELECT count(*) FROM backlogs")[0][0] == 0


# -- work: the same at ten times the running entities ----------------------------------


def _build_running(location: str, running: int) -> None:
    """`running` running entities of types A, B, C over the shards, ten of them behind
    by four messages (a journal entry at seq 4 each), in bulk; then counted."""
    series = (f"(WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g "
              f"WHERE i < {running - 1}) SELECT i FROM g) g")
    sql(location, "INSERT INTO entities (etype, key, shard, run_id, status, next_seq, "
        f"updated_at) SELECT char(65 + i % 3), 'k-' || substr('0000000' || i, -8, 8), "
        f"i % {SHARDS}, 1, 'running', CASE WHEN i < 10 THEN 5 ELSE 1 END, 1.0 FROM {series}")
    sql(location, "INSERT INTO runs (etype, key, run_id, status, started_at, first_seq) "
        "SELECT etype, key, 1, status, 1.0, 1 FROM entities")
    sql(location, "INSERT INTO journal (etype, key, seq, run_id, shard, kind, name, "
        "message_id, payload, sender, accepted_at) SELECT etype, key, 4, 1, shard, "
        "'signal', 'n', 'm', '{}', NULL, 3.0 + length(key) FROM entities WHERE next_seq = 5")


def _steps(location: str) -> tuple[int, Any]:
    """SQLite VM steps of a census on the store at `location`, and its backlog."""
    steps, found = vm_steps(location, census)
    return steps, found.backlog


def _shard_truth(location: str, shard: int) -> dict[str, tuple[int, int, float | None]]:
    db = sqlite3.connect(location, isolation_level=None)
    try:
        q = SqliteTxn(db=db)  # type: ignore[arg-type]
        rows = drive(q.fetchall(exact_sql(q, 1), shard))
    finally:
        db.close()
    return {r[0]: (int(r[1]), int(r[2]), r[3]) for r in rows}


async def test_with_every_shard_vouched_for_the_census_does_the_same_work_at_ten_times(
        tmp_path: Any) -> None:
    work = []
    for running in (2_000, 20_000):
        location = str(tmp_path / f"{running}.db")
        async with opened(location, SHARDS) as store:
            _build_running(location, running)
            db = sqlite3.connect(location, isolation_level=None)
            try:
                drive(recount(SqliteTxn(db=db)))  # type: ignore[arg-type]
            finally:
                db.close()
            for shard in range(SHARDS):
                await store.record_progress(
                    await fence_for(store, shard), [], at=1.0,
                    backlog=ShardBacklog(_shard_truth(location, shard)))
            steps, found = _steps(location)
        assert found == _exact(location)
        assert sum(b.entities for b in found) == 10
        work.append(steps)
    assert work[1] <= 1.5 * work[0], work
