"""Every read of what the store holds goes through the `authorize` hook (kind "read"),
as queries and writes do: an application that refuses a caller's queries does not hand
that caller the state, history or dead letters instead. On both stores."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel

import corral
from procs import wait_until


class Empty(BaseModel):
    pass


class Item(BaseModel):
    n: int


class Vault(corral.Entity):
    """Takes items; item 0 raises (a dead letter); `run()` returns once it holds 2."""

    retry = corral.RetryPolicy(max_attempts=1)

    def __init__(self, init: Empty) -> None:
        self.items: list[int] = []

    @corral.signal
    def put(self, item: Item) -> None:
        if item.n == 0:
            raise ValueError("no zero")
        self.items.append(item.n)

    async def run(self) -> list[int]:
        await self.wait_for(lambda: len(self.items) >= 2)
        return self.items


Read = Callable[[corral.Runtime, str | None], Awaitable[Any]]

READS: dict[tuple[str, str], Read] = {
    ("describe", "v-1"): lambda rt, who: rt.ref(Vault, "v-1").describe(sender=who),
    ("history", "v-1"): lambda rt, who: rt.ref(Vault, "v-1").history(sender=who),
    ("state", "v-1"): lambda rt, who: rt.ref(Vault, "v-1").state(sender=who),
    ("dead_letters", "v-1"): lambda rt, who: rt.ref(Vault, "v-1").dead_letters(sender=who),
    ("result", "v-1"): lambda rt, who: rt.ref(Vault, "v-1").result(sender=who, timeout=30),
    ("entities", ""): lambda rt, who: rt.entities(Vault, sender=who),
    ("signal_waits", ""): lambda rt, who: rt.signal_waits(Vault, sender=who),
    ("dead_letters", ""): lambda rt, who: rt.dead_letters(Vault, sender=who),
}


async def test_each_read_asks_the_hook_and_a_refused_one_raises_unauthorized(
        db_path: str) -> None:
    asked: list[tuple[str | None, str, str, str, str]] = []

    def authorize(req: corral.AuthRequest) -> str | bool | None:
        asked.append((req.sender, req.kind, req.name, req.entity_type, req.key))
        return req.sender != "intruder" and req.sender

    async with corral.open_runtime(db_path, entities=[Vault], authorize=authorize) as rt:
        ref = rt.ref(Vault, "v-1")
        for n in (0, 1, 2):
            await ref.signal_with_start(Vault.put, Item(n=n), start=Empty())
        await wait_until(lambda: _closed(ref), "the run completes")
        for (name, key), read in READS.items():
            asked.clear()
            with pytest.raises(corral.UnauthorizedError) as refused:
                await read(rt, "intruder")
            assert asked == [("intruder", "read", name, "Vault", key)]
            assert refused.value.entity_type == "Vault"
            asked.clear()
            assert await read(rt, "ops") is not None  # allowed: answered as before
            assert asked == [("ops", "read", name, "Vault", key)]
        asked.clear()
        await rt.dead_letters(sender="ops")  # across every type
        assert asked == [("ops", "read", "dead_letters", "", "")]


async def _closed(ref: corral.EntityRef[Vault]) -> bool:
    return (await ref.describe()).status is corral.RunStatus.COMPLETED


async def test_an_application_reading_without_a_sender_is_asked_about_as_anonymous(
        db_path: str) -> None:
    asked: list[tuple[str | None, str, str]] = []

    def authorize(req: corral.AuthRequest) -> str | bool | None:
        asked.append((req.sender, req.kind, req.name))
        return False if req.kind == "read" else None  # this application lets nobody read

    async with corral.open_runtime(db_path, entities=[Vault], authorize=authorize) as rt:
        ref = rt.ref(Vault, "v-2")
        await ref.signal_with_start(Vault.put, Item(n=1), start=Empty())
        with pytest.raises(corral.UnauthorizedError):
            await ref.describe()
        with pytest.raises(corral.UnauthorizedError):
            await rt.entities()
    assert asked[-2:] == [(None, "read", "describe"), (None, "read", "entities")]


async def test_without_a_hook_reads_check_only_the_claimed_sender(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Vault]) as rt:
        ref = rt.ref(Vault, "v-3")
        await ref.signal_with_start(Vault.put, Item(n=1), start=Empty())
        assert (await ref.describe(sender="anyone")).run_id == 1
        with pytest.raises(corral.InvalidKeyError):
            await ref.history(sender="bad\x00sender")
