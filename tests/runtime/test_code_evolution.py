"""Entities mid-life restarted under the next release of their code (issue 22's
integrated test; guarantees 2, 9, 13, 14 and 15), on both stores.

Two `Case` entities are left mid-life by release 1: each has a snapshot at seq 8 and
journal entries 9-13 after it (accepted by a process with no host), a mailbox backlog
`run()` has not taken, and a deadline 30 s ahead. `run()` of the one started with
`timer_first` sleeps on that deadline (a pending durable timer) before its signal wait;
the other's `run()` sits on its open signal wait (opened under the old name) and sleeps
afterwards. Both hold in one store when release 2 opens it. Release 2, in one go: adds
`priority` in `__init__`, adds an optional `channel` to the reply model (held in state
and in the mailbox), renames the `note` handler to `add_note` and the `manager_ok`
wait to `approval`, and turns `labels` from a comma-joined string into a list (state
version 2, an upgrade hook). The runtimes of the later releases see a clock the test
can move forward (`_JumpClock`) so the 30 s timer fires without waiting 30 s.

The last two tests are about the renamed wait itself: a wait release 1's run() opened
under the old name is closed by a delivery by the new name, and a delivery a release-1
process made under the old name reaches release 2's run().
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from pydantic import BaseModel

import corral
from procs import wait_until
from stores import sql

WAKE_IN = 30.0  # seconds: far enough that release 1 never sees the timer fire
FAST = corral.RetryPolicy(max_attempts=None, initial_backoff=0.01, max_backoff=0.05)


class _JumpClock:
    """The real clock plus an offset the test moves forward (`jump`), so a durable timer
    set by an earlier release comes due at once; `wait` notices a jump within ~20 ms."""

    def __init__(self) -> None:
        self.offset = 0.0

    def jump(self, seconds: float) -> None:
        self.offset += seconds

    def time(self) -> float:
        return time.time() + self.offset

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        if timeout is None:
            await event.wait()
            return True
        deadline = self.monotonic() + timeout
        while not event.is_set():
            remaining = deadline - self.monotonic()
            if remaining <= 0:
                return False
            # asyncio.TimeoutError: not the builtin TimeoutError before 3.11
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), min(remaining, 0.02))
        return True


# -- the models --------------------------------------------------------------------


class Start(BaseModel):
    timer_first: bool
    wake_at: float


class Reply(BaseModel):
    text: str


class ReplyV2(BaseModel):  # release 2 adds an optional field
    text: str
    channel: str = "email"


class Label(BaseModel):
    name: str


class Approval(BaseModel):
    by: str


class Outcome(BaseModel):
    approved_by: str
    woke: bool
    upgraded: bool
    priority: str
    labels: list[str]
    log: list[str]
    notes: list[list[str]]
    taken: list[list[str]]


# -- release 1 ---------------------------------------------------------------------


class CaseV1(corral.Entity):
    """`note` and `label` are applied by handlers (each logs itself); `customer_reply`
    fills the mailbox, which `run()` takes only after the timer and the wait."""

    name = "Case"
    snapshots = corral.SnapshotPolicy(every=8, keep=2)
    customer_reply = corral.signal(Reply)
    manager_ok = corral.wait(Approval)
    notes: list[Reply]

    def __init__(self, init: Start) -> None:
        self.timer_first = init.timer_first
        self.wake_at = init.wake_at
        self.woke = False
        self.labels = ""  # comma-joined
        self.notes = []
        self.log: list[str] = []
        self.taken: list[str] = []

    @corral.signal
    def note(self, reply: Reply) -> None:
        self.notes.append(reply)
        self.log.append(f"note:{reply.text}")

    @corral.signal
    def label(self, label: Label) -> None:
        self.labels = f"{self.labels},{label.name}" if self.labels else label.name
        self.log.append(f"label:{label.name}")

    async def run(self) -> None:
        if self.timer_first:
            await self.sleep_until(self.wake_at)
            self.woke = True
        await self.wait_for_signal(CaseV1.manager_ok)
        await self.sleep_until(self.wake_at)
        self.woke = True
        async for reply in self.mailbox:
            self.taken.append(reply.text)
            if reply.text == "last":
                return


# -- release 2 ---------------------------------------------------------------------


class CaseV2(corral.Entity):
    """The next release of `Case`: every change of the module docstring at once."""

    name = "Case"
    snapshots = corral.SnapshotPolicy(every=8, keep=2)
    run_retry = FAST
    state_version = 2
    customer_reply = corral.signal(ReplyV2)
    approval = corral.wait(Approval, renamed_from="manager_ok")
    notes: list[ReplyV2]
    labels: list[str]
    taken: list[ReplyV2]

    def __init__(self, init: Start) -> None:
        self.timer_first = init.timer_first
        self.wake_at = init.wake_at
        self.woke = False
        self.labels = []
        self.notes = []
        self.log: list[str] = []
        self.taken = []
        self.priority = "normal"  # new in release 2
        self.approved_by = ""
        self.upgraded = False

    @corral.upgrade(from_version=1)
    def _labels_to_list(state: dict[str, Any]) -> dict[str, Any]:
        labels = state["labels"]
        return {**state, "labels": labels.split(",") if labels else [], "upgraded": True}

    @corral.signal(renamed_from="note")
    def add_note(self, reply: ReplyV2) -> None:
        self.notes.append(reply)
        self.log.append(f"add_note:{reply.text}")

    @corral.signal
    def label(self, label: Label) -> None:
        self.labels.append(label.name)
        self.log.append(f"label:{label.name}")

    @corral.query
    def view(self) -> dict[str, Any]:
        return {"woke": self.woke, "approved_by": self.approved_by}

    def triage(self) -> None:
        if "vip" in self.labels:
            self.priority = "high"

    async def run(self) -> Outcome:
        self.triage()
        if self.timer_first:
            await self.sleep_until(self.wake_at)
            self.woke = True
        approval = await self.wait_for_signal(CaseV2.approval)
        self.approved_by = approval.by
        await self.sleep_until(self.wake_at)
        self.woke = True
        async for reply in self.mailbox:
            self.taken.append(reply)
            if reply.text == "last":
                break
        return Outcome(
            approved_by=approval.by, woke=self.woke, upgraded=self.upgraded,
            priority=self.priority,
            labels=self.labels, log=self.log,
            notes=[[n.text, n.channel] for n in self.notes],
            taken=[[r.text, r.channel] for r in self.taken])


class CaseV2Bug(CaseV2):
    """Release 2 with a bug in `run()`: `triage` still treats `labels` as a string."""

    name = "Case"

    def triage(self) -> None:
        if "vip" in self.labels.split(","):  # type: ignore[attr-defined]
            self.priority = "high"


class CaseV3(CaseV2):
    """Release 3: the fix."""

    name = "Case"


# -- release 1 takes the entities to mid-life ----------------------------------------

# Seq 1 starts the run; 2-8 are applied by a release-1 host and snapshotted at 8;
# 9-13 are accepted by a release-1 process that hosts nothing.
HOSTED: list[tuple[str, str]] = [
    ("note", "n0"), ("customer_reply", "r1"), ("label", "urgent"), ("note", "n1"),
    ("customer_reply", "r2"), ("label", "vip"), ("note", "n2"), ("customer_reply", "r3")]
TAIL: list[tuple[str, str]] = [
    ("note", "n3"), ("customer_reply", "r4"), ("label", "late"), ("note", "n4"),
    ("customer_reply", "r5")]


async def _send_v1(ref: corral.EntityRef[CaseV1], name: str, text: str) -> None:
    if name == "note":
        ack = await ref.signal(CaseV1.note, Reply(text=text))
    elif name == "label":
        ack = await ref.signal(CaseV1.label, Label(name=text))
    else:
        ack = await ref.signal(CaseV1.customer_reply, Reply(text=text))
    assert ack.status == "accepted"


async def _mid_life(db_path: str, keys: dict[str, bool]) -> None:
    """Take each key (started with `timer_first` as given) to mid-life under release 1."""
    wake_at = time.time() + WAKE_IN
    async with corral.open_runtime(db_path, entities=[CaseV1], shards=2) as rt:
        for key, timer_first in keys.items():
            ref = rt.ref(CaseV1, key)
            await ref.signal_with_start(CaseV1.note, Reply(text="n0"),
                                        start=Start(timer_first=timer_first, wake_at=wake_at))
            for name, text in HOSTED[1:]:
                await _send_v1(ref, name, text)

            async def mid_life(ref: corral.EntityRef[CaseV1] = ref,
                               timer_first: bool = timer_first) -> bool:
                info = await ref.describe()
                parked = bool(info.timers) if timer_first else \
                    [w.name for w in info.open_waits] == ["manager_ok"]
                return parked and info.snapshot_seq == 8
            await wait_until(mid_life, f"{key}: run() parked, a snapshot at seq 8")
    async with corral.open_runtime(db_path, entities=[CaseV1], shards=2, host=False) as rt:
        for key in keys:
            for name, text in TAIL:
                await _send_v1(rt.ref(CaseV1, key), name, text)
            info = await rt.ref(CaseV1, key).describe()
            assert info.status is corral.RunStatus.RUNNING
            assert info.snapshot_seq == 8
            assert info.accepted_seq == 13
            if keys[key]:  # the pending timer, 30 s ahead
                assert info.timers
                assert all(due >= wake_at for due in info.timers)
            else:  # the open wait, under its release-1 name
                assert [w.name for w in info.open_waits] == ["manager_ok"]
    for key in keys:
        assert sql(db_path, "SELECT max(applied_seq) FROM snapshots WHERE key = ?", key) \
            == [(8,)]
        assert sql(db_path, "SELECT min(seq), max(seq) FROM journal WHERE key = ? AND seq > 8",
                   key) == [(9, 13)]


# What release 1 accepted, as the release-2 handlers and run() must see it.
V1_LOG = ["note:n0", "label:urgent", "note:n1", "label:vip", "note:n2",  # the snapshot
          "add_note:n3", "label:late", "add_note:n4"]  # the tail, by release 2's handlers
V1_NOTES = [[f"n{i}", "email"] for i in range(5)]
V1_TAKEN = [[f"r{i}", "email"] for i in range(1, 6)]


async def _open_waits(ref: corral.EntityRef[Any], names: list[str]) -> bool:
    return [w.name for w in (await ref.describe()).open_waits] == names


async def _approved(ref: corral.EntityRef[CaseV2]) -> bool:
    return bool((await ref.query(CaseV2.view))["approved_by"])


async def _woke(ref: corral.EntityRef[CaseV2]) -> bool:
    return bool((await ref.query(CaseV2.view))["woke"])


async def test_entities_mid_life_carry_on_under_a_release_that_changes_their_code(
        db_path: str) -> None:
    await _mid_life(db_path, {"timer-first": True, "wait-first": False})
    clock = _JumpClock()
    async with corral.open_runtime(db_path, entities=[CaseV2], shards=2, clock=clock) as rt:
        sleeper, waiter = rt.ref(CaseV2, "timer-first"), rt.ref(CaseV2, "wait-first")
        # The wait release 1's run() sits on, delivered by its new name from here.
        got = await waiter.deliver(CaseV2.approval, Approval(by="mia"), key="ok-wait-first")
        # "delivered" once release 2's run() reopened the wait under the new name (it
        # takes over the old one), "buffered" if it has not got there yet: either way
        # run() receives it.
        assert got.status in {"delivered", "buffered"}
        await wait_until(lambda: _approved(waiter), "wait-first: run() got its approval")
        assert not (await waiter.query(CaseV2.view))["woke"]  # now on the 30 s timer

        clock.jump(2 * WAKE_IN)  # both deadlines pass
        await wait_until(lambda: _woke(waiter), "wait-first: the timer fired")
        # timer-first was never brought into memory: its due timer brings it back.
        await wait_until(lambda: _open_waits(sleeper, ["approval"]),
                         "timer-first: the timer fired and run() reached the wait")
        got = await sleeper.deliver(CaseV2.approval, Approval(by="raj"), key="ok-timer-first")
        assert got.status == "delivered"

        for ref in (sleeper, waiter):
            await ref.signal(CaseV2.add_note, ReplyV2(text="n5", channel="chat"))
            await ref.signal(CaseV2.label, Label(name="v2"))
            await ref.signal(CaseV2.customer_reply, ReplyV2(text="r6", channel="sms"))
            await ref.signal(CaseV2.customer_reply, ReplyV2(text="last", channel="sms"))
        outcomes = {ref.key: await ref.result(timeout=60) for ref in (sleeper, waiter)}
        for ref in (sleeper, waiter):
            assert await ref.dead_letters() == []
            info = await ref.describe()
            assert info.status is corral.RunStatus.COMPLETED
            assert info.open_waits == ()
            assert info.suspension is None
    for key, by in (("timer-first", "raj"), ("wait-first", "mia")):
        assert outcomes[key] == Outcome(
            approved_by=by,
            woke=True,
            upgraded=True,  # the hook ran (it alone sets this)
            priority="high",  # release 2's triage saw the upgraded labels
            labels=["urgent", "vip", "late", "v2"],  # the hook split the string
            log=[*V1_LOG, "add_note:n5", "label:v2"],  # each message applied once, in order
            notes=[*V1_NOTES, ["n5", "chat"]],
            taken=[*V1_TAKEN, ["r6", "sms"], ["last", "sms"]],
        ), key


async def test_a_bug_in_the_next_release_suspends_the_run_and_the_fix_applies_every_signal(
        db_path: str) -> None:
    await _mid_life(db_path, {"c-1": False})
    async with corral.open_runtime(db_path, entities=[CaseV2Bug], shards=2,
                                   clock=_JumpClock()) as rt:
        ref = rt.ref(CaseV2Bug, "c-1")
        await ref.signal(CaseV2Bug.add_note, ReplyV2(text="s0"))  # brings it into memory

        async def suspended(attempts: int) -> bool:
            held = (await ref.describe()).suspension
            return held is not None and held.attempts >= attempts
        await wait_until(lambda: suspended(1), "the buggy run() is suspended")
        for i in range(1, 50):  # 50 signals (s0-s49) accepted while suspended
            ack = await ref.signal(CaseV2Bug.add_note, ReplyV2(text=f"s{i}"))
            assert (ack.status, ack.run_id) == ("accepted", 1)
        await wait_until(lambda: suspended(2), "the run is retried, and fails again")
        info = await ref.describe()
        assert info.status is corral.RunStatus.RUNNING
        assert info.accepted_seq == 13 + 50
        assert info.suspension is not None
        assert "AttributeError" in info.suspension.error
        assert "split" in info.suspension.error
    clock = _JumpClock()
    async with corral.open_runtime(db_path, entities=[CaseV3], shards=2, clock=clock) as rt:
        fixed = rt.ref(CaseV3, "c-1")

        async def resumed() -> bool:
            info = await fixed.describe()
            return info.suspension is None and "approval" in [w.name for w in info.open_waits]
        await fixed.signal(CaseV3.label, Label(name="v3"))
        await wait_until(resumed, "the fixed run() gets back to its wait")
        got = await fixed.deliver(CaseV3.approval, Approval(by="mia"), key="ok-c-1")
        assert got.status == "delivered"
        clock.jump(2 * WAKE_IN)
        await fixed.signal(CaseV3.customer_reply, ReplyV2(text="last"))
        outcome = await fixed.result(timeout=60)
        assert await fixed.dead_letters() == []
    assert outcome.log == [*V1_LOG, *(f"add_note:s{i}" for i in range(50)), "label:v3"]
    assert outcome.notes == [*V1_NOTES, *([f"s{i}", "email"] for i in range(50))]
    assert outcome.taken == [*V1_TAKEN, ["last", "email"]]
    assert (outcome.approved_by, outcome.woke, outcome.upgraded, outcome.priority) == \
        ("mia", True, True, "high")
    assert outcome.labels == ["urgent", "vip", "late", "v3"]


async def test_a_wait_opened_under_its_old_name_is_delivered_and_closed_by_its_new_name(
        db_path: str) -> None:
    await _mid_life(db_path, {"w-1": False})
    async with corral.open_runtime(db_path, entities=[CaseV2], shards=2,
                                   clock=_JumpClock()) as rt:
        ref = rt.ref(CaseV2, "w-1")
        got = await ref.deliver(CaseV2.approval, Approval(by="mia"), key="ok-w-1")
        assert got.status == "delivered"  # the open wait, not a buffer for another one
        await wait_until(lambda: _approved(ref), "run() got its approval")
        assert (await ref.describe()).open_waits == ()  # run() sleeps; no wait is open


async def test_a_delivery_accepted_under_the_old_name_reaches_the_renamed_wait(
        db_path: str) -> None:
    await _mid_life(db_path, {"w-1": False})
    async with corral.open_runtime(db_path, entities=[CaseV1], shards=2, host=False) as rt:
        got_v1 = await rt.ref(CaseV1, "w-1").deliver(CaseV1.manager_ok, Approval(by="ann"),
                                                     key="ok-w-1")
        assert got_v1.status == "delivered"
    async with corral.open_runtime(db_path, entities=[CaseV2], shards=2,
                                   clock=_JumpClock()) as rt:
        ref = rt.ref(CaseV2, "w-1")
        await ref.signal(CaseV2.label, Label(name="v2"))  # brings it into memory

        async def past_or_parked() -> bool:  # got the approval, or waits for another
            return await _approved(ref) or \
                "approval" in [w.name for w in (await ref.describe()).open_waits]
        await wait_until(past_or_parked, "run() got past the wait or parked on it")
        assert (await ref.query(CaseV2.view))["approved_by"] == "ann"
