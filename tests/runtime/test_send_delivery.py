"""How a sender's host delivers the sends its entities wrote (`_outbox.Postman`): many
in one transaction, in order; a target that refuses one for good (not running, closed)
gets the rest and the refused one is kept with its reason; a target over its
`max_backlog` is not refused for good: the sends from it on wait and go when it has
room, so an entity's sends obey the target's bound and none is lost. On both stores."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from pydantic import BaseModel

import corral
from procs import wait_until
from stores import sql

SENDS = 12
BOUND = 3


class Item(BaseModel):
    n: int


class Empty(BaseModel):
    pass


class Sink(corral.Entity):
    """Applies nothing while its gate is shut, so its backlog grows to the bound."""

    max_backlog = BOUND
    gate: ClassVar[asyncio.Event | None] = None

    def __init__(self, init: Empty) -> None:
        self.got: list[int] = []

    @corral.signal
    async def take(self, item: Item) -> None:
        if Sink.gate is not None:
            await Sink.gate.wait()
        self.got.append(item.n)

    @corral.query
    def seen(self) -> list[int]:
        return self.got


class Plan(BaseModel):
    to: list[str]  # a target key per send; "!" before it: a plain signal (no start)


class Fan(corral.Entity):
    def __init__(self, init: Empty) -> None:
        self.sent = 0

    @corral.signal
    def fan(self, plan: Plan) -> None:
        for target in plan.to:
            self.sent += 1
            if target.startswith("!"):
                self.send(Sink, target[1:], Sink.take, Item(n=self.sent))
            else:
                self.send(Sink, target, Sink.take, Item(n=self.sent), start=Empty())


def _journal(db_path: str, key: str) -> list[str]:
    return [r[0] for r in sql(db_path, "SELECT message_id FROM journal WHERE etype = 'Sink' "
                                       "AND key = ? ORDER BY seq", key)]


def _outbox(db_path: str) -> list[tuple[int, bool, str | None]]:
    return [(int(r[0]), bool(r[1]), r[2]) for r in sql(
        db_path, "SELECT seq, delivered, error FROM outbox ORDER BY seq")]


async def _seen(rt: corral.Runtime, key: str) -> list[int]:
    try:
        return await rt.ref(Sink, key).query(Sink.seen)
    except corral.EntityNotRunningError:
        return []


async def test_a_target_over_its_backlog_gets_the_sends_later_in_order_none_lost(
        db_path: str) -> None:
    Sink.gate = asyncio.Event()
    try:
        async with corral.open_runtime(db_path, entities=[Fan, Sink]) as rt:
            await rt.ref(Fan, "f-1").signal_with_start(Fan.fan, Plan(to=["s-1"] * SENDS),
                                                       start=Empty())
            await wait_until(lambda: len(_journal(db_path, "s-1")) >= BOUND,
                             "the sink's backlog fills up to its bound")
            await asyncio.sleep(0.5)  # the host tries again meanwhile, every 50 ms
            assert len(_journal(db_path, "s-1")) == BOUND  # never past the bound
            pending = _outbox(db_path)
            assert all(error is None for _, _, error in pending), pending  # none refused
            Sink.gate.set()
            await wait_until(lambda: _has(rt, "s-1", SENDS), "every send arrives")
            assert await _seen(rt, "s-1") == list(range(1, SENDS + 1))
        assert _journal(db_path, "s-1") == [f"send:Fan/f-1/1/1.{i}"
                                            for i in range(1, SENDS + 1)]
        assert _outbox(db_path) == [(SENDS, True, None)]  # each delivered once
    finally:
        Sink.gate = None


async def test_a_send_refused_for_good_is_kept_with_its_reason_and_the_rest_arrive(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Fan, Sink]) as rt:
        # one handler call, one batch: a, then a plain signal to a key that is not
        # running (refused), then a again and b
        await rt.ref(Fan, "f-2").signal_with_start(
            Fan.fan, Plan(to=["a", "!nobody", "a", "b"]), start=Empty())
        await wait_until(lambda: _has(rt, "b", 1), "the sends after the refused one")
        assert await _seen(rt, "a") == [1, 3]
        assert await _seen(rt, "b") == [4]
    outbox = _outbox(db_path)
    assert [(seq, delivered) for seq, delivered, _ in outbox] == [(2, True), (4, True)]
    assert str(outbox[0][2]).startswith("EntityNotRunningError")
    assert _journal(db_path, "nobody") == []


async def _has(rt: corral.Runtime, key: str, n: int) -> bool:
    return len(await _seen(rt, key)) >= n
