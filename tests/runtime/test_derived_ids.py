"""Identifiers corral derives cannot be forged (guarantee 18), on both stores.

The message id of an entity's send (`send:<type>/<key>/<run>/<n>`, a handler's
`.../<entry>.<n>`) and of a dead letter's replay (`replay:<id>:<original id>`) begin
with prefixes the client boundary refuses in a caller's id, at every entry that takes
one: a caller who took such an id first would make the real send or replay an
`IdempotencyConflictError`, lost for good. Corral's own paths (the outbox's delivery,
the replay) still use them. Two different sends, replays or steps never share an id.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar
from urllib.parse import unquote

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel

import corral
from corral.persistence import DERIVED_ID_PREFIXES, handler_send_id, send_message_id
from corral.persistence._ops_dead_letters import replay_message_id
from corral.runtime.host._steps import step_key_of
from procs import wait_until
from stores import row_counts, sql


class Empty(BaseModel):
    pass


class Item(BaseModel):
    n: int


class Inbox(corral.Entity):
    """Takes items; raises for those in `broken` (dead-lettered after one attempt)."""

    retry = corral.RetryPolicy(max_attempts=1)
    broken: ClassVar[set[int]] = set()

    def __init__(self, init: Empty) -> None:
        self.got: list[int] = []

    @corral.signal
    def take(self, item: Item) -> None:
        if item.n in type(self).broken:
            raise ValueError(f"cannot take {item.n}")
        self.got.append(item.n)

    @corral.update
    def ask(self, item: Item) -> int:
        return item.n

    @corral.query
    def seen(self) -> list[int]:
        return self.got


class Named(BaseModel):
    step: str


def own_key() -> str:
    return corral.step_key()


class Stepper(corral.Entity):
    """Makes one step, named by its start input, that answers its own step key."""

    def __init__(self, init: Named) -> None:
        self.step_name = init.step

    async def run(self) -> str:
        key: str = await self.step(own_key, name=self.step_name)
        return key


class Courier(corral.Entity):
    """Sends item 1 from `run()` once told to go; `relay` sends item 2 from a handler."""

    def __init__(self, init: Empty) -> None:
        self.go = False

    @corral.signal
    def start_sending(self) -> None:
        self.go = True

    @corral.signal
    def relay(self) -> None:
        self.send(Inbox, "in-1", Inbox.take, Item(n=2), start=Empty())

    async def run(self) -> None:
        await self.wait_for(lambda: self.go)
        self.send(Inbox, "in-1", Inbox.take, Item(n=1), start=Empty())
        await self.wait_for(lambda: False)


@pytest.fixture(autouse=True)
def _reset() -> None:
    Inbox.broken = set()


Forge = Callable[[corral.Runtime, str], Awaitable[Any]]


def _inbox(rt: corral.Runtime) -> corral.EntityRef[Inbox]:
    return rt.ref(Inbox, "in-1")


FORGERIES: dict[str, Forge] = {
    "signal": lambda rt, mid: _inbox(rt).signal(Inbox.take, Item(n=9), message_id=mid),
    "signal_with_start": lambda rt, mid: _inbox(rt).signal_with_start(
        Inbox.take, Item(n=9), start=Empty(), message_id=mid),
    "update": lambda rt, mid: _inbox(rt).update(Inbox.ask, Item(n=9), update_id=mid),
    "update_with_start": lambda rt, mid: _inbox(rt).update_with_start(
        Inbox.ask, Item(n=9), start=Empty(), update_id=mid),
    "start": lambda rt, mid: _inbox(rt).start(start=Empty(), start_id=mid),
    "terminate": lambda rt, mid: _inbox(rt).terminate("x", message_id=mid),
    "resume": lambda rt, mid: _inbox(rt).resume(message_id=mid),
}


def _journal(db_path: str) -> list[tuple[int, str]]:
    return [(int(r[0]), r[1]) for r in sql(
        db_path, "SELECT seq, message_id FROM journal WHERE etype = 'Inbox' ORDER BY seq")]


async def _seen(rt: corral.Runtime, n: int) -> bool:
    try:
        return len(await _inbox(rt).query(Inbox.seen)) >= n
    except corral.EntityNotRunningError:
        return False


async def test_a_send_id_forged_at_any_entry_is_refused_and_the_real_sends_arrive(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Courier, Inbox]) as rt:
        courier = rt.ref(Courier, "c-1")
        await courier.start(start=Empty())
        run_send = send_message_id("Courier", "c-1", 1, 1)
        handler_send = handler_send_id("Courier", "c-1", 1, 3, 1)  # entry 3: `relay`
        before = row_counts(db_path)
        for forged in (run_send, handler_send):
            for entry, forge in FORGERIES.items():
                with pytest.raises(corral.InvalidKeyError, match="send:") as err:
                    await forge(rt, forged)
                assert err.value.message_id == forged, entry
            with pytest.raises(corral.BatchRefusedError) as refused:
                await rt.signal_many([
                    corral.SignalItem(_inbox(rt), Inbox.take, Item(n=8), message_id="fine",
                                      start=Empty()),
                    corral.SignalItem(_inbox(rt), Inbox.take, Item(n=9), message_id=forged,
                                      start=Empty())])
            assert refused.value.index == 1
            assert isinstance(refused.value.error, corral.InvalidKeyError)
        assert row_counts(db_path) == before  # nothing stored

        await courier.signal(Courier.start_sending)
        await wait_until(lambda: _seen(rt, 1), "run()'s send arrives")
        await courier.signal(Courier.relay)
        await wait_until(lambda: _seen(rt, 2), "the handler's send arrives")
        assert await _inbox(rt).query(Inbox.seen) == [1, 2]
    assert _journal(db_path) == [(1, run_send), (2, handler_send)]


async def test_a_replay_id_forged_is_refused_and_the_operators_replay_succeeds(
        db_path: str) -> None:
    Inbox.broken = {1}
    async with corral.open_runtime(db_path, entities=[Inbox]) as rt:
        inbox = _inbox(rt)
        await inbox.signal_with_start(Inbox.take, Item(n=1), start=Empty(), message_id="m-1")
        await wait_until(lambda: _has_dead_letter(inbox), "item 1 is dead-lettered")
        [dead] = await inbox.dead_letters()
        forged = replay_message_id(dead.id, "m-1")
        before = row_counts(db_path)
        for entry, forge in FORGERIES.items():
            with pytest.raises(corral.InvalidKeyError, match="replay:"):
                await forge(rt, forged)
            assert row_counts(db_path) == before, entry

        Inbox.broken = set()
        assert (await inbox.replay_dead_letter(dead.id)).status == "accepted"
        assert await inbox.query(Inbox.seen) == [1]
    assert _journal(db_path)[-1] == (2, forged)


async def _has_dead_letter(ref: corral.EntityRef[Inbox]) -> bool:
    return len(await ref.dead_letters()) == 1


async def test_an_id_that_only_looks_alike_is_still_a_callers_id(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Inbox]) as rt:
        for mid in ("sender:1", "Send:x", "x-send:1", "replayed:1"):
            ack = await _inbox(rt).signal_with_start(Inbox.take, Item(n=1), start=Empty(),
                                                     message_id=mid)
            assert ack.status == "accepted", mid


def test_every_id_corral_derives_begins_with_a_reserved_prefix() -> None:
    for derived in (send_message_id("T", "k", 1, 2), handler_send_id("T", "k", 1, 2, 3),
                    replay_message_id(4, "m")):
        assert derived.startswith(DERIVED_ID_PREFIXES), derived


_KEYS = st.text(st.sampled_from("ab/.:%1"), min_size=1, max_size=6)
_TYPES = st.sampled_from(["A", "Ab", "A_b"])
_NUMBERS = st.integers(1, 12)


@given(st.tuples(_TYPES, _KEYS, _NUMBERS, _NUMBERS, st.none() | _NUMBERS),
       st.tuples(_TYPES, _KEYS, _NUMBERS, _NUMBERS, st.none() | _NUMBERS))
def test_two_different_sends_never_share_a_message_id(
        one: tuple[str, str, int, int, int | None],
        other: tuple[str, str, int, int, int | None]) -> None:
    def derived(t: str, key: str, run: int, n: int, index: int | None) -> str:
        return send_message_id(t, key, run, n) if index is None \
            else handler_send_id(t, key, run, n, index)
    if one != other:
        assert derived(*one) != derived(*other)


async def test_steps_of_two_entities_never_share_a_step_key_though_their_parts_join_alike(
        db_path: str) -> None:
    percent = corral.Limits(key_pattern=r"[A-Za-z0-9%/]+")  # "%" is not in the default's
    async with corral.open_runtime(db_path, entities=[Stepper], limits=percent) as rt:
        for key, step in (("a/1", "x"), ("a", "1/x"), ("b%2F", "y"), ("b/", "y")):
            await rt.ref(Stepper, key).start(start=Named(step=step))
        keys = [await rt.ref(Stepper, key).result(timeout=30)
                for key in ("a/1", "a", "b%2F", "b/")]
    assert keys == ["Stepper/a%2F1/1/x", "Stepper/a/1/1%2Fx", "Stepper/b%252F/1/y",
                    "Stepper/b%2F/1/y"]


def test_a_step_key_without_a_slash_or_a_percent_reads_as_before() -> None:
    assert step_key_of("RayAgent", "r-1", 1, "model:7") == "RayAgent/r-1/1/model:7"


# Few characters and runs, so that parts which join alike come up often.
_PARTS = st.text(st.sampled_from("a1/%2F"), min_size=1, max_size=6)
_STEP = st.tuples(st.sampled_from(["A", "Ab"]), _PARTS, st.integers(1, 2), _PARTS)


@example(("Stepper", "a/1", 1, "x"), ("Stepper", "a", 1, "1/x"))
@given(_STEP, _STEP)
def test_two_different_steps_never_share_a_step_key(
        one: tuple[str, str, int, str], other: tuple[str, str, int, str]) -> None:
    if one != other:
        assert step_key_of(*one) != step_key_of(*other)


@given(_STEP)
def test_a_step_key_gives_back_its_type_key_run_and_name(step: tuple[str, str, int, str]) -> None:
    """Each step key is read back into the parts it was made of, so no two steps share
    one (the random search rarely makes two colliding steps; this finds any `/` kept)."""
    parts = step_key_of(*step).split("/")
    assert len(parts) == 4
    etype, key, run, name = (unquote(p) for p in parts)
    assert (etype, key, int(run), name) == step
