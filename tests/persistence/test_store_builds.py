"""The registry of builds, on both engines (contract style: `db_path` is a SQLite file
or the session's PostgreSQL database; see `test_store_contract.py`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from acceptances import acc, fence_for, opened
from corral.persistence import BuildRecord, Store

SHARDS = 4


@pytest.fixture
async def store(db_path: str) -> AsyncIterator[Store]:
    async with opened(db_path, SHARDS) as s:
        yield s


@pytest.fixture
async def other(db_path: str) -> AsyncIterator[Store]:
    async with opened(db_path, SHARDS) as s:
        yield s


def _by_fp(found: list[BuildRecord]) -> dict[str, BuildRecord]:
    return {b.fingerprint: b for b in found}


async def test_a_build_is_registered_once_with_first_and_last_seen_and_its_live_processes(
        store: Store, other: Store) -> None:
    first = await store.register_builds("p1", "host", [("T", "f1", '{"v":1}')], ttl=60)
    await asyncio.sleep(0.01)
    later = await other.register_builds("p2", "client", [("T", "f1", '{"v":1}'),
                                                         ("U", "g1", "{}")], ttl=60)
    found = await store.builds("T")
    assert [b.fingerprint for b in found] == ["f1"]
    b = found[0]
    assert (b.entity_type, b.manifest) == ("T", '{"v":1}')
    assert b.first_seen == pytest.approx(first, abs=0.5)
    assert b.last_seen == pytest.approx(later, abs=0.5)
    assert b.last_seen >= b.first_seen
    assert [(p.process, p.role) for p in b.processes] == [("p1", "host"), ("p2", "client")]
    assert [b.entity_type for b in await store.builds()] == ["T", "U"]


async def test_builds_are_listed_oldest_first_and_a_process_moves_between_builds(
        store: Store) -> None:
    await store.register_builds("p1", "host", [("T", "f1", "{}")], ttl=60)
    await asyncio.sleep(0.01)
    await store.register_builds("p1", "host", [("T", "f2", "{}")], ttl=60)  # restarted
    found = await store.builds("T")
    assert [b.fingerprint for b in found] == ["f1", "f2"]
    assert [p.process for p in _by_fp(found)["f2"].processes] == ["p1"]
    assert _by_fp(found)["f1"].processes == ()  # the build stays, its process moved


async def test_an_expired_or_forgotten_process_is_not_live_and_its_build_is_kept(
        store: Store) -> None:
    await store.register_builds("gone", "host", [("T", "f1", "{}")], ttl=0.01)
    await store.register_builds("closed", "client", [("T", "f1", "{}")], ttl=60)
    await asyncio.sleep(0.05)
    await store.forget_process("closed")
    (b,) = await store.builds("T")
    assert b.processes == ()
    await store.register_builds("gone", "host", [("T", "f1", "{}")], ttl=60)  # back
    (b,) = await store.builds("T")
    assert [p.process for p in b.processes] == ["gone"]


async def test_names_in_use_counts_journal_entries_and_dead_letters_of_each_name(
        store: Store) -> None:
    for mid in ("m1", "m2"):
        await store.accept(acc("k", mid, name="reply", etype="T"))
    await store.accept(acc("k", "m3", name="close", etype="T"))
    await store.accept(acc("k", "m4", name="reply", etype="Other"))
    fence = await fence_for(store, 1)
    (entry,) = [e for e in await store.journal("T", "k", run_id=1, after_seq=0)
                if e.name == "close"]
    await store.record_dead_letter(fence, entry, error="x", traceback="", attempts=1,
                                   failed_at=1.0)
    used = await store.names_in_use("T", ["reply", "close", "never"])
    assert used == {"reply": "2 journal entries remain",
                    "close": "1 journal entry, 1 dead letter remain"}
    assert await store.names_in_use("T", []) == {}
