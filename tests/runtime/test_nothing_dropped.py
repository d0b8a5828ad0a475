"""Nothing acknowledged is ever dropped (issue 22, deliverable 4): the messages a run
accepted but never applied, when it is terminated, fails or is replaced, and the
mailbox payloads its `run()` never took, are kept as dead letters of that run, with
the reason, and replay into the next run.
"""

from __future__ import annotations

import pydantic
import pytest
from pydantic import BaseModel

import corral
from entities import fresh_key
from procs import sql, wait_until


class Item(BaseModel):
    n: int


class Items(BaseModel):
    ns: list[int]


class Begin(BaseModel):
    owner: str


class BeginV2(BaseModel):
    owner: str
    region: str  # required: the start input of release 1 no longer fits


class Ledger(corral.Entity):
    def __init__(self, begin: Begin) -> None:
        self.ns: list[int] = []

    @corral.signal
    def add(self, item: Item) -> None:
        self.ns.append(item.n)

    @corral.query
    def items(self) -> Items:
        return Items(ns=self.ns)


class LedgerV2(corral.Entity):
    name = "Ledger"
    retry = corral.RetryPolicy(max_attempts=2, initial_backoff=0.001, max_backoff=0.001)
    # The test is about a run that fails: a start input that no longer fits would
    # otherwise suspend the run until a fix (see test_suspended_runs).
    fail_on = (pydantic.ValidationError,)

    def __init__(self, begin: BeginV2) -> None:
        self.ns: list[int] = []

    @corral.signal
    def add(self, item: Item) -> None:
        self.ns.append(item.n)

    @corral.query
    def items(self) -> Items:
        return Items(ns=self.ns)


class Inbox(corral.Entity):
    inbox = corral.signal(Item)

    @corral.signal
    def stop(self) -> None:
        self.stopping = True

    def __init__(self) -> None:
        self.stopping = False
        self.taken: list[int] = []

    async def run(self) -> Items:
        await self.wait_for(lambda: self.stopping)
        return Items(ns=self.taken)  # leaves the inbox untaken


async def _accept_unhosted(db_path: str, key: str, *ns: int) -> None:
    """Accept a start and signals while no process hosts the entity, then terminate it."""
    async with corral.open_runtime(db_path, entities=[Ledger], shards=2, host=False) as rt:
        ref = rt.ref(Ledger, key)
        for n in ns:
            await ref.signal_with_start(Ledger.add, Item(n=n), start=Begin(owner="ana"))
        await ref.terminate(reason="operator said so")


async def _letters(ref: corral.EntityRef[Ledger], n: int) -> list[corral.DeadLetter]:
    letters: list[corral.DeadLetter] = []

    async def enough() -> bool:
        letters[:] = await ref.dead_letters()
        return len(letters) >= n
    await wait_until(enough, f"{n} dead letters")
    return letters


@pytest.mark.parametrize("starter", ["host", "client"])
async def test_messages_of_a_run_terminated_before_applying_them_are_its_dead_letters_and_replay_into_the_next_run(  # noqa: E501
        db_path: str, starter: str) -> None:
    key = fresh_key("ledger")
    await _accept_unhosted(db_path, key, 1, 2, 3)
    async with corral.open_runtime(db_path, entities=[Ledger], shards=2) as rt, \
            corral.open_runtime(db_path, entities=[Ledger], shards=2, host=False) as client:
        ref = rt.ref(Ledger, key)
        sender = ref if starter == "host" else client.ref(Ledger, key)
        ack = await sender.signal_with_start(Ledger.add, Item(n=4), start=Begin(owner="bo"))
        assert (ack.run_id, ack.started) == (2, True)
        letters = await _letters(ref, 3)
        assert [(d.run_id, d.payload) for d in letters] == [
            (1, '{"n":1}'), (1, '{"n":2}'), (1, '{"n":3}')]
        assert all(d.error.startswith("run 1 was terminated before applying it")
                   for d in letters)
        for letter in letters:
            await ref.replay_dead_letter(letter.id)

        async def replayed() -> bool:
            return (await ref.query(Ledger.items)).ns == [4, 1, 2, 3]
        await wait_until(replayed, "the replays are applied in run 2")
        assert await ref.dead_letters() == []


async def test_messages_of_a_run_whose_activation_cannot_be_built_are_dead_letters_of_the_failed_run(  # noqa: E501
        db_path: str) -> None:
    key = fresh_key("ledger")
    async with corral.open_runtime(db_path, entities=[Ledger], shards=2, host=False) as rt:
        ref1 = rt.ref(Ledger, key)
        for n in (1, 2):
            await ref1.signal_with_start(Ledger.add, Item(n=n), start=Begin(owner="ana"))
    async with corral.open_runtime(db_path, entities=[LedgerV2], shards=2) as rt:
        ref = rt.ref(LedgerV2, key)

        async def failed() -> bool:
            return (await ref.describe()).status is corral.RunStatus.FAILED
        await wait_until(failed, "run 1 fails: its start input no longer fits")
        letters = await _letters(ref, 2)  # type: ignore[arg-type]
        assert [(d.run_id, d.payload) for d in letters] == [(1, '{"n":1}'), (1, '{"n":2}')]
        assert all(d.error.startswith("run 1 failed before applying it") for d in letters)
        ack = await ref.signal_with_start(LedgerV2.add, Item(n=3),
                                          start=BeginV2(owner="bo", region="eu"))
        assert ack.run_id == 2
        for letter in letters:
            await ref.replay_dead_letter(letter.id)

        async def replayed() -> bool:
            return (await ref.query(LedgerV2.items)).ns == [3, 1, 2]
        await wait_until(replayed, "the replays are applied in run 2")


async def test_mailbox_payloads_run_never_took_are_dead_letters_of_the_closed_run(
        db_path: str) -> None:
    key = fresh_key("inbox")
    async with corral.open_runtime(db_path, entities=[Inbox], shards=2) as rt:
        ref = rt.ref(Inbox, key)
        for n in (1, 2):
            await ref.signal_with_start(Inbox.inbox, Item(n=n), start=None)
        await ref.signal(Inbox.stop)
        assert await ref.result(timeout=30) == Items(ns=[])
        letters = await ref.dead_letters()
        assert [(d.run_id, d.payload, d.name) for d in letters] == [
            (1, '{"n":1}', "inbox"), (1, '{"n":2}', "inbox")]
        assert all(d.error.startswith("run 1 completed before run() took it from its mailbox")
                   for d in letters)


async def test_mailbox_payloads_left_by_a_terminated_run_are_its_dead_letters(
        db_path: str) -> None:
    key = fresh_key("inbox")
    async with corral.open_runtime(db_path, entities=[Inbox], shards=2) as rt:
        ref = rt.ref(Inbox, key)
        await ref.signal_with_start(Inbox.inbox, Item(n=7), start=None)
        await ref.terminate(reason="enough")

        async def kept() -> bool:
            return len(await ref.dead_letters()) == 1
        await wait_until(kept, "the untaken payload is a dead letter")
        [letter] = await ref.dead_letters()
        assert letter.error.startswith("run 1 was terminated before run() took it")
    assert sql(db_path, "SELECT count(*) FROM dead_letters") == [(1,)]
