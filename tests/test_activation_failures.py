"""An activation that cannot be built never leaves a running run that silently accepts
messages (guarantee 14): it is retried with backoff, then the run fails visibly."""

from __future__ import annotations

import logging

import pytest
from pydantic import BaseModel

import corral
from entities import Reply, fresh_key
from procs import wait_until
from stores import sql

FAST_RETRY = corral.RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.05)


class Begin(BaseModel):
    tenant: str


class BeginV2(BaseModel):
    tenant: str
    region: str  # a required field added after entities were started


class Fragile(corral.Entity):
    """`__init__` raises for the tenant "boom"."""

    retry = FAST_RETRY

    def __init__(self, init: Begin) -> None:
        if init.tenant == "boom":
            raise RuntimeError("cannot open the ticket for tenant boom")
        self.replies: list[str] = []

    @corral.signal
    def reply(self, reply: Reply) -> None:
        self.replies.append(reply.text)

    @corral.query
    def seen(self) -> list[str]:
        return self.replies


class VersionedV1(corral.Entity):
    name = "Versioned"
    retry = FAST_RETRY

    def __init__(self, init: Begin) -> None:
        self.tenant = init.tenant

    @corral.signal
    def reply(self, reply: Reply) -> None:
        pass


class VersionedV2(corral.Entity):
    name = "Versioned"
    retry = FAST_RETRY

    def __init__(self, init: BeginV2) -> None:
        self.tenant = init.tenant

    @corral.signal
    def reply(self, reply: Reply) -> None:
        pass


async def test_init_raising_fails_the_run_visibly_and_later_sends_follow_the_policy(
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
        assert "activation failed after 3 attempts" in (info.runs[-1].error or "")
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


async def test_a_stored_start_input_that_no_longer_fits_its_model_fails_the_run(
    db_path: str,
) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=[VersionedV1]) as rt:
        await rt.ref(VersionedV1, key).signal_with_start(
            VersionedV1.reply, Reply(text="a"), start=Begin(tenant="acme"))
    # New code: the start model gained a required field; recovery cannot rebuild.
    async with corral.open_runtime(db_path, entities=[VersionedV2]) as rt:
        ref = rt.ref(VersionedV2, key)
        with pytest.raises(corral.EntityFailedError, match="region"):
            await ref.result(timeout=10)
        with pytest.raises(corral.EntityNotRunningError):
            await ref.signal(VersionedV2.reply, Reply(text="b"))
    assert sql(db_path, "SELECT status FROM runs WHERE key=?", key) == [("failed",)]


async def test_an_update_waiting_on_a_run_that_cannot_activate_gets_entity_failed(
    db_path: str,
) -> None:
    class Tally(BaseModel):
        n: int

    class Broken(corral.Entity):
        retry = FAST_RETRY

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
    retry = FAST_RETRY
    snapshots = corral.SnapshotPolicy(every=1)

    def __init__(self) -> None:
        self.replies: list[str] = []

    @corral.signal
    def reply(self, reply: Reply) -> None:
        self.replies.append(reply.text)


async def test_a_snapshot_that_does_not_restore_fails_the_run_with_the_restore_error(
    db_path: str,
) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=[Snappy]) as rt:
        await rt.ref(Snappy, key).signal_with_start(Snappy.reply, Reply(text="a"), start=None)
        await wait_until(lambda: sql(db_path, "SELECT count(*) FROM snapshots") == [(1,)],
                         "the snapshot is written")
    sql(db_path, "UPDATE snapshots SET state=?", b"\x00\x01\x02\x03")
    async with corral.open_runtime(db_path, entities=[Snappy]) as rt:
        with pytest.raises(corral.EntityFailedError, match="SnapshotRestoreError"):
            await rt.ref(Snappy, key).result(timeout=10)
