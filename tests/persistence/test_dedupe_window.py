"""The dedupe window is configurable by count and age, and forgets only applied ids."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import pytest
from pydantic import BaseModel

import corral
from corral.persistence._sqlite_txn import SWEEP_DEDUPE
from stores import sql


class Note(BaseModel):
    n: int


class Windowed(corral.Entity):
    snapshots = corral.SnapshotPolicy(every=10, keep=1)
    dedupe_window = corral.DedupeWindow(max_count=50, max_age=None)

    def __init__(self) -> None:
        self.notes: list[int] = []

    @corral.signal
    def note(self, n: Note) -> None:
        self.notes.append(n.n)

    @corral.query
    def all(self) -> list[int]:
        return self.notes


class Aged(Windowed):
    name = "Aged"
    dedupe_window = corral.DedupeWindow(max_count=None, max_age=0.2)


async def _send(ref: corral.EntityRef[Windowed], ids: range) -> list[corral.Ack]:
    return list(await asyncio.gather(*(
        ref.signal_with_start(Windowed.note, Note(n=i), start=None, message_id=f"id-{i}")
        for i in ids
    )))


def _remembered(db_path: str, etype: str) -> int:
    return int(sql(db_path, "SELECT count(*) FROM dedupe WHERE etype=?", etype)[0][0])


async def test_ids_beyond_the_count_window_are_forgotten_and_recent_ones_still_dedupe(
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Windowed]) as rt:
        ref = rt.ref(Windowed, "w")
        await _send(ref, range(200))
        assert await ref.query(Windowed.all) is not None
        # Snapshots every 10 keep the window at <= 50 (+ the entries since the last one).
        assert _remembered(db_path, "Windowed") <= 50 + 10
        recent = await ref.signal(Windowed.note, Note(n=195), message_id="id-195")
        assert recent.status == "duplicate"
        with pytest.raises(corral.IdempotencyConflictError):
            await ref.signal(Windowed.note, Note(n=-1), message_id="id-190")
        forgotten = await ref.signal(Windowed.note, Note(n=3), message_id="id-3")
        assert forgotten.status == "accepted"  # outside the window: a new message
        assert sorted(await ref.query(Windowed.all)) == sorted([*range(200), 3])


async def test_ids_older_than_the_age_window_are_forgotten_at_the_next_snapshot(
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Aged]) as rt:
        ref = rt.ref(Aged, "a")
        await _send(ref, range(5))
        await asyncio.sleep(0.3)  # let the first ids age past max_age (the window's unit)
        await _send(ref, range(100, 120))  # two snapshots: the old ids are now too old
        assert (await ref.signal(Aged.note, Note(n=1), message_id="id-1")).status == "accepted"
        assert (await ref.signal(Aged.note, Note(n=119), message_id="id-119")).status \
            == "duplicate"


async def test_an_id_from_a_fast_clock_is_never_forgotten_while_it_is_young(
    db_path: str,
) -> None:
    """An id stamped by a fast clock is young: the age sweep keeps it while it forgets
    the old ids before it. (The sweep stops at the first id it keeps, in seq order, so
    the old ids after it are forgotten on a later sweep: kept longer, never too early.)"""
    async with corral.open_runtime(db_path, entities=[Aged]) as rt:
        ref = rt.ref(Aged, "a")
        await _send(ref, range(5))
        sql(db_path, "UPDATE dedupe SET accepted_at = accepted_at + 3600 "
            "WHERE etype = ? AND message_id = ?", "Aged", "id-2")
        await asyncio.sleep(0.3)  # all but id-2 are older than max_age now
        await _send(ref, range(100, 120))  # two snapshots, two sweeps

        async def status(n: int) -> str:
            return (await ref.signal(Aged.note, Note(n=n), message_id=f"id-{n}")).status

        assert [await status(n) for n in (0, 1)] == ["accepted", "accepted"]
        assert await status(2) == "duplicate"


def test_the_dedupe_sweep_reads_only_what_it_forgets(tmp_path: Path) -> None:
    """On SQLite a sweep's work grows with the ids it forgets, never with the window it
    keeps: it runs at every snapshot (every `SnapshotPolicy.every` messages), and an
    entity's window holds up to 100,000 ids by default. Counted in SQLite VM steps (the
    progress handler), so the test measures work, not time. It read every applied id of
    the window when its bound was two conditions (`seq <= ?5 AND seq < ...`): 770,000
    steps at 70,000 ids."""
    path = str(tmp_path / "sweep.db")

    async def create() -> None:
        async with corral.open_runtime(path, entities=[Windowed]):
            pass

    asyncio.run(create())

    def steps(window: int, forget: int) -> int:
        """VM steps of one sweep over `window` applied ids, of which the oldest `forget`
        are past the count bound (and every id is too young for the age bound)."""
        with contextlib.closing(sqlite3.connect(path)) as db:
            db.execute("DELETE FROM dedupe")
            db.executemany(
                "INSERT INTO dedupe (etype, key, message_id, seq, run_id, payload_hash, "
                "accepted_at) VALUES ('Windowed', 'w', ?, ?, 1, x'00', 1e9)",
                ((f"id-{seq:08d}", seq) for seq in range(1, window + 1)))
            db.commit()
            count = [0]

            def step() -> int:
                count[0] += 1
                return 0

            db.set_progress_handler(step, 1)
            db.execute(SWEEP_DEDUPE, ("Windowed", "w", forget, 0.0, window))
            db.set_progress_handler(None, 1)
            left = db.execute("SELECT min(seq), count(*) FROM dedupe").fetchone()
            db.commit()
        assert left == (forget + 1, window - forget)  # forgot exactly the oldest `forget`
        return count[0]

    assert steps(20_000, 0) == steps(1_000, 0) < 200  # nothing to forget: no scan
    assert steps(20_000, 500) < 2 * steps(1_000, 500)  # the forgotten ids, not the window

    with contextlib.closing(sqlite3.connect(path)) as db:
        lookup = [row[-1] for row in db.execute(
            "EXPLAIN QUERY PLAN SELECT seq FROM dedupe WHERE etype=? AND key=? "
            "AND message_id=?", ("Windowed", "w", "id-1"))]
    # A message id is still looked up by the primary key (PostgreSQL's planner picked
    # a full seq index for it, scanning the entity's window per id: see `_pg_schema`).
    assert len(lookup) == 1, lookup
    assert "USING PRIMARY KEY (etype=? AND key=? AND message_id=?)" in lookup[0], lookup


async def test_an_id_said_fresh_that_the_store_holds_is_refused_alone(db_path: str) -> None:
    """A runtime-made id skips the dedupe lookup (`Acceptance.fresh_id`); should one ever
    repeat, the dedupe table's primary key refuses it: a store error for that caller,
    nothing written twice, and the rest of its group commit accepted."""
    from corral import StoreError
    from corral.persistence import Acceptance, EntryKind, payload_hash

    async with corral.open_runtime(db_path, entities=[Windowed]) as rt:
        ref = rt.ref(Windowed, "fresh")
        store = rt.store

        def acc(mid: str, n: int, *, fresh: bool) -> Acceptance:
            text = f'{{"n":{n}}}'
            return Acceptance("Windowed", ref.key, ref.shard, EntryKind.SIGNAL, "note", mid,
                              text, payload_hash("note", text), None, "null",
                              Windowed._corral_definition.id_reuse, 1000.0, fresh)

        first = await store.accept(acc("m-1", 1, fresh=True))
        assert (first.duplicate, first.entry.seq) == (False, 1)
        repeat, other = await asyncio.gather(  # one batch: the repeat and a good one
            store.accept(acc("m-1", 1, fresh=True)), store.accept(acc("m-2", 2, fresh=True)),
            return_exceptions=True)
        assert isinstance(repeat, StoreError), repeat
        assert not isinstance(other, BaseException)
        assert other.entry.seq == 2
        again = await store.accept(acc("m-1", 1, fresh=False))  # looked up: a duplicate
        assert (again.duplicate, again.entry.seq) == (True, 1)
    assert sql(db_path, "SELECT message_id, seq FROM journal WHERE key='fresh' ORDER BY seq") \
        == [("m-1", 1), ("m-2", 2)]

