"""How many PostgreSQL connections a host holds (issue 42, item 3): an idle host at most
two, whatever it did before (its writer takes a pooled connection per batch, and the
pool closes the connections a burst opened once they go unused), counted by the
server in `pg_stat_activity`."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

import corral
from acceptances import acc
from corral.persistence import _pg_pool, housekeeping
from corral.persistence._batch import Batch
from corral.persistence._postgres import open_postgres_store
from entities import Reply, Start, Ticket
from pg import pg_url as pg_fixture  # noqa: F401 (fixtures, found by name)
from pg import postgres_url as cluster_fixture  # noqa: F401
from procs import wait_until

ROUNDS = 6
BURST = 40  # concurrent calls: the pool opens several connections for them


async def connections(url: str) -> int:
    """The store's backends on the database (corral names its sessions `corral*`),
    asked without blocking the event loop (a blocked loop delays the host's statements
    until they overlap)."""
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'corral%'"))
    finally:
        await conn.close()


async def test_an_idle_host_holds_at_most_two_connections_after_a_burst(pg_url: str) -> None:
    async with corral.open_runtime(pg_url, entities=[Ticket], shards=16,
                                   lease_ttl=1.5) as rt:
        refs = [rt.ref(Ticket, f"ticket-{n}") for n in range(BURST)]
        await asyncio.gather(*(r.signal_with_start(
            Ticket.reply, Reply(text="hi"), start=Start(tenant="acme"), message_id="m")
            for r in refs))
        await asyncio.gather(*(r.describe() for r in refs))
        assert await connections(pg_url) > 2  # the burst took several

        async def idle() -> bool:
            return await connections(pg_url) <= 2
        await wait_until(idle,
                         "the idle host is down to two connections", timeout=60.0)
        seen = []
        for _ in range(8):  # several lease renewals (every 0.5 s) and journal polls
            await asyncio.sleep(0.5)
            seen.append(await connections(pg_url))
        # Idle, it holds two. On a loaded machine a poll can outlast the pool's patience
        # (`PATIENCE`) while another waits, and a third opens for a moment: it never
        # stays (closed after `IDLE_LIFETIME`), so most samples see two and the host
        # comes back to two (a plain pool kept 3 in every sample).
        assert sorted(seen)[len(seen) // 2] <= 2, seen
        await wait_until(idle, "the idle host is back to two connections", timeout=60.0)


@pytest.mark.parametrize("option", ["pool=session", "pool=", "pool=transaction&pool=transaction"])
async def test_a_pool_option_other_than_one_transaction_is_refused_before_connecting(
    option: str,
) -> None:
    url = f"postgresql://ana:secret@127.0.0.1:1/corral?{option}"
    with pytest.raises(corral.InvalidArgumentError, match="`pool` takes only transaction") as err:
        await open_postgres_store(url, shards=2)
    assert "secret" not in str(err.value)


async def test_the_pool_option_is_corrals_own_and_never_reaches_the_server(pg_url: str) -> None:
    """asyncpg sends a URL's unknown query parameters to the server as settings, which
    refuses `pool`; taken out, the store opens (directly here, in transaction mode)."""
    store = await open_postgres_store(f"{pg_url}?pool=transaction", shards=2)
    try:
        assert (await store.accept(acc("k", "m"))).started
    finally:
        await store.close()


async def test_a_read_cancelled_as_a_busy_connection_comes_back_to_it_ends_cancelled(
    pg_url: str,
) -> None:
    """A read waiting its turn for the one open connection is cancelled just as the
    connection comes back to it (a host closing cancels its journal tail there). With
    `asyncio.wait_for` (Python < 3.12) the cancellation was lost: the read went on, and
    the host's close waited for its tail forever."""
    store = await open_postgres_store(pg_url, shards=2)
    try:
        for turns in range(6):  # the cancellation one loop turn later each round
            held, release = asyncio.Event(), asyncio.Event()
            holding = asyncio.create_task(store.read(_hold, held, release))
            await held.wait()  # it holds the only connection
            waiting = asyncio.create_task(store.read(lambda conn: conn.fetchval("SELECT 1")))
            while not store._shared._turns:  # it waits its turn
                await asyncio.sleep(0)
            release.set()
            await holding
            for _ in range(turns):
                await asyncio.sleep(0)
            if not waiting.done():
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
            while store._shared._out:  # the connection is back before the next round
                await asyncio.sleep(0)
    finally:
        await store.close()


async def _hold(conn: object, held: asyncio.Event, release: asyncio.Event) -> None:
    held.set()
    await release.wait()


async def test_a_lone_hosts_two_idle_polls_take_turns_on_one_connection(pg_url: str) -> None:
    """An idle host polls for requests for its shards and for its due timers at the same
    rate, so both polls fell due together: with a second connection open (any overlap
    opens one) each round ran them on two at once, and with the journal tail or a
    lease renewal on a third the pool kept three (a lone host on the benchmark: 3).
    Counted: the connections the store has out as each statement of a round returns."""
    async with corral.open_runtime(pg_url, entities=[Ticket], shards=16,
                                   lease_ttl=60.0) as rt:
        host = rt.backend.host  # type: ignore[attr-defined]
        await wait_until(lambda: len(host.shards) == 16, "the host holds every shard")
        store = host.store
        pool = store._shared
        held, release = asyncio.Event(), asyncio.Event()
        holding = asyncio.create_task(store.read(_hold, held, release))
        await held.wait()
        await store.read(lambda conn: conn.fetchval("SELECT 1"))  # a second one is open
        release.set()
        await holding
        out: list[int] = []  # connections out as each poll's statement returned

        def seen(record: Any) -> None:
            if "lease_handoffs" in record.query or "FROM timers" in record.query:
                out.append(pool._out)
        for holder in store._pool._holders:
            if holder._con is not None:
                holder._con.add_query_logger(seen)
        for _ in range(ROUNDS):  # rounds of both polls, as the host's two loops run them
            await asyncio.gather(host._serve_requests(), host.fire_due_timers())
        assert len(out) == 2 * ROUNDS
        # Without turns every round ran both at once (ROUNDS times 2 out); the host's
        # journal tail may hold one more for a millisecond now and then.
        assert sum(n > 1 for n in out) <= 1, out


async def test_housekeeping_waits_for_the_busy_connection_a_caller_would_open_another_for(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle host's rounds overlap now and then; on a loaded machine one outlasted the
    pool's patience and a third connection opened (one of four idle hosts held three
    on the benchmark). Housekeeping waits for the busy connection instead; a caller's
    read or write still opens another after `PATIENCE`. Counted: the pool's open
    connections (`housekeeping`, `_pg_pool.HOUSEKEEPING_PATIENCE`)."""
    monkeypatch.setattr(_pg_pool, "HOUSEKEEPING_PATIENCE", 60.0)  # never ends the wait here
    store = await open_postgres_store(pg_url, shards=4)
    try:
        held, release = asyncio.Event(), asyncio.Event()
        holding = asyncio.create_task(store.read(_hold, held, release))
        await held.wait()  # the pool's one connection is busy
        with housekeeping():  # tasks started here run as housekeeping
            reading = asyncio.create_task(store.read(lambda conn: conn.fetchval("SELECT 1")))
            writing = asyncio.create_task(store.accept(acc("k", "m1")))
        await asyncio.sleep(_pg_pool.PATIENCE * 4)  # a caller would have opened one by now
        assert not reading.done()
        assert not writing.done()
        assert store._pool.get_size() == 1
        release.set()
        await asyncio.gather(holding, reading, writing)
        assert store._pool.get_size() == 1

        held.clear()
        release.clear()
        holding = asyncio.create_task(store.read(_hold, held, release))
        await held.wait()
        assert await store.read(lambda conn: conn.fetchval("SELECT 1")) == 1  # a caller's
        assert store._pool.get_size() == 2
        release.set()
        await holding
    finally:
        await store.close()


async def test_a_batch_is_housekeeping_only_if_every_op_in_it_was_queued_as_such() -> None:
    batch: Batch[str] = Batch()
    with housekeeping():
        batch.add("renewal")
        batch.add_many(["progress", "registry"])
    assert batch.housekeeping
    batch.add("acceptance")
    assert not batch.housekeeping
    with housekeeping():
        batch.add("renewal")
    assert not batch.housekeeping  # committed as the caller's work: short patience


async def test_housekeeping_keeps_to_the_busy_connection_so_an_idle_one_closes(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With two pooled connections open (a burst opened the second), every round that
    overlapped another took the idle one, and both stayed open for good (a lone idle
    host held three with its session's). Housekeeping waits for the busy one instead,
    so the other goes unused and closes after `IDLE_LIFETIME`."""
    monkeypatch.setattr(_pg_pool, "HOUSEKEEPING_PATIENCE", 60.0)
    store = await open_postgres_store(pg_url, shards=4)
    try:
        held, release = asyncio.Event(), asyncio.Event()
        holding = asyncio.create_task(store.read(_hold, held, release))
        await held.wait()
        assert await store.read(lambda conn: conn.fetchval("SELECT 1")) == 1
        assert store._pool.get_idle_size() == 1  # a second, idle now; the first busy
        with housekeeping():
            reading = asyncio.create_task(store.read(lambda conn: conn.fetchval("SELECT 2")))
        await asyncio.sleep(_pg_pool.PATIENCE * 4)
        assert not reading.done()  # waits for the busy one, leaving the idle one be
        release.set()
        await holding
        assert await reading == 2
    finally:
        await store.close()


async def test_a_direct_stores_connections_run_without_jit(pg_url: str) -> None:
    """A listing page at 1M entities, costed on its estimates, crossed `jit_above_cost`
    and spent 35 ms compiling a 0.1 ms read (benchmarks/scale.py: 42 ms a page)."""
    store = await open_postgres_store(pg_url, shards=2)
    try:
        assert await store.read(lambda conn: conn.fetchval("SHOW jit")) == "off"
        assert await store.read(lambda conn: conn.fetchval(
            "SELECT setting FROM pg_settings WHERE name = 'jit'")) == "off"
    finally:
        await store.close()
