"""An activation that cannot be built never leaves a running run that silently accepts
messages it drops (guarantee 14): the run is suspended, visibly (`describe()`), its
messages kept, and retried with backoff until a fix; it fails only when its code says
so (`corral.FailRun`, or a type in `fail_on`)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import BaseModel

import corral
from entities import Reply, fresh_key
from procs import wait_until
from stores import sql

FAST_RETRY = corral.RetryPolicy(max_attempts=None, initial_backoff=0.01, max_backoff=0.05)


class Begin(BaseModel):
    tenant: str


class BeginV2(BaseModel):
    tenant: str
    region: str  # a required field added after entities were started


class Fragile(corral.Entity):
    """`__init__` fails the run for the tenant "boom" (`FailRun`), and has a bug for the
    tenant "bug" (which suspends the run)."""

    run_retry = FAST_RETRY

    def __init__(self, init: Begin) -> None:
        if init.tenant == "boom":
            raise corral.FailRun("cannot open the ticket for tenant boom")
        if init.tenant == "bug":
            raise RuntimeError("a bug in __init__")
        self.replies: list[str] = []

    @corral.signal
    def reply(self, reply: Reply) -> None:
        self.replies.append(reply.text)

    @corral.query
    def seen(self) -> list[str]:
        return self.replies


class VersionedV1(corral.Entity):
    name = "Versioned"
    run_retry = FAST_RETRY

    def __init__(self, init: Begin) -> None:
        self.tenant = init.tenant

    @corral.signal
    def reply(self, reply: Reply) -> None:
        pass


class VersionedV2(corral.Entity):
    name = "Versioned"
    run_retry = FAST_RETRY

    def __init__(self, init: BeginV2) -> None:
        self.tenant = init.tenant

    @corral.signal
    def reply(self, reply: Reply) -> None:
        pass


async def _suspension(ref: Any) -> corral.persistence.Suspension:
    async def check() -> bool:
        return (await ref.describe()).suspension is not None
    await wait_until(check, "the run is suspended")
    found = (await ref.describe()).suspension
    assert found is not None
    return found


async def test_init_with_a_bug_suspends_the_run_visibly_and_keeps_its_messages(
    db_path: str,
) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=[Fragile]) as rt:
        ref = rt.ref(Fragile, key)
        await ref.signal_with_start(Fragile.reply, Reply(text="a"), start=Begin(tenant="bug"))
        found = await _suspension(ref)
        assert "activation failed" in found.error
        assert "a bug in __init__" in found.error
        assert (await ref.describe()).status is corral.RunStatus.RUNNING
        ack = await ref.signal(Fragile.reply, Reply(text="b"))  # accepted, kept
        assert ack.run_id == 1
    assert sql(db_path, "SELECT status FROM runs WHERE key=?", key) == [("running",)]
    assert sql(db_path, "SELECT count(*) FROM journal WHERE key=?", key) == [(2,)]


async def test_init_failing_the_run_fails_it_visibly_and_later_sends_follow_the_policy(
    db_path: str, caplog: pytest.LogCaptureFixture,
) -> None:
    key = fresh_key()
    caplog.set_level(logging.WARNING, logger="corral")
    async with corral.open_runtime(db_path, entities=[Fragile]) as rt:
        ref = rt.ref(Fragile, key)
        ack = await ref.signal_with_start(Fragile.reply, Reply(text="a"),
                                          start=Begin(tenant="boom"))
        assert ack.started
        with pytest.raises(corral.EntityFailedError, match="cannot open the ticket"):
            await ref.result(timeout=10)
        info = await ref.describe()
        assert info.status is corral.RunStatus.FAILED
        assert "activation failed after 1 attempts" in (info.runs[-1].error or "")
        # A plain signal is refused, never accepted into a run that cannot apply it.
        with pytest.raises(corral.EntityNotRunningError):
            await ref.signal(Fragile.reply, Reply(text="b"))
        # signal-with-start follows IdReusePolicy (ALLOW_DUPLICATE: a new run).
        again = await ref.signal_with_start(Fragile.reply, Reply(text="c"),
                                            start=Begin(tenant="acme"))
        assert again.started
        assert again.run_id == ack.run_id + 1
        assert await ref.query(Fragile.seen, activate=True) == ["c"]
    failed = [r for r in caplog.records if "the run is failed" in r.getMessage()]
    assert len(failed) == 1
    assert "Fragile" in failed[0].getMessage()
    assert key in failed[0].getMessage()
    assert f"run {ack.run_id}" in failed[0].getMessage()


async def test_a_stored_start_input_that_no_longer_fits_its_model_suspends_the_run(
    db_path: str,
) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=[VersionedV1]) as rt:
        await rt.ref(VersionedV1, key).signal_with_start(
            VersionedV1.reply, Reply(text="a"), start=Begin(tenant="acme"))
    # New code: the start model gained a required field; recovery cannot rebuild. The
    # run is suspended (a release fixing the model brings it back), never failed.
    async with corral.open_runtime(db_path, entities=[VersionedV2]) as rt:
        ref = rt.ref(VersionedV2, key)
        assert "region" in (await _suspension(ref)).error
        await ref.signal(VersionedV2.reply, Reply(text="b"))  # still accepted
    assert sql(db_path, "SELECT status FROM runs WHERE key=?", key) == [("running",)]


async def test_an_update_waiting_on_a_run_whose_init_fails_it_gets_entity_failed(
    db_path: str,
) -> None:
    class Tally(BaseModel):
        n: int

    class Broken(corral.Entity):
        fail_on = (ValueError,)

        def __init__(self, init: Begin) -> None:
            raise ValueError("no tally for you")

        @corral.update
        def add(self, t: Tally) -> int:
            return t.n

    async with corral.open_runtime(db_path, entities=[Broken]) as rt:
        with pytest.raises(corral.EntityFailedError, match="no tally for you"):
            await rt.ref(Broken, fresh_key()).update_with_start(
                Broken.add, Tally(n=1), start=Begin(tenant="a"), timeout=10)


class Snappy(corral.Entity):
    run_retry = FAST_RETRY
    snapshots = corral.SnapshotPolicy(every=1)

    def __init__(self) -> None:
        self.replies: list[str] = []

    @corral.signal
    def reply(self, reply: Reply) -> None:
        self.replies.append(reply.text)


async def test_a_snapshot_that_does_not_restore_suspends_the_run_with_the_restore_error(
    db_path: str,
) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=[Snappy]) as rt:
        await rt.ref(Snappy, key).signal_with_start(Snappy.reply, Reply(text="a"), start=None)
        await wait_until(lambda: sql(db_path, "SELECT count(*) FROM snapshots") == [(1,)],
                         "the snapshot is written")
    sql(db_path, "UPDATE snapshots SET state=?", b"\x00\x01\x02\x03")
    async with corral.open_runtime(db_path, entities=[Snappy]) as rt:
        ref = rt.ref(Snappy, key)
        assert "SnapshotRestoreError" in (await _suspension(ref)).error
        assert (await ref.describe()).status is corral.RunStatus.RUNNING
