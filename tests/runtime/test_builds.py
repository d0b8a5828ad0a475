"""The registry of builds at work (issue 24, items 1-2): releases register on open, an
incompatible one is refused before it hosts, and a host on an older build never skips
an entry of a handler a live newer build has: the entity waits for a host on it.

Releases of `Case` (`build_entities.py`): release 2 renames a signal, adds an optional
field, a new signal and state version 2 with its hook; release 3 removes that signal.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import corral
from build_entities import CaseR1, CaseR2, CaseR3, Escalation, Note, NoteV2
from corral.actors._manifest import manifest_json
from corral.persistence import open_store
from corral.runtime._build_registration import refused_release
from entities import fresh_key
from procs import TESTS, Worker, spawner, sql, wait_until


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, TESTS / "build_worker.py") as start:
        yield start


def _fp(cls: type[corral.Entity]) -> str:
    return cls._corral_definition.fingerprint  # type: ignore[attr-defined,no-any-return]


async def test_release_1_and_release_2_run_side_by_side_registered_and_compatible(
        db_path: str, tmp_path: Path, spawn: Callable[..., Worker]) -> None:
    key = fresh_key()
    r1 = spawn("r1", "client", "--db", db_path, "--key", key, "--ready",
               str(tmp_path / "ready"), "--stop", str(tmp_path / "stop"))
    await wait_until(lambda: (tmp_path / "ready").exists(), "release 1 registered",
                     alive=[r1])
    r1_process = (tmp_path / "ready").read_text()
    async with corral.open_runtime(db_path, entities=[CaseR2], shards=2) as rt:
        ref = rt.ref(CaseR2, key)
        await ref.signal(CaseR2.remark, NoteV2(text="from r2", lang="fr"))
        await ref.signal(CaseR2.escalate, Escalation(level=2))

        async def applied() -> bool:
            return (await ref.query(CaseR2.view)).level == 2
        await wait_until(applied, "release 2 applies both releases' signals")
        assert (await ref.query(CaseR2.view)).notes == ["from r1", "from r2"]
        old, new = await rt.builds(CaseR2)
        assert (old.fingerprint, new.fingerprint) == (_fp(CaseR1), _fp(CaseR2))
        assert (old.state_version, new.state_version) == (1, 2)
        assert (old.newest, old.compatible, new.newest, new.compatible) == (
            False, True, True, True)
        assert [p.process for p in old.processes] == [r1_process]
        assert [p.role for p in new.processes] == ["host"]
        assert old.first_seen <= new.first_seen <= new.last_seen
        assert "signal note: renamed to remark" in old.why
        assert [b.fingerprint for b in await rt.builds("Case")] == [old.fingerprint,
                                                                   new.fingerprint]
        (tmp_path / "stop").write_text("")
        r1.proc.wait(timeout=30)
        r1.check_exited_cleanly()
        assert (await rt.builds(CaseR2))[0].processes == ()  # it said goodbye on close
        assert await ref.dead_letters() == []


async def test_release_1_started_after_release_2_keeps_working_as_an_older_build(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[CaseR2], shards=2, host=False):
        pass
    async with corral.open_runtime(db_path, entities=[CaseR1], shards=2, host=False) as rt:
        builds = await rt.builds(CaseR1)
        assert [(b.fingerprint, b.newest) for b in builds] == [
            (_fp(CaseR2), True), (_fp(CaseR1), False)]  # never the newest
    async with corral.open_runtime(db_path, entities=[CaseR2], shards=2, host=False):
        pass  # the newest, opened again


async def test_release_3_removing_a_handler_that_still_has_entries_is_refused_at_open(
        db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=[CaseR2], shards=2, host=False) as rt:
        await rt.ref(CaseR2, key).signal_with_start(CaseR2.escalate, Escalation(level=1),
                                                    start=None)
    with pytest.raises(corral.IncompatibleBuildError) as refused:
        async with corral.open_runtime(db_path, entities=[CaseR3], shards=2):
            pytest.fail("release 3 opened")
    err = refused.value
    assert "signal escalate: removed while 1 journal entry remain" in str(err)
    assert "fix: keep signal escalate" in str(err)
    assert (err.entity_type, err.fingerprint, err.newest_fingerprint) == (
        "Case", _fp(CaseR3), _fp(CaseR2))
    assert err.differences == tuple(d for d in err.differences if "escalate" in d)
    async with corral.open_runtime(db_path, entities=[CaseR2], shards=2, host=False) as rt:
        assert _fp(CaseR3) not in [b.fingerprint for b in await rt.builds()]


async def test_a_host_on_release_1_waits_for_release_2_and_never_dead_letters_its_entry(
        db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=[CaseR1], shards=2,
                                   lease_ttl=1.0) as r1:
        ref1 = r1.ref(CaseR1, key)
        await ref1.signal_with_start(CaseR1.note, Note(text="a"), start=None)
        # Release 2 sends first as a pure client: a host of it would request release
        # 1's shards at once (`_newest`), maybe before release 1 met the entry.
        async with corral.open_runtime(db_path, entities=[CaseR2], shards=2,
                                       host=False) as c2:
            await c2.ref(CaseR2, key).signal(CaseR2.escalate, Escalation(level=3),
                                             message_id="esc")

            async def waiting() -> bool:
                found = (await ref1.describe()).suspension
                return found is not None and "escalate" in found.error
            await wait_until(waiting, "release 1's host suspends the run")
            why = (await ref1.describe()).suspension
            assert why is not None
            assert f"build {_fp(CaseR2)}" in why.error
            assert await ref1.dead_letters() == []
            # A host of release 2 starts: the newest build hosts, it takes the shards.
            async with corral.open_runtime(db_path, entities=[CaseR2], shards=2,
                                           lease_ttl=1.0) as r2:
                ref2 = r2.ref(CaseR2, key)

                async def applied() -> bool:
                    return (await ref2.query(CaseR2.view)).level == 3
                await wait_until(applied, "release 2 takes the shard and applies it")
                assert (await ref2.query(CaseR2.view)).notes == ["a"]
                assert await ref2.dead_letters() == []

                async def resumed() -> bool:
                    return (await ref2.describe()).suspension is None
                await wait_until(resumed, "the suspension is over")


async def test_a_rollback_to_a_build_with_a_handler_the_newest_removed_waits_for_its_processes(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[CaseR2], shards=2, host=False):
        pass
    async with corral.open_runtime(db_path, entities=[CaseR3], shards=2, host=False):
        with pytest.raises(corral.IncompatibleBuildError, match=r"this process .* sends it"):
            async with corral.open_runtime(db_path, entities=[CaseR2], shards=2, host=False):
                pytest.fail("release 2 opened beside a live release 3")
    async with corral.open_runtime(db_path, entities=[CaseR2], shards=2, host=False) as rt:
        newest = [b for b in await rt.builds(CaseR2) if b.newest]
        assert [b.fingerprint for b in newest] == [_fp(CaseR3)]  # rolled back, not newer


class Count(BaseModel):
    n: int


def _clashing(etype: str) -> tuple[type[corral.Entity], type[corral.Entity]]:
    """Two releases of type `etype` neither may run beside: `note` takes a `Note` in
    one, a `Count` in the other (each one's payloads fail the other's model)."""

    class Texts(corral.Entity):
        name = etype

        def __init__(self) -> None:
            self.seen: list[str] = []

        @corral.signal
        def note(self, n: Note) -> None:
            self.seen.append(n.text)

    class Numbers(corral.Entity):
        name = etype

        def __init__(self) -> None:
            self.seen: list[int] = []

        @corral.signal
        def note(self, c: Count) -> None:
            self.seen.append(c.n)

    return Texts, Numbers


ROUNDS = 6


async def test_of_two_incompatible_releases_opened_at_once_one_is_refused(
        db_path: str) -> None:
    for i in range(ROUNDS):
        texts, numbers = _clashing(f"Clash{i}")

        async def open_one(release: type[corral.Entity]) -> str:
            try:
                async with corral.open_runtime(db_path, entities=[release], shards=2,
                                               host=False):
                    return "opened"
            except corral.IncompatibleBuildError:
                return "refused"

        outcomes = await asyncio.gather(open_one(texts), open_one(numbers))
        assert sorted(outcomes) == ["opened", "refused"], (i, outcomes)
        async with corral.open_runtime(db_path, entities=[], shards=2, host=False) as rt:
            assert len(await rt.builds(f"Clash{i}")) == 1  # only the one that opened


class TagsR1(corral.Entity):
    name = "Tags"
    tags: list[str]

    def __init__(self) -> None:
        self.tags = []

    @corral.signal
    def tag(self, n: Note) -> None:
        self.tags.append(n.text)


class TagsR2(corral.Entity):
    """Release 2 done wrong: `tags` counts now, at the same state version (the same
    fingerprint: only the state's types say it differs)."""

    name = "Tags"
    tags: int

    def __init__(self) -> None:
        self.tags = 0

    @corral.signal
    def tag(self, n: Note) -> None:
        self.tags += 1


class TagsR3(TagsR2):
    """Release 2 done right: state version 2, with the hook that converts `tags`."""

    name = "Tags"
    state_version = 2

    @corral.upgrade(from_version=1)
    def _count_tags(state: dict[str, Any]) -> dict[str, Any]:
        return {**state, "tags": len(state.get("tags", []))}


async def test_a_release_changing_a_state_fields_type_is_refused_unless_it_upgrades_the_state(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[TagsR1], shards=2, host=False):
        pass
    assert _fp(TagsR2) == _fp(TagsR1)
    with pytest.raises(corral.IncompatibleBuildError) as refused:
        async with corral.open_runtime(db_path, entities=[TagsR2], shards=2, host=False):
            pytest.fail("a release whose state snapshots of release 1 cannot restore opened")
    assert refused.value.differences == (
        "state field tags: type changed from list[str] to int: snapshots of the older build "
        "would not restore; fix: bump state_version to 2 and add an upgrade hook from 1 "
        "(@corral.upgrade(from_version=1)) that converts tags",)
    async with corral.open_runtime(db_path, entities=[TagsR3], shards=2, host=False) as rt:
        old, new = await rt.builds(TagsR3)
    assert (old.fingerprint, new.fingerprint) == (_fp(TagsR1), _fp(TagsR3))
    assert (old.compatible, new.newest) == (True, True)
    assert "state field tags: type changed from list[str] to int; the upgrade hook" in old.why


def _manifests(*classes: Any) -> dict[str, str]:
    return {c._corral_definition.name: manifest_json(c._corral_definition) for c in classes}


async def test_a_release_of_the_same_interface_with_a_state_type_changed_is_refused(
        db_path: str) -> None:
    store = await open_store(db_path, shards=2)
    try:
        refused, _ = await refused_release(store, _manifests(TagsR1), _manifests(TagsR2))
        assert [r.split(":")[0] for r in refused] == ["Tags state field tags"]
        assert await refused_release(store, _manifests(TagsR1), _manifests(TagsR3)) == ([], [])
    finally:
        await store.close()


async def test_a_build_an_earlier_corral_registered_without_code_or_state_fields_still_compares(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[TagsR1], shards=2, host=False):
        pass
    [(text,)] = sql(db_path, "SELECT manifest FROM builds WHERE etype = 'Tags'")
    earlier = json.loads(text)
    del earlier["code"], earlier["state_fields"]
    sql(db_path, "UPDATE builds SET manifest = ? WHERE etype = 'Tags'", json.dumps(earlier))
    for release in (TagsR1, TagsR2, TagsR3):  # nothing to compare the state with: as before
        async with corral.open_runtime(db_path, entities=[release], shards=2,
                                       host=False) as rt:
            builds = await rt.builds(release)
            assert [b.compatible for b in builds] == [True] * len(builds), builds
