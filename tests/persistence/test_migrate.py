"""Moving a store between SQLite and PostgreSQL (`corral.persistence.migrate`): a store
left mid-life by real hosts is copied, and a host on the copy finishes its work.

The store: entities that applied signals (and one passivated: a snapshot and a tail),
then signals accepted by a pure client and applied by nobody (backlogs), a run asleep
on a durable timer, a run on a signal wait with a deadline, a run past a durable step,
a closed run and a purged one, a suspended run, a delivery buffered before its run reached the wait,
sends waiting in their sender's outbox (their target's mailbox full, its run
suspended), dead letters (a capped mailbox's overflow), two builds of one type, two
declared releases and a schedule firing every second.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import corral
from corral import StoreHostedElsewhereError
from corral._errors import InvalidArgumentError, ShardCountError, StoreError
from corral.persistence import backup, migrate, verify
from corral.persistence._copy_plan import PLANS, SKIPPED
from corral.persistence._tables import TABLES
from migrate_entities import (
    SINK,
    Add,
    Capped,
    Ledger,
    LedgerInput,
    Note,
    Relay,
    Sink,
    TallyR1,
    TallyR2,
)
from pg import pg_url as pg_fixture  # noqa: F401 (a fixture, found by name)
from procs import wait_until
from stores import sql

SHARDS = 2
ENTITIES = [Ledger, Capped, Sink]
IDLE = [f"idle-{i}" for i in range(4)]


@dataclass
class MidLife:
    """What the store holds, for the checks on its copy."""

    due: float = 0.0
    applied: dict[str, list[str]] = field(default_factory=dict)


async def _state(rt: corral.Runtime, key: str) -> object:
    return await rt.ref(Ledger, key).query(Ledger.state)


async def build_mid_life(location: str) -> MidLife:
    for build in (TallyR1, TallyR2):  # two builds of one type
        async with corral.open_runtime(location, entities=[build], shards=SHARDS):
            pass
    life = MidLife(due=time.time() + 6)
    async with corral.open_runtime(location, entities=ENTITIES, shards=SHARDS) as rt:
        for key in IDLE:
            await rt.ref(Ledger, key).signal_with_start(
                Ledger.add, Add(tag=f"{key}/0"), start=LedgerInput(), message_id=f"{key}/0")
        for key in IDLE:
            await wait_until(lambda k=key: _applied(rt, k, 1), f"{key} applied its first")
        assert rt.host is not None
        for shard in rt.host.shards.values():  # a snapshot, then a tail past it
            act = shard.get("Ledger", IDLE[0])
            if act is not None:
                await act.passivate()
        await rt.ref(Ledger, IDLE[0]).signal(Ledger.add, Add(tag=f"{IDLE[0]}/1"),
                                             message_id=f"{IDLE[0]}/1")
        await wait_until(lambda: _applied(rt, IDLE[0], 2), "the tail applied")
        await rt.ref(Ledger, "timer").start(start=LedgerInput(mode="timer", due=life.due))
        await rt.ref(Ledger, "wait").start(start=LedgerInput(mode="wait"))
        await rt.ref(Ledger, "step").start(start=LedgerInput(mode="step"))
        await rt.ref(Ledger, "purged").start(start=LedgerInput(mode="close"))
        await wait_until(lambda: _closed(location, "purged"), "purged closed")
        cutoff = time.time() + 0.001
        await wait_until(lambda: time.time() > cutoff, "the clock past the cutoff")
        await rt.ref(Ledger, "closed").start(start=LedgerInput(mode="close"))
        await wait_until(lambda: _closed(location, "closed"), "closed closed")
        purged = await rt.store.purge_closed("Ledger", cutoff, limit=10)
        assert purged.runs == 1  # "purged" only: "closed" closed after the cutoff
        await rt.ref(Ledger, "boom").start(start=LedgerInput(mode="boom"))
        await wait_until(lambda: bool(sql(location, "SELECT 1 FROM suspensions")),
                         "a run suspended")
        await wait_until(lambda: _stepped(rt), "the step recorded")
        SINK["down"] = True  # sends to it wait in the outbox, undelivered
        await rt.ref(Ledger, "relay").signal_with_start(Ledger.relay, Relay(sends=4),
                                                        start=LedgerInput())
        await wait_until(lambda: bool(sql(location, "SELECT 1 FROM outbox WHERE "
                                                    "delivered = ?", False)),
                         "a send waits in the outbox")
        await rt.schedules.create("tick", rt.ref(Ledger, "ticked"), Ledger.add,
                                  Add(tag="tick"), start=LedgerInput(),
                                  spec=corral.Interval(every=1), overlap=corral.Overlap.ALLOW)
        await wait_until(lambda: _ticked(rt, 1), "the schedule fired once")
        for release in ("r1", "r2"):
            await rt.store.declare_release("helpdesk", release, '{"app": "m:APP"}',
                                           declared_by="test")
    async with corral.open_runtime(location, entities=ENTITIES, shards=SHARDS,
                                   host=False) as rt:  # accepted, applied by nobody yet
        for key in IDLE:
            for n in (2, 3):
                await rt.ref(Ledger, key).signal(Ledger.add, Add(tag=f"{key}/{n}"),
                                                 message_id=f"{key}/{n}")
        await rt.ref(Ledger, "early").start(start=LedgerInput(mode="wait"))
        early = await rt.ref(Ledger, "early").deliver(Ledger.approval, Note(text="early"),
                                                      key="early")
        assert early.status == "buffered"  # run() has not reached its wait
        for n in range(4):
            await rt.ref(Capped, "capped").signal_with_start(
                Capped.add, Add(tag=str(n)), start=None, message_id=f"capped/{n}")
    # An operator discards the newest dead letter: its id is never given again.
    sql(location, "DELETE FROM dead_letters WHERE id = 3")
    life.applied = {key: [f"{key}/{n}" for n in (0, 1, 2, 3) if n != 1 or key == IDLE[0]]
                    for key in IDLE}
    return life


async def _ticked(rt: corral.Runtime, n: int) -> bool:
    """The schedule fired `n` ticks or more, and its entity applied each it fired."""
    fired = (await rt.schedules.describe("tick")).fired
    return fired >= n and len((await rt.ref(Ledger, "ticked").query(Ledger.state)).applied) >= n


def _closed(location: str, key: str) -> bool:
    return sql(location, "SELECT status FROM entities WHERE key = ?", key) not in (
        [], [("running",)])


async def _applied(rt: corral.Runtime, key: str, n: int) -> bool:
    return len((await rt.ref(Ledger, key).query(Ledger.state)).applied) >= n


async def _stepped(rt: corral.Runtime) -> bool:
    return (await rt.ref(Ledger, "step").query(Ledger.state)).stepped == 42


async def check_finishes(location: str, life: MidLife) -> None:
    """A host on the copy applies what was pending once, fires the timer at its time,
    answers an old message id duplicate, and delivers the wait."""
    SINK["down"] = False
    async with corral.open_runtime(location, entities=ENTITIES, shards=SHARDS) as rt:
        for key, tags in life.applied.items():
            await wait_until(lambda k=key, t=tags: _applied(rt, k, len(t)), f"{key} applied")
            assert (await rt.ref(Ledger, key).query(Ledger.state)).applied == tags
        ack = await rt.ref(Ledger, IDLE[1]).signal(Ledger.add, Add(tag=f"{IDLE[1]}/0"),
                                                   message_id=f"{IDLE[1]}/0")
        assert ack.status == "duplicate"
        won = await rt.ref(Ledger, "wait").deliver(Ledger.approval, Note(text="yes"),
                                                   key="click")
        assert won.status == "delivered"
        await wait_until(lambda: _delivered(rt), "the wait delivered")

        async def early() -> bool:
            return (await rt.ref(Ledger, "early").query(Ledger.state)).delivered == "early"

        await wait_until(early, "the buffered delivery met its wait")

        async def sunk() -> bool:
            return len(await rt.ref(Sink, "sink").query(Sink.seen)) >= 4

        await wait_until(sunk, "the outbox's sends arrived", timeout=90)
        assert await rt.ref(Sink, "sink").query(Sink.seen) == ["r0", "r1", "r2", "r3"]
        assert sql(location, "SELECT key FROM suspensions") == [("boom",)]

        async def fired() -> bool:
            return (await rt.ref(Ledger, "timer").query(Ledger.state)).fired_at is not None

        await wait_until(fired, "the timer fired", timeout=60)
        fired_at = (await rt.ref(Ledger, "timer").query(Ledger.state)).fired_at
        assert fired_at is not None
        assert fired_at >= life.due
        assert (await rt.ref(Ledger, "step").query(Ledger.state)).stepped == 42
        # The schedule goes on from the copy: each tick fired is applied once.
        before = (await rt.schedules.describe("tick")).fired
        await wait_until(lambda: _ticked(rt, before + 2), "the schedule fired on the copy")
        await rt.schedules.pause("tick")
        fired = (await rt.schedules.describe("tick")).fired
        await wait_until(lambda: _ticked(rt, fired), "every tick fired applied")
        assert len((await rt.ref(Ledger, "ticked").query(Ledger.state)).applied) == fired
        for key, tags in life.applied.items():  # nothing applied twice meanwhile
            assert (await rt.ref(Ledger, key).query(Ledger.state)).applied == tags


async def _delivered(rt: corral.Runtime) -> bool:
    return (await rt.ref(Ledger, "wait").query(Ledger.state)).delivered == "yes"


@pytest.mark.parametrize("direction", ["sqlite-to-postgres", "postgres-to-sqlite",
                                       "sqlite-to-sqlite"])
async def test_a_store_mid_life_moves_and_its_copy_finishes_every_pending_thing_once(
        tmp_path: Path, pg_url: str, direction: str) -> None:
    lite, other = str(tmp_path / "corral.db"), str(tmp_path / "copy.db")
    source, target = {"sqlite-to-postgres": (lite, pg_url), "postgres-to-sqlite": (
        pg_url, lite), "sqlite-to-sqlite": (lite, other)}[direction]
    life = await build_mid_life(source)
    seen: list[str] = []

    async def progress(table: str, done: int, total: int) -> None:
        seen.append(table)

    async def records(location: str) -> tuple[list[object], list[object]]:
        store = await corral.persistence.open_store(location, shards=SHARDS)
        try:
            return await store.builds(), await store.releases("helpdesk")
        finally:
            await store.close()

    before = await records(source)
    waiting = "SELECT count(*) FROM outbox WHERE delivered = ?"
    assert sql(source, waiting, False)[0][0] >= 1
    copied = await migrate(source, target, batch=3, progress=progress)
    assert await records(target) == before  # builds (one per type) and releases
    assert sql(target, waiting, False) == sql(source, waiting, False)
    assert len(before[0]) == len(ENTITIES) + 2  # and Tally's two
    assert len(before[1]) == 2
    assert copied.rows["journal"] > 3
    assert "journal" in seen
    checked = await verify(source, target)
    assert checked.equal, [t for t in checked.tables if not t.equal]
    assert {t.table for t in checked.tables} == {p.name for p in PLANS}
    assert sql(target, "SELECT count(*) FROM dead_letters") == [(2,)]
    for location in (source, target):  # the purged run is gone, the other closed one kept
        assert sql(location, "SELECT key FROM entities WHERE key IN (?, ?) ORDER BY key",
                   "closed", "purged") == [("closed",)]
    entries = "SELECT pos, etype, key, seq FROM journal ORDER BY pos"
    if direction == "sqlite-to-sqlite":  # the tail's positions, as they were
        assert sql(target, entries) == sql(source, entries)
    if direction == "sqlite-to-postgres":  # each shard's tick past its copied entries
        tops = sql(source, "SELECT shard, max(pos) FROM journal GROUP BY shard ORDER BY shard")
        ticks = sql(target, "SELECT shard, tick FROM shard_ticks WHERE tick > 0 ORDER BY shard")
        assert ticks == tops
    async with corral.open_runtime(target, entities=ENTITIES, shards=SHARDS,
                                   host=False) as rt:
        ack = await rt.ref(Capped, "capped").signal(Capped.add, Add(tag="late"))
        assert ack.dead_letter_id == 4  # past the source's last id, not its last row's
    await check_finishes(target, life)
    assert sql(target, "SELECT id FROM dead_letters ORDER BY id") == [(1,), (2,), (4,)]


def test_every_table_of_the_schema_is_copied_or_skipped_for_a_stated_reason() -> None:
    copied = {plan.name for plan in PLANS}
    for table in TABLES:
        assert (table.name in copied) != (table.name in SKIPPED), table.name
    assert set(SKIPPED) <= {t.name for t in TABLES}
    for plan in PLANS:  # every column of both engines is read and written
        table = next(t for t in TABLES if t.name == plan.name)
        for line in table.body.split(","):
            word = line.split()[0] if line.split() else ""
            if word and word not in ("PRIMARY", "UNIQUE", "sqlite:", "postgres:") \
                    and not word.endswith(")"):
                assert word in plan.columns or any(word in o for o in plan.only.values()), \
                    (plan.name, word)


async def test_a_host_opening_the_source_during_a_migration_is_refused(
        tmp_path: Path, pg_url: str) -> None:
    source = str(tmp_path / "corral.db")
    await build_mid_life(source)
    refusals: list[StoreHostedElsewhereError] = []

    async def try_host() -> None:
        if refusals:
            return
        with pytest.raises(StoreHostedElsewhereError) as caught:
            async with corral.open_runtime(source, entities=ENTITIES, shards=SHARDS):
                pass
        refusals.append(caught.value)

    await migrate(source, pg_url, batch=5, on_batch=try_host)
    assert refusals
    assert "copied" in str(refusals[0])
    assert refusals[0].cluster == "migration"
    assert sql(source, "SELECT count(*) FROM hosting") == [(0,)]  # released at the end
    async with corral.open_runtime(source, entities=ENTITIES, shards=SHARDS):
        pass  # and hosts open again


async def test_a_migration_is_refused_while_a_host_runs_on_the_source(
        tmp_path: Path, pg_url: str) -> None:
    source = str(tmp_path / "corral.db")
    async with corral.open_runtime(source, entities=[Ledger], shards=SHARDS):
        with pytest.raises(StoreHostedElsewhereError, match="close its hosts"):
            await migrate(source, pg_url)
    assert sql(pg_url, "SELECT count(*) FROM journal") == [(0,)]
    assert not _copying(pg_url)  # no copy begun: the same command runs again as it was
    assert sql(pg_url, "SELECT count(*) FROM hosting") == [(0,)]


async def test_a_non_empty_target_is_refused_and_nothing_written(
        tmp_path: Path, pg_url: str) -> None:
    source, other = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    await build_mid_life(source)
    async with corral.open_runtime(other, entities=[Ledger], shards=SHARDS) as rt:
        await rt.ref(Ledger, "x").start(start=LedgerInput())
    before = sql(other, "SELECT count(*) FROM journal UNION ALL SELECT count(*) FROM entities")
    with pytest.raises(InvalidArgumentError, match="not empty"):
        await migrate(source, other)
    after = sql(other, "SELECT count(*) FROM journal UNION ALL SELECT count(*) FROM entities")
    assert before == after
    assert sql(other, "SELECT count(*) FROM hosting") == [(0,)]
    assert sql(source, "SELECT count(*) FROM hosting") == [(0,)]


async def test_another_shard_count_is_refused_naming_both(tmp_path: Path, pg_url: str) -> None:
    source = str(tmp_path / "corral.db")
    await build_mid_life(source)
    await (await corral.persistence.open_store(pg_url, shards=5)).close()
    with pytest.raises(ShardCountError, match=f"{SHARDS} shards.*5 shards"):
        await migrate(source, pg_url)
    assert sql(pg_url, "SELECT count(*) FROM entities") == [(0,)]
    assert sql(source, "SELECT count(*) FROM hosting") == [(0,)]


async def test_a_source_of_a_newer_schema_is_refused(tmp_path: Path, pg_url: str) -> None:
    source = str(tmp_path / "corral.db")
    await build_mid_life(source)
    sql(source, "UPDATE meta SET v = '999' WHERE k = 'schema_version'")
    with pytest.raises(StoreError, match="newer corral"):
        await migrate(source, pg_url)
    assert sql(pg_url, "SELECT to_regclass('entities') IS NULL") == [(True,)]


async def test_a_migration_killed_mid_copy_resumes_to_the_same_digest(
        tmp_path: Path, pg_url: str) -> None:
    source = str(tmp_path / "corral.db")
    life = await build_mid_life(source)
    async with corral.open_runtime(source, entities=[Ledger], shards=SHARDS,
                                   host=False) as rt:  # enough rows for a "mid"
        for n in range(150):
            await rt.ref(Ledger, f"many-{n % 30}").signal_with_start(
                Ledger.add, Add(tag=str(n)), start=LedgerInput(), message_id=f"many/{n}")
    copy = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "corral", "migrate", "--from", source, "--to", pg_url,
        "--batch", "1", env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await wait_until(lambda: _copying(pg_url), "the copy committed a batch")
        await wait_until(lambda: _rows(pg_url, "journal") >= 20, "the copy is mid-journal")
    finally:
        copy.send_signal(signal.SIGKILL)
        await copy.wait()
    assert _copying(pg_url), "killed mid-copy"
    with pytest.raises(InvalidArgumentError, match="interrupted copy"):
        await migrate(source, pg_url)
    await migrate(source, pg_url, batch=7, resume=True)
    checked = await verify(source, pg_url)
    assert checked.equal, [t for t in checked.tables if not t.equal]
    assert sql(pg_url, "SELECT count(*) FROM meta WHERE k LIKE 'migrate.%'") == [(0,)]
    assert sql(pg_url, "SELECT count(*) FROM hosting") == [(0,)]  # the killed copy's too
    assert sql(source, "SELECT count(*) FROM hosting") == [(0,)]  # released, not lapsed
    await check_finishes(pg_url, life)


def _copying(url: str) -> bool:
    return bool(sql(url, "SELECT 1 FROM meta WHERE k = 'migrate.progress'")) \
        if sql(url, "SELECT to_regclass('meta') IS NOT NULL") == [(True,)] else False


def _rows(url: str, table: str) -> int:
    return int(sql(url, f"SELECT count(*) FROM {table}")[0][0])


async def test_a_store_no_host_ever_opened_verifies_equal_to_its_postgres_copy(
        tmp_path: Path, pg_url: str) -> None:
    source = str(tmp_path / "corral.db")
    await (await corral.persistence.open_store(source, shards=SHARDS)).close()
    await migrate(source, pg_url)  # PostgreSQL has a lease row per shard from the start
    assert (await verify(source, pg_url)).equal
    assert (await verify(pg_url, source)).equal


async def test_a_copy_that_fails_midway_frees_its_source_and_holds_its_target(
        tmp_path: Path, pg_url: str) -> None:
    source = str(tmp_path / "corral.db")
    life = await build_mid_life(source)

    async def fail() -> None:
        assert sql(source, "SELECT cluster FROM hosting") == [("migration",)]
        raise RuntimeError("the operator's terminal went away")

    with pytest.raises(RuntimeError, match="went away"):
        await migrate(source, pg_url, batch=2, on_batch=fail)
    assert sql(source, "SELECT count(*) FROM hosting") == [(0,)]
    with pytest.raises(StoreHostedElsewhereError, match="--resume"):  # half a store
        async with corral.open_runtime(pg_url, entities=ENTITIES, shards=SHARDS):
            pass
    with pytest.raises(InvalidArgumentError, match="interrupted copy, not a whole store"):
        await backup(pg_url, tmp_path / "half.backup")  # nor copied on
    assert not (tmp_path / "half.backup").exists()
    await migrate(source, pg_url, resume=True)
    assert sql(pg_url, "SELECT count(*) FROM hosting") == [(0,)]
    await check_finishes(pg_url, life)


@pytest.mark.parametrize("batch", [0, -1, 10**9, True, 2.5])
async def test_a_batch_size_out_of_range_is_refused_before_anything_is_made(
        tmp_path: Path, batch: object) -> None:
    source, target = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    await (await corral.persistence.open_store(source, shards=SHARDS)).close()
    with pytest.raises(InvalidArgumentError, match="rows per batch"):
        await migrate(source, target, batch=batch)  # type: ignore[arg-type]
    assert not (tmp_path / "b.db").exists()
    assert sql(source, "SELECT count(*) FROM hosting") == [(0,)]
