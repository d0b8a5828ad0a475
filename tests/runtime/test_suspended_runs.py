"""A bug in `run()` suspends the run; it never fails it (guarantee 14, issue 22 item 5).

The run stays running, accepts and journals every message, and is retried from its
latest snapshot under the type's `run_retry`; a runtime started with fixed code, or
`ref.resume()`, retries it at once and every message is applied once, in order. A run
fails only by `corral.FailRun` or a type listed in `fail_on`.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

import corral
import corral.metrics as metrics
from entities import Reply, fresh_key
from procs import wait_until
from stores import sql

FAST = corral.RetryPolicy(max_attempts=None, initial_backoff=0.01, max_backoff=0.05)
SLOW = corral.RetryPolicy(max_attempts=None, initial_backoff=3600.0, max_backoff=3600.0)
BUG = {"on": True}  # flipped by a test: the "deploy" of a fix inside one process


class Begin(BaseModel):
    tenant: str


class _Inbox(corral.Entity):
    """Replies land in `inbox` (a signal); `run()` moves them to `answered`, in order."""

    def __init__(self, init: Begin) -> None:
        self.inbox: list[str] = []
        self.answered: list[str] = []

    @corral.signal
    def reply(self, reply: Reply) -> None:
        self.inbox.append(reply.text)

    @corral.query
    def seen(self) -> list[str]:
        return self.answered

    def answer(self, text: str) -> None:
        self.answered.append(text)

    async def run(self) -> None:
        while True:
            await self.wait_for(lambda: self.inbox)
            while self.inbox:
                self.answer(self.inbox[0])  # first answer, then take it off the inbox
                self.inbox.pop(0)
            await self.checkpoint()


class InboxV1(_Inbox):
    """The release with the bug: answering anything raises."""

    name = "Inbox"
    run_retry = FAST

    def answer(self, text: str) -> None:
        raise KeyError(f"no template for {text!r}")


class InboxV2(_Inbox):
    """The fixed release of the same type."""

    name = "Inbox"
    run_retry = FAST


class Toggled(_Inbox):
    """Buggy while `BUG["on"]`; retried only an hour later, unless resumed."""

    run_retry = SLOW

    def answer(self, text: str) -> None:
        if BUG["on"]:
            raise RuntimeError(f"bug while answering {text!r}")
        super().answer(text)


class Quitter(_Inbox):
    """Fails its run on purpose: `FailRun` for "quit", a `fail_on` type for "stop"."""

    fail_on = (PermissionError,)
    run_retry = FAST

    def answer(self, text: str) -> None:
        if text == "quit":
            raise corral.FailRun("the customer quit")
        if text == "stop":
            raise PermissionError("no longer allowed to answer")
        super().answer(text)


class Limited(_Inbox):
    """Gives up after three attempts (a finite `run_retry`)."""

    run_retry = corral.RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.02)

    def answer(self, text: str) -> None:
        raise ValueError("always")


class FragileV1(corral.Entity):
    """An activation that cannot be built: `__init__` raises for the tenant "boom"."""

    name = "Fragile"
    run_retry = FAST

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


class FragileV2(FragileV1):
    name = "Fragile"

    def __init__(self, init: Begin) -> None:  # the fix
        self.replies = []


async def _suspended(ref: Any, attempts: int = 1) -> corral.EntityDescription:
    """Wait until the entity's run is suspended after at least `attempts` attempts."""
    async def check() -> bool:
        info = await ref.describe()
        return info.suspension is not None and info.suspension.attempts >= attempts
    await wait_until(check, "the run is suspended")
    info: corral.EntityDescription = await ref.describe()
    return info


async def _resumed(ref: Any) -> None:
    """Wait until the suspension is over (the retried run got past the point)."""
    async def check() -> bool:
        return (await ref.describe()).suspension is None
    await wait_until(check, "the suspension is cleared")


async def test_a_bug_in_run_suspends_and_fixed_code_applies_every_signal_once_in_order(
    db_path: str,
) -> None:
    key = fresh_key()
    texts = [f"r{i}" for i in range(51)]
    async with corral.open_runtime(db_path, entities=[InboxV1]) as rt:
        ref = rt.ref(InboxV1, key)
        await ref.signal_with_start(InboxV1.reply, Reply(text=texts[0]),
                                    start=Begin(tenant="acme"))
        info = await _suspended(ref)
        assert info.status is corral.RunStatus.RUNNING
        for text in texts[1:]:  # 50 signals accepted while the run is suspended
            ack = await ref.signal(InboxV1.reply, Reply(text=text))
            assert ack.status == "accepted"
            assert ack.run_id == 1
        info = await _suspended(ref, attempts=2)  # retried, and failing, meanwhile
        assert info.status is corral.RunStatus.RUNNING
        assert info.accepted_seq == 51
        assert "KeyError" in info.suspension.error
        assert "no template" in info.suspension.error
        assert "Traceback" in info.suspension.error
    # The fix, deployed: a new runtime on the same store retries at once.
    async with corral.open_runtime(db_path, entities=[InboxV2]) as rt:
        ref = rt.ref(InboxV2, key)

        async def done() -> bool:
            return await ref.query(InboxV2.seen) == texts
        await wait_until(done, "every reply answered")
        await _resumed(ref)
        info = await ref.describe()
        assert info.status is corral.RunStatus.RUNNING
    assert sql(db_path, "SELECT count(*) FROM suspensions WHERE key=?", key) == [(0,)]


async def test_signals_to_a_suspended_run_are_kept_and_resume_applies_them_at_once(
    db_path: str,
) -> None:
    key = fresh_key()
    BUG["on"] = True
    try:
        async with corral.open_runtime(db_path, entities=[Toggled]) as rt:
            ref = rt.ref(Toggled, key)
            await ref.signal_with_start(Toggled.reply, Reply(text="r0"),
                                        start=Begin(tenant="acme"))
            await _suspended(ref)
            for i in range(1, 51):
                await ref.signal(Toggled.reply, Reply(text=f"r{i}"))
            # A message never brings a suspended run back early: one attempt so far,
            # the next one an hour away, nothing in memory.
            info = await ref.describe()
            assert info.suspension is not None
            assert info.suspension.attempts == 1
            assert info.suspension.next_attempt_at - info.suspension.since >= 3000
            assert not info.hosted_here
            BUG["on"] = False  # the fix
            # From another process (a client of the same store): resume now.
            async with corral.open_runtime(db_path, entities=[Toggled], host=False) as cl:
                ack = await cl.ref(Toggled, key).resume()
                assert ack.status == "accepted"

            async def done() -> bool:
                return await ref.query(Toggled.seen) == [f"r{i}" for i in range(51)]
            await wait_until(done, "every reply answered after resume()")
            await _resumed(ref)
            await ref.resume()  # resuming a run that is not suspended changes nothing
            await ref.signal(Toggled.reply, Reply(text="r51"))

            async def more() -> bool:
                return (await ref.query(Toggled.seen))[-1:] == ["r51"]
            await wait_until(more, "the run goes on")
            assert await ref.query(Toggled.seen) == [f"r{i}" for i in range(52)]
    finally:
        BUG["on"] = True


class Bumped(Toggled):
    """`Toggled` with an update: its handler does not depend on `run()`."""

    def __init__(self, init: Begin) -> None:
        super().__init__(init)
        self.bumps = 0

    @corral.update
    def bump(self) -> int:
        self.bumps += 1
        return self.bumps

    @corral.query
    def bumped(self) -> int:
        return self.bumps


async def test_an_update_to_a_suspended_run_is_applied_at_its_next_attempt_once(
    db_path: str,
) -> None:
    BUG["on"] = True
    try:
        async with corral.open_runtime(db_path, entities=[Bumped]) as rt:
            ref = rt.ref(Bumped, fresh_key())
            await ref.signal_with_start(Bumped.reply, Reply(text="r0"),
                                        start=Begin(tenant="acme"))
            await _suspended(ref)
            # Held until its next attempt (an hour away): accepted, not applied.
            with pytest.raises(corral.WaitTimeoutError, match="not applied"):
                await ref.update(Bumped.bump, update_id="u1", timeout=0.2)
            # The next attempt rebuilds the entity from its snapshot and journal and
            # applies what was kept, the update among it (answered), before run(),
            # which raises again: still suspended.
            await ref.resume()
            assert await ref.update(Bumped.bump, update_id="u1", timeout=30) == 1
            await _suspended(ref, attempts=2)
            await ref.resume()  # another attempt, another rebuild: the same answer
            await _suspended(ref, attempts=3)
            assert await ref.update(Bumped.bump, update_id="u1", timeout=30) == 1
            BUG["on"] = False  # the fix
            await ref.resume()
            await _resumed(ref)
            assert await ref.update(Bumped.bump, update_id="u2", timeout=30) == 2
            assert await ref.query(Bumped.bumped) == 2  # each update applied once
            assert await ref.query(Bumped.seen) == ["r0"]
    finally:
        BUG["on"] = True


async def test_fail_run_and_a_fail_on_type_still_fail_the_run(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Quitter]) as rt:
        quit_ref = rt.ref(Quitter, fresh_key())
        await quit_ref.signal_with_start(Quitter.reply, Reply(text="quit"),
                                         start=Begin(tenant="acme"))
        with pytest.raises(corral.EntityFailedError, match="the customer quit"):
            await quit_ref.result(timeout=10)
        stop_ref = rt.ref(Quitter, fresh_key())
        await stop_ref.signal_with_start(Quitter.reply, Reply(text="stop"),
                                         start=Begin(tenant="acme"))
        with pytest.raises(corral.EntityFailedError, match="no longer allowed"):
            await stop_ref.result(timeout=10)
        for ref in (quit_ref, stop_ref):
            info = await ref.describe()
            assert info.status is corral.RunStatus.FAILED
            assert info.suspension is None
            with pytest.raises(corral.EntityNotRunningError):
                await ref.resume()


async def test_a_finite_run_retry_fails_the_run_after_its_last_attempt(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Limited]) as rt:
        ref = rt.ref(Limited, fresh_key())
        await ref.signal_with_start(Limited.reply, Reply(text="a"), start=Begin(tenant="x"))
        with pytest.raises(corral.EntityFailedError, match="always"):
            await ref.result(timeout=10)


async def test_an_activation_that_cannot_be_built_suspends_until_fixed_code_comes(
    db_path: str,
) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=[FragileV1]) as rt:
        ref = rt.ref(FragileV1, key)
        await ref.signal_with_start(FragileV1.reply, Reply(text="a"),
                                    start=Begin(tenant="boom"))
        info = await _suspended(ref)
        assert info.status is corral.RunStatus.RUNNING
        assert "activation failed" in info.suspension.error
        assert "cannot open the ticket" in info.suspension.error
        await ref.signal(FragileV1.reply, Reply(text="b"))  # still accepted
    async with corral.open_runtime(db_path, entities=[FragileV2]) as rt:
        ref = rt.ref(FragileV2, key)

        async def done() -> bool:
            return await ref.query(FragileV2.seen) == ["a", "b"]
        await wait_until(done, "both replies applied")
        await _resumed(ref)


async def test_listing_and_metrics_show_a_suspended_run(db_path: str) -> None:
    key = fresh_key()
    BUG["on"] = True
    before = _count("corral_run_suspensions_total", "Toggled")
    async with corral.open_runtime(db_path, entities=[Toggled]) as rt:
        ref = rt.ref(Toggled, key)
        await ref.signal_with_start(Toggled.reply, Reply(text="a"), start=Begin(tenant="x"))
        info = await _suspended(ref)
        assert info.suspension is not None
        assert info.suspension.run_id == 1
        assert info.suspension.since <= \
            info.suspension.next_attempt_at
        page = await rt.entities(Toggled)
        row = next(e for e in page.items if e.key == key)
        assert row.suspended
        assert row.status is corral.RunStatus.RUNNING
        assert _count("corral_run_suspensions_total", "Toggled") == before + 1
        assert _count("corral_suspended_entities", "Toggled") >= 1


def _count(name: str, etype: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, {"entity_type": etype})
    return 0.0 if value is None else value


def test_fail_on_and_an_endless_handler_retry_are_checked_when_the_class_is_defined() -> None:
    with pytest.raises(corral.EntityDefinitionError, match="fail_on must be a tuple"):
        class BadFailOn(corral.Entity):
            fail_on = ("KeyError",)  # type: ignore[assignment]
    with pytest.raises(corral.EntityDefinitionError, match=r"retry.max_attempts must be a num"):
        class EndlessHandlers(corral.Entity):
            retry = corral.RetryPolicy(max_attempts=None)
