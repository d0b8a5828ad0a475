"""Retention (`Entity.retention`): the hosts purge closed runs older than
`closed_for` in the background, with all their rows; open and recent ones stay, and a
signal to a purged key starts a new run as for a key never seen. The store op itself
(both engines, every table, batches, fencing) is in the store contract suite."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import pytest
from pydantic import BaseModel

import corral
from entities import Inbox, Note
from procs import wait_until
from stores import sql

N = 10


class Brief(Inbox):
    """`Inbox`, its closed runs kept 0.2 s."""

    retention = corral.Retention(closed_for=0.2, batch=3)  # several rounds for N


class Kept(Inbox):
    """`Inbox` without retention: its closed runs stay."""


def _rows(db_path: str, etype: str) -> int:
    return sum(sql(db_path, f"SELECT count(*) FROM {table} WHERE etype = ?", etype)[0][0]
               for table in ("entities", "runs", "journal", "dedupe"))


async def test_hosts_purge_closed_runs_past_retention_and_a_purged_key_starts_afresh(
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Brief, Kept]) as rt:
        for etype in (Brief, Kept):
            for i in range(N):
                ref = rt.ref(etype, f"k{i}")
                await ref.signal_with_start(etype.note, Note(text="stop"), start=None,
                                            message_id="m")
                await ref.result(timeout=30)
        open_ref = rt.ref(Brief, "open")
        await open_ref.signal_with_start(Brief.note, Note(text="hello"), start=None)
        kept = _rows(db_path, "Kept")

        await wait_until(lambda: _rows(db_path, "Brief") == _rows_of_open(db_path),
                         "every closed Brief purged")
        assert _rows(db_path, "Kept") == kept  # no retention: kept
        assert (await open_ref.describe()).status is corral.RunStatus.RUNNING

        ref = rt.ref(Brief, "k0")
        ack = await ref.signal_with_start(Brief.note, Note(text="stop"), start=None,
                                          message_id="m")  # the purged run's id
        assert (ack.status, ack.run_id, ack.seq, ack.started) == ("accepted", 1, 1, True)
        assert (await ref.result(timeout=30)).texts == ["stop"]


def _rows_of_open(db_path: str) -> int:
    """The rows of Brief "open" (running: never purged)."""
    return sum(sql(db_path, f"SELECT count(*) FROM {table} WHERE etype = 'Brief' "
                   "AND key = 'open'")[0][0] for table in ("entities", "runs", "journal",
                                                           "dedupe"))


def test_retention_is_declared_with_closed_for_in_seconds() -> None:
    with pytest.raises(ValueError, match="closed_for"):
        corral.Retention(closed_for=0)
    with pytest.raises(ValueError, match="batch"):
        corral.Retention(closed_for=1, batch=0)
    with pytest.raises(corral.EntityDefinitionError, match="retention must be"):
        type("Bad", (Inbox,), {"retention": 3600})


class Item(BaseModel):
    n: int


class Count(BaseModel):
    sends: int


class Held(corral.Entity):
    """Applies nothing while its gate is shut, so its backlog stays at `max_backlog`."""

    max_backlog = 2
    gate: ClassVar[asyncio.Event | None] = None

    def __init__(self) -> None:
        self.got: list[int] = []

    @corral.signal
    async def take(self, item: Item) -> None:
        if Held.gate is not None:
            await Held.gate.wait()
        self.got.append(item.n)

    @corral.query
    def seen(self) -> list[int]:
        return self.got


class Sender(corral.Entity):
    """Sends `sends` items to Held "h" and completes: its sends are written with its
    close. Its closed runs are kept 0.2 s."""

    retention = corral.Retention(closed_for=0.2)

    def __init__(self, init: Count) -> None:
        self.sends = init.sends

    async def run(self) -> None:
        for n in range(1, self.sends + 1):
            self.send(Held, "h", Held.take, Item(n=n), start=None)


def _sender_rows(db_path: str, key: str) -> int:
    return sum(sql(db_path, f"SELECT count(*) FROM {table} WHERE etype = 'Sender' "
                            "AND key = ?", key)[0][0] for table in ("runs", "outbox"))


async def test_a_closed_run_with_sends_its_host_still_holds_is_purged_only_after_they_arrive(
        db_path: str) -> None:
    Held.gate = asyncio.Event()
    try:
        async with corral.open_runtime(db_path, entities=[Sender, Held]) as rt:
            held, sends = rt.ref(Sender, "held"), 6
            await held.start(start=Count(sends=sends))
            await held.result(timeout=30)  # closed with sends the full target holds back
            quiet = rt.ref(Sender, "quiet")
            await quiet.start(start=Count(sends=0))
            await quiet.result(timeout=30)
            await wait_until(lambda: _sender_rows(db_path, "quiet") == 0,
                             "a retention round purges the run that sent nothing")
            # the run whose sends wait for room is kept, with its undelivered sends
            assert sql(db_path, "SELECT count(*) FROM outbox WHERE etype = 'Sender' AND "
                       "key = 'held' AND NOT delivered")[0][0] > 0
            Held.gate.set()
            target = rt.ref(Held, "h")
            await wait_until(lambda: _seen(target, sends), "every send arrives")
            assert await target.query(Held.seen) == list(range(1, sends + 1))
            await wait_until(lambda: _sender_rows(db_path, "held") == 0,
                             "once delivered, the closed run is purged")
    finally:
        Held.gate = None


async def _seen(ref: corral.EntityRef[Held], n: int) -> bool:
    return len(await ref.query(Held.seen)) >= n
