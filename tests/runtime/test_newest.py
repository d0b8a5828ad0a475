"""The newest build hosts (issue 24 item 4, `runtime/host/_newest`): a rolling deploy on the
local backend, both stores, real processes.

Release 1 of `Case` (`build_entities.py`) hosts every shard in a worker process
(`build_worker.py stream`) and streams notes to its own keys. Release 2 (a rename, an
optional field, the new signal `escalate`, state version 2 with its hook) first sends
as a pure client, so its `remark` and `escalate` entries reach release 1's host, which
lacks both names and leaves them waiting (`_awaiting`); then a host of release 2
starts in the test process. Every shard moves to it, each exactly once (its epoch one
up: no ping-pong), release 1 goes on sending as a client, and each entity applied
exactly what was acknowledged, in order, `escalate` once each: nothing lost, nothing
doubled.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import corral
from build_entities import CaseR1, CaseR2, Escalation, NoteV2
from corral.persistence import BuildProcess, BuildRecord
from corral.runtime import Runtime
from corral.runtime.host._newest import Plan, moves_per_round, plan
from procs import TESTS, Worker, spawner, sql, wait_until
from senders import Senders

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs flock")

SHARDS = 4  # as build_worker.py's stream
TTL = 1.5


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, TESTS / "build_worker.py") as start:
        yield start


def leases(db: str) -> dict[int, tuple[str, int]]:
    """{shard: (owner, epoch)} of the shards leased now."""
    return {s: (o, e) for s, o, e in sql(db, "SELECT shard, owner, epoch FROM leases "
                                             "WHERE owner <> ''")}


class Release2Stream:
    """Release 2's sends, one sender per key: remarks (text = message id), every third
    message an `escalate` of level 1."""

    def __init__(self, rt: Runtime) -> None:
        self.refs = [rt.ref(CaseR2, f"r2-{n}") for n in range(8)]
        self.remarks: dict[str, list[str]] = {ref.key: [] for ref in self.refs}
        self.escalations: dict[str, int] = {ref.key: 0 for ref in self.refs}
        self.senders = Senders(self.refs, self._send, pause=0.01)

    async def _send(self, ref: corral.EntityRef[CaseR2, None], n: int) -> None:
        mid = f"{ref.key}/{n}"
        if n % 3 == 1:
            await ref.signal_with_start(CaseR2.escalate, Escalation(level=1), start=None,
                                        message_id=mid)
            self.escalations[ref.key] += 1
        else:
            await ref.signal_with_start(CaseR2.remark, NoteV2(text=mid, lang="fr"),
                                        start=None, message_id=mid)
            self.remarks[ref.key].append(mid)

    def sent(self) -> int:
        return sum(map(len, self.remarks.values())) + sum(self.escalations.values())


async def test_a_rolling_deploy_moves_every_shard_to_release_2_which_applies_its_new_signal_once(
        db_path: str, tmp_path: Path, spawn: Callable[..., Worker]) -> None:
    ready, stop = tmp_path / "r1.json", tmp_path / "stop"
    r1 = spawn("r1", "stream", "--db", db_path, "--key", "r1", "--ready", str(ready),
               "--stop", str(stop), "--ttl", str(TTL))
    await wait_until(ready.exists, "release 1 hosts", alive=[r1])
    r1_owner = json.loads(ready.read_text())["owner"]
    before = leases(db_path)
    assert {o for o, _ in before.values()} == {r1_owner}
    assert set(before) == set(range(SHARDS))
    async with corral.open_runtime(db_path, entities=[CaseR2], shards=SHARDS,
                                   host=False, lease_ttl=TTL) as clients:
        stream = Release2Stream(clients)

        async def waiting() -> bool:  # release 2's entries wait in release 1's host
            if not sum(stream.escalations.values()):
                return False
            for ref in stream.refs:
                found = (await ref.describe()).suspension
                if found is None or "waiting for a host on a build" not in found.error:
                    return False
            return True
        await wait_until(waiting, "release 1's host leaves release 2's entries waiting",
                         alive=[r1])
        early = sum(stream.escalations.values())
        async with corral.open_runtime(db_path, entities=[CaseR2], shards=SHARDS,
                                       lease_ttl=TTL) as rt:
            assert rt.host is not None
            owner = rt.host.owner
            await wait_until(lambda: leases(db_path) == {s: (owner, e + 1)
                                                         for s, (_, e) in before.items()},
                             "every shard moved to release 2, each once", alive=[r1],
                             timeout=60)
            sent = stream.sent()
            await wait_until(lambda: stream.sent() >= sent + 3 * len(stream.refs),
                             "both releases go on sending", alive=[r1])
            stop.write_text("")
            await stream.senders.stop()
            assert await asyncio.to_thread(r1.proc.wait, 60) == 0, r1.output
            r1_sent = json.loads(ready.with_suffix(".acked.json").read_text())
            assert r1_sent["unhosted"] > 0  # release 1 kept sending as a client
            assert early > 0  # escalate sent while release 1 hosted every shard
            for key, ids in r1_sent["acked"].items():
                await _applied(rt.ref(CaseR2, key), ids, 0)
            for ref in stream.refs:
                await _applied(rt.ref(CaseR2, ref.key), stream.remarks[ref.key],
                               stream.escalations[ref.key])
            assert set(rt.host.shards) == set(range(SHARDS))
            assert leases(db_path) == {s: (owner, e + 1) for s, (_, e) in before.items()}
            assert await rt.dead_letters() == []


async def _applied(ref: corral.EntityRef[CaseR2, None], remarks: list[str],
                   escalations: int) -> None:
    """Until the entity applied exactly `remarks` in order and `escalations` escalates."""
    async def done() -> bool:
        view = await ref.query(CaseR2.view)
        return (view.notes, view.level) == (remarks, escalations)
    await wait_until(done, f"{ref.key} applied what was acknowledged, once")


async def test_a_host_of_an_older_build_takes_no_free_shard_while_a_newest_host_lives(
        db_path: str) -> None:
    """Release 2's host frees its shards (handed to a host that never comes): release
    1's host, live beside it, leaves them free, and release 2 takes them back once."""
    async with corral.open_runtime(db_path, entities=[CaseR2], shards=SHARDS,
                                   lease_ttl=TTL) as r2:
        newest = r2.host
        assert newest is not None
        before = leases(db_path)
        async with corral.open_runtime(db_path, entities=[CaseR1], shards=SHARDS,
                                       lease_ttl=TTL) as r1:
            older = r1.host
            assert older is not None
            assert older.shards == {}
            handed = await newest.hand_off({s: "nobody" for s in range(SHARDS)})
            assert handed == set(range(SHARDS))

            async def taken_back() -> bool:  # release 1's host ticking as fast as it can
                async with older.leasing:
                    await older._tick()
                return len(newest.shards) == SHARDS
            await wait_until(taken_back, "release 2 takes its shards back")
            assert older.shards == {}
            assert leases(db_path) == {s: (newest.owner, e + 1)
                                       for s, (_, e) in before.items()}


def _record(etype: str, fingerprint: str, *hosts: str, older: bool = False
            ) -> BuildRecord:
    return BuildRecord(etype, fingerprint, "{}", 0.0, 0.0, older,
                       tuple(BuildProcess(h, "host", 0.0) for h in hosts))


def test_a_host_on_the_newest_build_of_every_type_requests_a_few_shards_of_older_hosts(
        ) -> None:
    # Release 2 changes Case only; Ledger's build is the same in both releases.
    records = [_record("Case", "c1", "old"), _record("Case", "c2", "new"),
               _record("Ledger", "l1", "old", "new")]
    holders = {0: "old", 1: "old", 2: "old", 3: "new", 4: "gone"}
    new = plan("new", {"Case": "c2", "Ledger": "l1"}, records, holders, limit=2)
    assert not new.yielding
    assert len(new.requests) == 2
    assert set(new.requests) <= {0, 1, 2}
    assert plan("new", {"Case": "c2", "Ledger": "l1"}, records, holders, limit=9) == Plan(
        False, (0, 1, 2))
    assert plan("old", {"Case": "c1", "Ledger": "l1"}, records, holders, limit=9) == Plan(
        True, ())
    assert [moves_per_round(n) for n in (1, 4, 16, 64)] == [1, 1, 4, 16]


def test_no_host_supersedes_one_hosting_a_type_it_lacks_or_one_on_the_newest() -> None:
    records = [_record("Case", "c1", "old"), _record("Case", "c2", "new", "peer"),
               _record("Ledger", "l1", "old"),
               _record("Case", "c0", "late", older=True)]  # an old release started late
    holders = {0: "old", 1: "peer", 2: "late"}
    # "new" lacks Ledger, which "old" hosts: moving old's shards would strand it.
    assert plan("new", {"Case": "c2"}, records, holders, limit=9) == Plan(False, (2,))
    assert plan("old", {"Case": "c1", "Ledger": "l1"}, records, holders, limit=9) == Plan(
        False, ())
    assert plan("late", {"Case": "c0"}, records, holders, limit=9) == Plan(True, ())
    assert plan("peer", {"Case": "c2"}, records, holders, limit=9) == Plan(False, (2,))


async def test_an_entry_only_the_newest_build_knows_waits_in_an_older_host_after_a_rollback(
        db_path: str) -> None:
    """A rollback (an older build hosting after the newest) must not dead-letter what
    only the newest build knows, though no process of it is live: it waits for it."""
    key = "rolled-back"
    async with corral.open_runtime(db_path, entities=[CaseR2], shards=SHARDS, host=False,
                                   lease_ttl=TTL) as client:  # release 2 accepts, then goes
        await client.ref(CaseR2, key).signal_with_start(CaseR2.escalate, Escalation(level=1),
                                                        start=None)
    async with corral.open_runtime(db_path, entities=[CaseR1], shards=SHARDS,
                                   lease_ttl=TTL) as rt:  # the rollback hosts
        ref = rt.ref(CaseR1, key)

        async def waiting() -> bool:
            found = (await ref.describe()).suspension
            return found is not None and "deploy it again" in found.error
        await wait_until(waiting, "release 1 leaves release 2's entry waiting")
        assert await rt.dead_letters() == []
    async with corral.open_runtime(db_path, entities=[CaseR2], shards=SHARDS,
                                   lease_ttl=TTL) as rt:  # release 2 again: applied once
        await _applied(rt.ref(CaseR2, key), [], 1)
        assert await rt.dead_letters() == []
