"""Snapshots bound an entity's journal and make recovery replay only the tail."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

import corral
from stores import sql


class Init(BaseModel):
    owner: str


class Ping(BaseModel):
    v: int


class Counter(corral.Entity):
    snapshots = corral.SnapshotPolicy(every=100, keep=2)
    handler_calls: ClassVar[int] = 0  # process-wide, outside snapshots: counts replays

    def __init__(self, init: Init) -> None:
        self.owner = init.owner
        self.seen: list[int] = []

    @corral.signal
    def ping(self, p: Ping) -> None:
        type(self).handler_calls += 1
        self.seen.append(p.v)

    @corral.query
    def values(self) -> list[int]:
        return self.seen


class Custom(corral.Entity):
    """Keeps only a digest in its snapshots, through `__getstate__`/`__setstate__` (the
    escape hatch: JSON data; the host keeps the mailbox itself)."""

    snapshots = corral.SnapshotPolicy(every=10, keep=1)
    restored_from_snapshot: ClassVar[int] = 0

    def __init__(self, init: Init) -> None:
        self.total = 0
        self.scratch: list[int] = []

    @corral.signal
    def ping(self, p: Ping) -> None:
        self.total += p.v
        self.scratch.append(p.v)

    @corral.query
    def state(self) -> dict[str, int]:
        return {"total": self.total, "scratch": len(self.scratch)}

    def __getstate__(self) -> dict[str, Any]:
        return {"total": self.total}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).restored_from_snapshot += 1
        self.total = state["total"]
        self.scratch = []


class Backlog(corral.Entity):
    """Snapshots every 5 applied signals; counts the snapshots it is captured for."""

    snapshots = corral.SnapshotPolicy(every=5, keep=2)
    captured: ClassVar[int] = 0

    def __init__(self, init: Init) -> None:
        self.seen: list[int] = []

    @corral.signal
    def ping(self, p: Ping) -> None:
        self.seen.append(p.v)

    @corral.query
    def values(self) -> list[int]:
        return self.seen

    def __getstate__(self) -> dict[str, Any]:
        type(self).captured += 1
        return super().__getstate__()  # type: ignore[no-any-return]


def _rows(db_path: str, table: str) -> int:
    return int(sql(db_path, f"SELECT count(*) FROM {table}")[0][0])


async def _send(rt: corral.Runtime, n: int, start: int = 0) -> None:
    """Send n signals, 50 at a time (concurrent sends share group commits)."""
    ref = rt.ref(Counter, "c-1")
    for base in range(start, start + n, 50):
        await asyncio.gather(*(
            ref.signal_with_start(Counter.ping, Ping(v=i), start=Init(owner="o"),
                                  message_id=f"m-{i}")
            for i in range(base, min(base + 50, start + n))
        ))


async def test_recovery_replays_only_the_journal_after_the_latest_snapshot(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Counter]) as rt:
        await _send(rt, 1050)
        assert sorted(await rt.ref(Counter, "c-1").query(Counter.values)) == list(range(1050))
    Counter.handler_calls = 0
    async with corral.open_runtime(db_path, entities=[Counter]) as rt:
        values = await rt.ref(Counter, "c-1").query(Counter.values)
        info = await rt.ref(Counter, "c-1").describe()
    assert sorted(values) == list(range(1050))
    assert info.applied_seq == 1050
    # The latest snapshot covers seq 1000: exactly the 50 entries after it are replayed.
    assert Counter.handler_calls == 50


async def test_recovery_of_a_backlog_writes_one_snapshot_at_its_end(db_path: str) -> None:
    """The replayed entries are durable already: snapshotting every 5 of them would only
    repeat work (quadratic for a backlog carried through continue-as-new runs)."""
    async with corral.open_runtime(db_path, entities=[Backlog], host=False) as rt:
        ref = rt.ref(Backlog, "b-1")
        await asyncio.gather(*(ref.signal_with_start(Backlog.ping, Ping(v=i),
                                                     start=Init(owner="o"))
                               for i in range(200)))
    Backlog.captured = 0
    async with corral.open_runtime(db_path, entities=[Backlog]) as rt:
        assert sorted(await rt.ref(Backlog, "b-1").query(Backlog.values)) == list(range(200))
        assert Backlog.captured == 1
        assert sql(db_path, "SELECT max(applied_seq) FROM snapshots") == [(200,)]
        for v in range(200, 205):  # live signals snapshot by the policy again
            await rt.ref(Backlog, "b-1").signal(Backlog.ping, Ping(v=v))
        assert len(await rt.ref(Backlog, "b-1").query(Backlog.values)) == 205
        assert Backlog.captured == 2


async def test_journal_and_snapshot_rows_stay_bounded_by_the_policy(db_path: str) -> None:
    policy = Counter.snapshots
    assert policy.every is not None
    async with corral.open_runtime(db_path, entities=[Counter]) as rt:
        for chunk in range(5):
            await _send(rt, 1000, start=chunk * 1000)
            # Kept snapshots cover all but the last `every * keep` entries.
            assert _rows(db_path, "journal") <= policy.every * policy.keep
            assert _rows(db_path, "snapshots") <= policy.keep
        assert len(await rt.ref(Counter, "c-1").query(Counter.values)) == 5000


async def test_a_message_id_seen_before_truncation_is_still_a_duplicate(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Counter]) as rt:
        await _send(rt, 500)
        gone = sql(db_path, "SELECT count(*) FROM journal WHERE message_id='m-3'")
        assert gone == [(0,)]  # truncated away
        ack = await rt.ref(Counter, "c-1").signal(Counter.ping, Ping(v=3), message_id="m-3")
        assert ack.status == "duplicate"
        with pytest.raises(corral.IdempotencyConflictError):
            await rt.ref(Counter, "c-1").signal(Counter.ping, Ping(v=99), message_id="m-3")
        assert len(await rt.ref(Counter, "c-1").query(Counter.values)) == 500


async def test_getstate_and_setstate_customise_snapshots(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Custom]) as rt:
        ref = rt.ref(Custom, "x")
        for i in range(25):
            await ref.signal_with_start(Custom.ping, Ping(v=i), start=Init(owner="o"))
        assert await ref.query(Custom.state) == {"total": 300, "scratch": 25}
    Custom.restored_from_snapshot = 0
    async with corral.open_runtime(db_path, entities=[Custom]) as rt:
        state = await rt.ref(Custom, "x").query(Custom.state)
    assert Custom.restored_from_snapshot == 1
    # Snapshot at seq 20 kept the total only; entries 21..25 were replayed on top.
    assert state == {"total": 300, "scratch": 5}


async def test_a_snapshot_that_does_not_restore_is_an_error_naming_the_entity(
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Counter]) as rt:
        await _send(rt, 150)
    sql(db_path, "UPDATE snapshots SET state=?", b"\x00\x01\x02\x03")
    async with corral.open_runtime(db_path, entities=[Counter]) as rt:
        with pytest.raises(corral.SnapshotRestoreError, match=r"Counter 'c-1'.*seq 100"):
            await rt.ref(Counter, "c-1").query(Counter.values)
