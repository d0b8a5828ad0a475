"""An idle host's cost does not grow with the shards it holds (issue 42, item 4).

Counted in statements the database runs, on both stores: SQLite's trace callback on
the store's connections, asyncpg's query logger on the PostgreSQL store's pooled
connections (the writer takes its connection from the pool). Counts, never timings.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from acceptances import opened
from corral.persistence import Store
from corral.persistence._postgres import PostgresStore
from corral.persistence._sqlite import SqliteStore

SHARDS = 256


@contextlib.asynccontextmanager
async def statements(store: Store) -> AsyncIterator[list[str]]:
    """The SQL texts `store` runs inside the block."""
    seen: list[str] = []
    if isinstance(store, SqliteStore):
        threads = {id(t): t for t in (store._writer, store._reader) if t is not None}
        for t in threads.values():
            await t.call(lambda db: db.set_trace_callback(seen.append))
        try:
            yield seen
        finally:
            for t in threads.values():
                await t.call(lambda db: db.set_trace_callback(None))
        return
    assert isinstance(store, PostgresStore)
    logged = list(_pooled(store))
    for conn in logged:
        conn.add_query_logger(lambda record: seen.append(record.query))
    try:
        yield seen
    finally:
        for conn in logged:
            conn._query_loggers.clear()


def _pooled(store: PostgresStore) -> Iterator[Any]:
    for holder in store._pool._holders:
        if holder._con is not None:
            yield holder._con


def _leases(seen: list[str]) -> list[str]:
    return [s for s in seen if "leases" in s]


async def test_a_renewal_round_runs_as_many_statements_for_256_leases_as_for_16(
    db_path: str,
) -> None:
    async with opened(db_path, SHARDS) as store:
        counts = []
        for owner, held in (("a", range(16)), ("b", range(16, SHARDS))):
            taken = await store.acquire_leases(owner, list(held), 60.0)
            assert len(taken) == len(held)
            async with statements(store) as seen:
                assert await store.renew_leases(owner, taken, 60.0) == set(taken)
            counts.append(len(_leases(seen)))
        assert counts[0] == counts[1] == 1


async def test_a_renewal_still_notices_the_one_lease_another_holder_took(
    db_path: str,
) -> None:
    async with opened(db_path, SHARDS) as store, opened(db_path, SHARDS) as other:
        taken = await store.acquire_leases("a", list(range(8)), 60.0)
        assert await other.acquire_leases("b", [3], 60.0, force=True) == {3: 2}
        assert await store.renew_leases("a", taken, 60.0) == set(range(8)) - {3}
        assert await store.renew_leases("a", {0: 2}, 60.0) == set()  # not at that epoch


async def test_a_standby_host_locks_no_lease_row_while_every_lease_is_live(
    db_path: str,
) -> None:
    async with opened(db_path, SHARDS) as holder, opened(db_path, SHARDS) as standby:
        assert len(await holder.acquire_leases("a", list(range(SHARDS)), 60.0)) == SHARDS
        assert await standby.acquire_leases("b", [0], 60.0) == {}  # connections warm
        async with statements(standby) as seen:
            assert await standby.acquire_leases("b", list(range(SHARDS)), 60.0) == {}
        writes = [s for s in seen if "FOR UPDATE" in s or "BEGIN IMMEDIATE" in s
                  or s.lstrip().upper().startswith(("INSERT", "UPDATE"))]
        assert seen
        assert writes == []
        await holder.release_leases("a")
        assert len(await standby.acquire_leases("b", list(range(SHARDS)), 60.0)) == SHARDS


@pytest.fixture(autouse=True)
def _both(db_path: str) -> None:
    """Every test here runs on both stores (`db_path` is parametrised by conftest)."""


async def test_an_idle_sqlite_poll_asks_sqlite_only_when_the_file_changed(
    tmp_path: Any,
) -> None:
    path = str(tmp_path / "idle.db")
    async with opened(path, 16) as store, opened(path, 16) as other:
        await other.acquire_leases("b", [1], 60.0)  # a commit: the -shm file exists
        await store.foreign_commit_seen()
        async with statements(store) as seen:
            for _ in range(50):
                await store.foreign_commit_seen()
        assert len(seen) <= 1  # the safety net may ask once (`RECHECK`)
        await other.release_leases("b")
        assert await store.foreign_commit_seen()  # a foreign commit is still seen at once


async def test_a_holders_poll_for_lease_requests_is_one_statement(db_path: str) -> None:
    """A host polls for requests for its shards four times a second between renewals:
    on PostgreSQL the server's clock was read by a statement of its own first (a lone
    idle host ran 8 statements/s of the 18 it ran in all for this poll)."""
    async with opened(db_path, SHARDS) as store:
        assert len(await store.acquire_leases("a", list(range(SHARDS)), 60.0)) == SHARDS
        await store.lease_requests("a")  # connections warm
        async with statements(store) as seen:
            assert await store.lease_requests("a") == {}
        assert len([s for s in seen if not s.lstrip().upper().startswith(
            ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE"))]) == 1, seen
