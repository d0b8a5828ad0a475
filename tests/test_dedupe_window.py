"""The dedupe window is configurable by count and age, and forgets only applied ids."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

import corral
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
