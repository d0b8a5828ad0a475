"""Renamed handlers (issue 22, deliverable 3): `renamed_from=` on a signal, an update or
a wait. Journal entries, dead letters and senders of the old name reach the new
handler, a process still on the old code keeps sending the old name, and an entry
whose handler this code does not have (or whose payload today's model refuses) is
dead-lettered with the reason and replayable after the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

import corral
from corral._cli._entities import handler_named
from corral._cli._waits import signal_wait
from corral.actors import HandlerKind
from corral.runtime.ray._shard_host import accepted_fingerprints, host_fingerprint
from entities import fresh_key
from procs import TESTS, Worker, spawner, wait_until
from rename_entities import (
    Reply,
    TicketNoAlias,
    TicketStrict,
    TicketV1,
    TicketV2,
)
from stores import sql


class Note(BaseModel):
    text: str = ""


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, TESTS / "rename_worker.py") as start:
        yield start


async def _send_v1(db_path: str, key: str, *texts: str) -> None:
    """Release 1 accepts signals by the old name; nothing hosts them (a pure client)."""
    async with corral.open_runtime(db_path, entities=[TicketV1], shards=2, host=False) as rt:
        for text in texts:
            await rt.ref(TicketV1, key).signal_with_start(
                TicketV1.customer_reply, Reply(text=text), start=None)


def _forget_builds(db_path: str) -> None:
    """Make the store one written before the registry of builds: a build that lacks a
    handler of stored entries is then not refused at open (`test_builds.py` shows the
    refusal), and its hosts dead-letter what no live build knows, replayably."""
    sql(db_path, "DELETE FROM builds")


async def test_journal_entries_of_the_old_name_reach_the_renamed_handler_under_new_code(
        db_path: str) -> None:
    key = fresh_key()
    await _send_v1(db_path, key, "a", "b", "c")
    async with corral.open_runtime(db_path, entities=[TicketV2], shards=2) as rt:
        ref = rt.ref(TicketV2, key)
        await ref.signal(TicketV2.reply_from_customer, Reply(text="d"))
        await wait_until(lambda: _count(ref, 4), "all four replies are applied")
        assert (await ref.query(TicketV2.replies)).texts == ["v2:a", "v2:b", "v2:c", "v2:d"]
        assert await ref.dead_letters() == []


async def _count(ref: corral.EntityRef[TicketV2], n: int) -> bool:
    return len((await ref.query(TicketV2.replies)).texts) >= n


async def test_a_process_on_the_old_code_keeps_sending_the_old_name_to_a_host_on_the_new_code(
        db_path: str, tmp_path: Path, spawn: Callable[..., Worker]) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=[TicketV2], shards=2) as rt:
        ref = rt.ref(TicketV2, key)
        await ref.signal_with_start(TicketV2.reply_from_customer, Reply(text="new-0"),
                                    start=None)
        old = spawn("old", "send", "--db", db_path, "--key", key, "--count", "20",
                    "--done", str(tmp_path / "done"))
        await wait_until(lambda: (tmp_path / "done").exists(), "the old process sent",
                         alive=[old])
        await wait_until(lambda: _count(ref, 21), "every old-name signal is applied")
        texts = (await ref.query(TicketV2.replies)).texts
        assert texts == ["v2:new-0", *(f"v2:old-{i}" for i in range(20))]
        assert await ref.dead_letters() == []


async def test_a_client_on_new_code_may_name_the_old_signal_as_the_cli_does(
        db_path: str) -> None:
    definition = TicketV2._corral_definition
    found = handler_named(definition, "customer_reply", HandlerKind.SIGNAL)
    assert found is TicketV2.reply_from_customer
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=[TicketV2], shards=2) as rt:
        ref = rt.ref(TicketV2, key)
        handler = handler_named(ref.definition, "customer_reply", HandlerKind.SIGNAL)
        await ref.signal_with_start(handler, Reply(text="x"), start=None)
        assert (await ref.query(TicketV2.replies)).texts == ["v2:x"]


async def test_an_entry_whose_handler_this_code_lacks_is_dead_lettered_and_replays_into_the_renamed_handler(  # noqa: E501
        db_path: str) -> None:
    key = fresh_key()
    await _send_v1(db_path, key, "lost?", "no")
    _forget_builds(db_path)
    async with corral.open_runtime(db_path, entities=[TicketNoAlias], shards=2) as rt:
        ref = rt.ref(TicketNoAlias, key)
        await ref.signal(TicketNoAlias.reply_from_customer, Reply(text="after"))
        await wait_until(lambda: _dead(ref, 2), "both old entries are dead letters")
        letters = await ref.dead_letters()
        assert [(d.name, d.run_id) for d in letters] == [("customer_reply", 1)] * 2
        assert "no signal handler 'customer_reply'" in letters[0].error
        assert "renamed_from='customer_reply'" in letters[0].error
        assert (await ref.query(TicketNoAlias.replies)).texts == ["v2:after"]
    async with corral.open_runtime(db_path, entities=[TicketV2], shards=2) as rt:  # the fix
        ref2 = rt.ref(TicketV2, key)
        for letter in letters:
            await ref2.replay_dead_letter(letter.id)
        await wait_until(lambda: _count(ref2, 3), "the replays are applied")
        assert (await ref2.query(TicketV2.replies)).texts == ["v2:after", "v2:lost?", "v2:no"]
        assert await ref2.dead_letters() == []


async def _dead(ref: corral.EntityRef[TicketNoAlias] | corral.EntityRef[TicketStrict],
                n: int) -> bool:
    return len(await ref.dead_letters()) >= n


async def test_an_entry_whose_payload_no_longer_validates_is_dead_lettered_with_the_reason(
        db_path: str) -> None:
    key = fresh_key()
    await _send_v1(db_path, key, "hi")
    _forget_builds(db_path)
    async with corral.open_runtime(db_path, entities=[TicketStrict], shards=2) as rt:
        ref = rt.ref(TicketStrict, key)
        await wait_until(lambda: _dead(ref, 1), "the old payload is a dead letter")
        [letter] = await ref.dead_letters()
        assert "payload no longer validates against StrictReply" in letter.error
        assert "channel" in letter.error
        assert letter.attempts == 0
        assert (await ref.query(TicketStrict.replies)).texts == []
    async with corral.open_runtime(db_path, entities=[TicketV1], shards=2) as rt:
        ref1 = rt.ref(TicketV1, key)  # a release whose model takes it again
        await ref1.replay_dead_letter(letter.id)
        async def applied() -> bool:
            return (await ref1.query(TicketV1.replies)).texts == ["hi"]
        await wait_until(applied, "the replay is applied")


def test_a_host_on_new_code_accepts_clients_of_the_code_before_a_declared_rename() -> None:
    old, new = TicketV1._corral_definition, TicketV2._corral_definition
    assert old.fingerprint != new.fingerprint
    assert host_fingerprint(old) in accepted_fingerprints(new)
    assert host_fingerprint(new) not in accepted_fingerprints(old)  # it would send new names
    # Declaring a rename does not change what today's clients send: the same fingerprint.
    assert TicketNoAlias._corral_definition.fingerprint == new.fingerprint


def test_renamed_from_takes_a_name_or_a_tuple_of_names_for_signals_updates_and_waits() -> None:
    class Order(corral.Entity):
        @corral.signal(renamed_from=("first", "second"))
        def third(self, note: Note) -> None: ...

        box = corral.signal(Note, renamed_from="inbox")

        @corral.update(renamed_from="old_assign")
        def assign(self, note: Note) -> Note:
            return note

        approval = corral.wait(Note, renamed_from="manager_ok")

    d = Order._corral_definition
    assert dict(d.renamed) == {"first": "third", "second": "third", "inbox": "box",
                               "old_assign": "assign"}
    for old, new in d.renamed.items():
        found = d.handler(old)
        assert found is not None
        assert found.name == new
    found_wait = d.wait("manager_ok")
    assert found_wait is not None
    assert found_wait.name == "approval"
    assert signal_wait(d, "manager_ok") is Order.approval


def test_an_old_name_that_is_another_handlers_name_is_refused_naming_both() -> None:
    with pytest.raises(corral.EntityDefinitionError, match=r"Bad\.a: renamed_from='b'.*Bad\.b"):
        class Bad(corral.Entity):
            @corral.signal(renamed_from="b")
            def a(self, note: Note) -> None: ...

            @corral.signal
            def b(self, note: Note) -> None: ...


def test_an_old_name_claimed_by_two_handlers_is_refused_naming_both() -> None:
    with pytest.raises(corral.EntityDefinitionError,
                       match=r"Twice\.b and \.a both declare renamed_from=.old."):
        class Twice(corral.Entity):
            @corral.signal(renamed_from="old")
            def a(self, note: Note) -> None: ...

            @corral.signal(renamed_from="old")
            def b(self, note: Note) -> None: ...


@pytest.mark.parametrize("bad", ["", "not an identifier", ("a", "a"), ["a"], 3, ()])
def test_a_malformed_renamed_from_is_refused_when_the_class_is_defined(bad: object) -> None:
    with pytest.raises(corral.EntityDefinitionError, match="renamed_from"):
        corral.signal(renamed_from=bad)  # type: ignore[arg-type]
