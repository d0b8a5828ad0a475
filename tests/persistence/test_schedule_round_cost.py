"""A host's schedule round is cheap when nothing is due: its read of due schedules seeks
`schedules_due (shard, due_at)` per shard, so its work does not grow with the schedules
that are not due (counted in SQLite VM steps, which the machine's load cannot change)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from corral.persistence import open_sqlite_store
from corral.persistence._ops_schedules import due_schedules
from stores import vm_steps

SHARDS = 16
NOW = 1_800_000_000.0


async def _built(location: str, schedules: int) -> None:
    store = await open_sqlite_store(location, shards=SHARDS)
    await store.close()
    db = sqlite3.connect(location)
    with db:
        db.executemany(
            "INSERT INTO schedules (id, shard, target_type, target_key, definition, next_tick, "
            "due_at, buffered, fired, skipped, last_tick, last_run, last_seq, outcomes, version, "
            "created_at, updated_at) VALUES (?, ?, 'T', ?, '{}', ?, ?, NULL, 0, 0, NULL, "
            "NULL, NULL, '[]', 1, 0, 0)",
            [(f"s-{i}", i % SHARDS, f"k-{i}", int(NOW) + 60 + i,
              None if i % 10 == 0 else NOW + 60 + i)  # a tenth paused
             for i in range(schedules)])
    db.close()


async def test_a_round_with_nothing_due_does_the_same_work_at_a_hundred_times_the_schedules(
        tmp_path: Path) -> None:
    work = []
    for schedules in (200, 20_000):
        location = str(tmp_path / f"{schedules}.db")
        await _built(location, schedules)
        steps, due = vm_steps(location, lambda q: due_schedules(
            q, frozenset(range(SHARDS)), NOW, 1000))
        assert due == []
        work.append(steps)
    assert work[1] <= 1.2 * work[0], work
