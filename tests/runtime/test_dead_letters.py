"""Poison messages (guarantee 10): retries with backoff, then the dead-letter table.

A signal handler that keeps raising is called `RetryPolicy.max_attempts` times, then
its entry moves to `dead_letters` and the entity goes on with its next message, in
order. Operators list, replay (exactly once, even when retried) and discard dead
letters. A dead-lettered entry is never applied again by recovery; an entry whose
retries a crash (a real SIGKILL) cut short is not lost.

Run as a script (`python test_dead_letters.py DB ATTEMPTS READY`) this module is the
worker process that the SIGKILL test kills in the middle of its retries.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

import corral
from corral.persistence import Fence
from procs import Worker, wait_until
from stores import sql


class Init(BaseModel):
    owner: str


class Item(BaseModel):
    v: int


class Done(BaseModel):
    count: int


class Fragile(corral.Entity):
    """Takes items; raises for every item whose value is in `broken` (process-wide)."""

    retry = corral.RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.02)
    broken: ClassVar[set[int]] = set()
    calls: ClassVar[Counter[int]] = Counter()  # handler calls per item, outside snapshots
    order: ClassVar[list[int]] = []  # every handler call, in call order

    def __init__(self, init: Init) -> None:
        self.seen: list[int] = []

    @corral.signal
    def item(self, it: Item) -> None:
        type(self).calls[it.v] += 1
        type(self).order.append(it.v)
        if it.v in type(self).broken:
            raise ValueError(f"cannot take item {it.v}")
        self.seen.append(it.v)

    @corral.update
    def take(self, it: Item) -> Done:
        type(self).calls[-it.v] += 1
        if it.v in type(self).broken:
            raise ValueError(f"cannot take item {it.v}")
        self.seen.append(it.v)
        return Done(count=len(self.seen))

    @corral.query
    def values(self) -> list[int]:
        return self.seen


class Opaque(corral.Entity):
    """Like `Fragile`, but its state does not pickle: no snapshot follows a dead letter,
    so recovery meets the dead-lettered entry in the journal and must skip it."""

    retry = corral.RetryPolicy(max_attempts=2, initial_backoff=0.001, max_backoff=0.001)
    snapshots = corral.SnapshotPolicy(every=None)
    broken: ClassVar[set[int]] = set()
    calls: ClassVar[Counter[int]] = Counter()

    def __init__(self, init: Init) -> None:
        self.seen: list[int] = []

    @corral.signal
    def item(self, it: Item) -> None:
        type(self).calls[it.v] += 1
        if it.v in type(self).broken:
            raise ValueError(f"cannot take item {it.v}")
        self.seen.append(it.v)

    @corral.query
    def values(self) -> list[int]:
        return self.seen

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("Opaque state does not pickle")


class Crashy(corral.Entity):
    """Takes items, raising for those in `broken`. The worker process subclasses it with
    a retry policy that never gives up, and is SIGKILLed in the middle of the retries."""

    retry = corral.RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.001)
    broken: ClassVar[set[int]] = set()
    calls: ClassVar[Counter[int]] = Counter()
    attempts_file: ClassVar[Path | None] = None

    def __init__(self, init: Init) -> None:
        self.seen: list[int] = []

    @corral.signal
    def item(self, it: Item) -> None:
        type(self).calls[it.v] += 1
        if it.v in type(self).broken:
            if type(self).attempts_file is not None:
                with open(type(self).attempts_file, "a") as f:
                    f.write(f"{it.v}\n")
            raise ValueError(f"cannot take item {it.v}")
        self.seen.append(it.v)

    @corral.query
    def values(self) -> list[int]:
        return self.seen


class CrashyWorker(Crashy):
    """`Crashy` as the worker process registers it: the same entity type, endless retries."""

    name = "Crashy"
    retry = corral.RetryPolicy(max_attempts=1_000_000, initial_backoff=0.02, max_backoff=0.02)


@pytest.fixture(autouse=True)
def _reset() -> None:
    for cls in (Fragile, Opaque, Crashy):
        cls.broken = set()
        cls.calls = Counter()
    Fragile.order = []


def _open(db_path: str, *entities: type[corral.Entity], **options: Any) -> Any:
    return corral.open_runtime(db_path, entities=list(entities) or [Fragile], shards=4,
                               **options)


async def _send_items(ref: corral.EntityRef[Any], values: list[int], *,
                      handler: Any = None) -> list[corral.Ack]:
    """Send one signal per value, one after another (message id `m-<value>`)."""
    acks = []
    for v in values:
        acks.append(await ref.signal_with_start(handler or Fragile.item, Item(v=v),
                                                start=Init(owner="o"), message_id=f"m-{v}"))
    return acks


async def _poisoned(rt: corral.Runtime) -> tuple[corral.EntityRef[Fragile], corral.DeadLetter]:
    """Entity `k` took items 1, 3 and 4; item 2 raised every time and is dead-lettered."""
    Fragile.broken = {2}
    ref = rt.ref(Fragile, "k")
    await _send_items(ref, [1, 2, 3, 4])
    assert await ref.query(Fragile.values) == [1, 3, 4]  # waits until all four are applied
    [dead] = await ref.dead_letters()
    return ref, dead


# -- retries and the dead-letter table ---------------------------------------------------


async def test_a_one_attempt_policy_dead_letters_a_raising_signal_after_one_call_and_later_signals_wait(  # noqa: E501
    db_path: str,
) -> None:
    """A signal to a ready entity with nothing pending is applied by its worker task,
    after the send returned (never in the sender's frame): its handler is called as
    many times as the policy says, once here, and later signals still wait behind it."""

    class Once(Fragile):
        name = "Once"
        retry = corral.RetryPolicy(max_attempts=1)

    Fragile.broken, Fragile.calls, Fragile.order = {2}, Counter(), []
    async with _open(db_path, Once) as rt:
        ref = rt.ref(Once, "k")
        await _send_items(ref, [1], handler=Once.item)
        assert await ref.query(Once.values) == [1]  # ready, idle, nothing pending
        await _send_items(ref, [5], handler=Once.item)
        assert await ref.query(Once.values) == [1, 5]
        await _send_items(ref, [2, 3], handler=Once.item)
        assert await ref.query(Once.values) == [1, 5, 3]
        [dead] = await ref.dead_letters()
    assert (dead.seq, dead.attempts) == (3, 1)
    assert Fragile.calls[2] == 1
    assert Fragile.order == [1, 5, 2, 3]


async def test_an_entry_delivered_again_after_it_was_applied_is_dropped_without_a_worker(
    db_path: str,
) -> None:
    """The journal tail hands a host back the entries it accepted and delivered itself
    (PostgreSQL's safety poll, every second): a ready entity drops what it applied
    already, calling no handler and starting no worker task for it."""
    Fragile.broken, Fragile.calls, Fragile.order = set(), Counter(), []
    async with _open(db_path) as rt:
        ref = rt.ref(Fragile, "k")
        await _send_items(ref, [1, 2, 3])
        assert await ref.query(Fragile.values) == [1, 2, 3]
        shard = rt.host.shard(ref.shard)
        act = shard.get("Fragile", "k")
        entries = await rt.store.journal("Fragile", "k", run_id=1, after_seq=0)
        assert [e.seq for e in entries] == [1, 2, 3]
        for entry in entries:
            shard.route(entry)
        assert act._worker is None and not act._inbox  # noqa: PT018 (one state)
        assert act.applied_seq == 3
        assert Fragile.order == [1, 2, 3]  # no handler called again


async def test_a_signal_whose_handler_always_raises_is_dead_lettered_after_max_attempts_while_later_signals_apply_in_order(  # noqa: E501
    db_path: str,
) -> None:
    async with _open(db_path) as rt:
        ref, dead = await _poisoned(rt)
        assert Fragile.calls[2] == Fragile.retry.max_attempts == 3
        assert (Fragile.calls[1], Fragile.calls[3], Fragile.calls[4]) == (1, 1, 1)
        # Items 3 and 4 waited for every attempt of item 2: order is kept.
        assert Fragile.order == [1, 2, 2, 2, 3, 4]

        assert (dead.entity_type, dead.key, dead.run_id, dead.seq) == ("Fragile", "k", 1, 2)
        assert (dead.message_id, dead.name, json.loads(dead.payload)) == ("m-2", "item", {"v": 2})
        assert dead.attempts == 3
        assert dead.error == "ValueError: cannot take item 2"
        assert dead.traceback.startswith("Traceback (most recent call last):")
        assert 'raise ValueError(f"cannot take item {it.v}")' in dead.traceback
        assert dead.traceback.rstrip().endswith("ValueError: cannot take item 2")
        assert dead.failed_at <= time.time()

        assert await rt.dead_letters() == [dead]
        assert await rt.dead_letters(Fragile) == [dead]
        assert await rt.dead_letters("Fragile", "k") == [dead]
        assert await rt.dead_letters(key="other") == []
        info = await ref.describe()
        assert (info.accepted_seq, info.applied_seq) == (4, 4)  # counted as applied
    # The row is in the store file itself.
    assert sql(db_path, "SELECT id, seq, message_id, attempts FROM dead_letters") == [
        (dead.id, 2, "m-2", 3)]


async def test_an_update_handler_that_raises_fails_its_caller_once_and_is_not_dead_lettered(
    db_path: str,
) -> None:
    async with _open(db_path) as rt:
        Fragile.broken = {7}
        ref = rt.ref(Fragile, "k")
        with pytest.raises(corral.UpdateFailedError, match="cannot take item 7"):
            await ref.update_with_start(Fragile.take, Item(v=7), start=Init(owner="o"),
                                        update_id="u-7")
        assert Fragile.calls[-7] == 1
        assert await ref.update(Fragile.take, Item(v=8), update_id="u-8") == Done(count=1)
        assert await ref.dead_letters() == []


def test_a_retry_policy_is_checked_when_the_class_is_defined() -> None:
    with pytest.raises(corral.EntityDefinitionError, match="retry must be a RetryPolicy"):
        class Bad(corral.Entity):
            retry = 3  # type: ignore[assignment]
    with pytest.raises(ValueError, match="max_attempts"):
        corral.RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="multiplier"):
        corral.RetryPolicy(multiplier=0.5)
    policy = corral.RetryPolicy(max_attempts=10, initial_backoff=0.1, max_backoff=0.5)
    assert [policy.backoff(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.4, 0.5]
    assert Fragile._corral_definition.retry == Fragile.retry


# -- replay and discard --------------------------------------------------------------------


async def test_replaying_a_dead_letter_after_the_fix_applies_it_once_and_removes_it(
    db_path: str,
) -> None:
    async with _open(db_path) as rt:
        ref, dead = await _poisoned(rt)
        Fragile.broken = set()  # the fix is deployed
        ack = await ref.replay_dead_letter(dead.id)
        assert (ack.status, ack.run_id, ack.seq, ack.started) == ("accepted", 1, 5, False)
        assert await ref.query(Fragile.values) == [1, 3, 4, 2]
        assert Fragile.calls[2] == 4  # three failed attempts, then this one
        assert await ref.dead_letters() == []
        assert await rt.dead_letters() == []

        # A replay retried after its answer was lost is a duplicate, not a second delivery.
        again = await ref.replay_dead_letter(dead.id)
        assert (again.status, again.run_id, again.seq) == ("duplicate", 1, 5)
        assert await ref.query(Fragile.values) == [1, 3, 4, 2]
        assert Fragile.calls[2] == 4
    assert sql(db_path, "SELECT seq, message_id FROM journal WHERE seq=5") == [
        (5, f"replay:{dead.id}:m-2")]


async def test_two_concurrent_replays_of_one_dead_letter_deliver_it_once(db_path: str) -> None:
    async with _open(db_path) as rt:
        ref, dead = await _poisoned(rt)
        Fragile.broken = set()
        acks = await asyncio.gather(*(ref.replay_dead_letter(dead.id) for _ in range(5)))
        assert sorted(a.status for a in acks) == ["accepted"] + ["duplicate"] * 4
        assert {a.seq for a in acks} == {5}
        assert await ref.query(Fragile.values) == [1, 3, 4, 2]
        assert Fragile.calls[2] == 4


async def test_discarding_a_dead_letter_removes_it_without_applying_it(db_path: str) -> None:
    async with _open(db_path) as rt:
        ref, dead = await _poisoned(rt)
        Fragile.broken = set()
        assert await ref.discard_dead_letter(dead.id) is True
        assert await ref.dead_letters() == []
        assert await ref.discard_dead_letter(dead.id) is False
        with pytest.raises(corral.DeadLetterNotFoundError):
            await ref.replay_dead_letter(dead.id)
        await _send_items(ref, [5])
        assert await ref.query(Fragile.values) == [1, 3, 4, 5]
        assert Fragile.calls[2] == 3
    assert sql(db_path, "SELECT count(*) FROM dead_letters") == [(0,)]
    async with _open(db_path) as rt:  # a restart does not bring the discarded signal back
        ref = rt.ref(Fragile, "k")
        assert await ref.query(Fragile.values) == [1, 3, 4, 5]
        assert (await ref.describe()).hosted_here
        assert Fragile.calls[2] == 3


async def test_a_dead_letter_id_is_never_given_to_a_later_letter(db_path: str) -> None:
    """An operator's retried discard (or replay) of a letter that is gone must find
    nothing, never the next letter that happened to get the same id."""
    async with _open(db_path) as rt:
        ref, first = await _poisoned(rt)
        assert await ref.discard_dead_letter(first.id) is True
        Fragile.broken = {6}
        await _send_items(ref, [5, 6, 7])
        assert await ref.query(Fragile.values) == [1, 3, 4, 5, 7]
        [second] = await ref.dead_letters()
        assert second.id != first.id
        assert await ref.discard_dead_letter(first.id) is False  # the retried discard
        with pytest.raises(corral.DeadLetterNotFoundError):
            await ref.replay_dead_letter(first.id)
        assert [d.id for d in await ref.dead_letters()] == [second.id]


async def test_dead_letters_are_read_page_by_page_after_the_last_id_seen(db_path: str) -> None:
    async with _open(db_path) as rt:
        Fragile.broken = {1, 2, 3}
        ref = rt.ref(Fragile, "k")
        await _send_items(ref, [1, 2, 3, 4])
        assert await ref.query(Fragile.values) == [4]
        first = await rt.dead_letters(Fragile, limit=2)
        rest = await rt.dead_letters(Fragile, limit=2, after=first[-1].id)
        assert [d.message_id for d in first + rest] == ["m-1", "m-2", "m-3"]
        assert await ref.dead_letters(after=rest[-1].id) == []
        assert await ref.dead_letters(after=first[0].id) == [first[1], *rest]
        for bad in (-1, "3", True, 1.5, 2**63):
            with pytest.raises(corral.InvalidArgumentError):
                await rt.dead_letters(after=bad)  # type: ignore[arg-type]


async def test_a_dead_letter_belongs_to_its_entity_and_replays_only_into_a_running_run(
    db_path: str,
) -> None:
    async with _open(db_path) as rt:
        ref, dead = await _poisoned(rt)
        other = rt.ref(Fragile, "other")
        await _send_items(other, [9])
        with pytest.raises(corral.DeadLetterNotFoundError):
            await other.replay_dead_letter(dead.id)
        assert await other.discard_dead_letter(dead.id) is False

        await ref.terminate("closed for the test")
        with pytest.raises(corral.EntityNotRunningError):
            await ref.replay_dead_letter(dead.id)
        assert await ref.dead_letters() == [dead]  # still there for later


async def test_replays_and_discards_go_through_the_authorize_hook(db_path: str) -> None:
    seen: list[tuple[str | None, str, str]] = []

    def authorize(req: corral.AuthRequest) -> str | bool | None:
        seen.append((req.sender, req.kind, req.key))
        return req.sender != "intruder" and req.sender

    async with _open(db_path, authorize=authorize) as rt:
        ref, dead = await _poisoned(rt)
        with pytest.raises(corral.UnauthorizedError):
            await ref.replay_dead_letter(dead.id, sender="intruder")
        with pytest.raises(corral.UnauthorizedError):
            await ref.discard_dead_letter(dead.id, sender="intruder")
        assert await ref.dead_letters() == [dead]
        assert ("intruder", "replay", "k") in seen
        assert ("intruder", "discard", "k") in seen
        Fragile.broken = set()
        assert (await ref.replay_dead_letter(dead.id, sender="ops")).status == "accepted"
        assert ("ops", "replay", "k") in seen
        assert await ref.query(Fragile.values) == [1, 3, 4, 2]


async def test_a_host_whose_lease_is_gone_cannot_record_a_dead_letter(db_path: str) -> None:
    async with _open(db_path) as rt:
        ref = rt.ref(Fragile, "k")
        await _send_items(ref, [1])
        [entry] = await rt.store.journal("Fragile", "k", run_id=1, after_seq=0)
        zombie = Fence(ref.shard, "zombie-host", 1)
        with pytest.raises(corral.LeaseLostError):
            await rt.store.record_dead_letter(zombie, entry, error="E: x", traceback="tb",
                                              attempts=3, failed_at=time.time())
        assert await rt.dead_letters() == []


# -- restarts and crashes ----------------------------------------------------------------


async def test_a_host_restart_does_not_retry_or_reapply_a_dead_lettered_signal(
    db_path: str,
) -> None:
    async with _open(db_path) as rt:
        ref, dead = await _poisoned(rt)
    Fragile.broken = set()  # fixed before the restart: still must not run by itself
    async with _open(db_path) as rt:
        ref = rt.ref(Fragile, "k")
        assert await ref.query(Fragile.values) == [1, 3, 4]
        assert (await ref.describe()).hosted_here
        assert Fragile.calls[2] == 3
        assert await ref.dead_letters() == [dead]
        assert (await ref.replay_dead_letter(dead.id)).status == "accepted"
        assert await ref.query(Fragile.values) == [1, 3, 4, 2]
    async with _open(db_path) as rt:  # and the replay is not undone or doubled either
        ref = rt.ref(Fragile, "k")
        assert await ref.query(Fragile.values) == [1, 3, 4, 2]
        assert await ref.dead_letters() == []


async def test_recovery_replaying_the_journal_skips_an_entry_that_has_a_dead_letter(
    db_path: str,
) -> None:
    async with _open(db_path, Opaque) as rt:
        Opaque.broken = {2}
        ref = rt.ref(Opaque, "k")
        await _send_items(ref, [1, 2, 3], handler=Opaque.item)
        assert await ref.query(Opaque.values) == [1, 3]
        [dead] = await ref.dead_letters()
        assert (dead.seq, dead.attempts) == (2, 2)
    # No snapshot could be written: the whole journal is replayed on restart.
    assert sql(db_path, "SELECT count(*) FROM snapshots") == [(0,)]
    assert sql(db_path, "SELECT seq FROM journal ORDER BY seq") == [(1,), (2,), (3,)]
    Opaque.broken = set()  # fixed: applying entry 2 now would apply it a second time later
    async with _open(db_path, Opaque) as rt:
        ref = rt.ref(Opaque, "k")
        assert await ref.query(Opaque.values) == [1, 3]
        assert (await ref.describe()).hosted_here
        assert dict(Opaque.calls) == {1: 2, 2: 2, 3: 2}  # 1 and 3 replayed, 2 skipped
        assert (await ref.replay_dead_letter(dead.id)).status == "accepted"
        assert await ref.query(Opaque.values) == [1, 3, 2]


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")
@pytest.mark.parametrize("fixed", [True, False], ids=["fixed-after-crash", "still-broken"])
async def test_a_sigkill_during_retries_does_not_lose_the_signal(
    db_path: str, tmp_path: Path, fixed: bool,
) -> None:
    attempts, ready = tmp_path / "attempts", tmp_path / "ready"
    # This module is the worker's script (see `_worker`); its output goes to `worker.log`.
    worker = Worker(tmp_path, "worker", db_path, str(attempts), str(ready),
                    script=Path(__file__))
    try:
        # The worker accepted items 1, 2, 3 and is retrying item 2 (3 waits behind it).
        await wait_until(lambda: ready.exists() and len(_read(attempts).split()) >= 2,
                         "the worker retries item 2", timeout=60.0, alive=[worker])
        worker.sigkill()
    finally:
        worker.stop()
    assert sql(db_path, "SELECT count(*) FROM dead_letters") == [(0,)]

    Crashy.broken = set() if fixed else {2}
    async with _open(db_path, Crashy, lease_ttl=1.0) as rt:
        ref = rt.ref(Crashy, "k")

        async def recovered() -> bool:  # took the dead worker's shard, applied all three
            info = await ref.describe()
            return info.hosted_here and info.applied_seq == 3
        await wait_until(recovered, "this process recovers the entity", timeout=60.0)
        dead = await ref.dead_letters()
        if fixed:
            assert await ref.query(Crashy.values) == [1, 2, 3]
            assert Crashy.calls[2] == 1
            assert dead == []
        else:
            assert await ref.query(Crashy.values) == [1, 3]
            assert Crashy.calls[2] == Crashy.retry.max_attempts == 3
            assert [(d.seq, d.message_id, d.attempts) for d in dead] == [(2, "m-2", 3)]


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _write(path: Path, text: str) -> None:
    path.write_text(text)


async def _worker(db_path: str, attempts: str, ready: str) -> None:
    """Host `Crashy` "k", send items 1, 2, 3 (2 raises forever), report, wait for SIGKILL."""
    CrashyWorker.broken = {2}
    CrashyWorker.attempts_file = Path(attempts)
    async with _open(db_path, CrashyWorker, lease_ttl=1.0) as rt:
        await _send_items(rt.ref(CrashyWorker, "k"), [1, 2, 3], handler=CrashyWorker.item)
        _write(Path(ready), "ready")
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_worker(*sys.argv[1:4]))
