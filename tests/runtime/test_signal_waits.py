"""Durable signal waits: `wait_for_signal` in `run()`, `ref.deliver` from callers.

Every outcome of a delivery, every limit at and just over its bound, the wait's life
with its run (passivation, timeout, termination, continue-as-new), the operator
listing and the `authorize` hook; on both stores (`db_path`). Races between processes,
SIGKILL and restarts are in `test_signal_waits_processes.py`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

import corral
from corral.actors._waits import check_wait_timeout
from entities import fresh_key
from procs import wait_until
from stores import row_counts, sql


class Decision(BaseModel):
    approved: bool
    note: str = ""


class OrderInput(BaseModel):
    timeout: float | None = None
    hold: bool = False  # wait for `go` before reaching the wait
    generation: int = 0


class Outcome(BaseModel):
    approved: bool | None = None
    note: str = ""
    timed_out: bool = False
    generation: int = 0


class Order(corral.Entity):
    approval = corral.wait(Decision)

    def __init__(self, init: OrderInput) -> None:
        self.timeout = init.timeout
        self.hold = init.hold
        self.generation = init.generation
        self.released = False
        self.roll = False
        self.resumed = 0  # how often run() got past the wait (survives in snapshots)

    @corral.signal
    def go(self) -> None:
        self.released = True

    @corral.signal
    def roll_over(self) -> None:
        self.roll = True

    @corral.query
    def times_resumed(self) -> int:
        return self.resumed

    async def run(self) -> Outcome:
        if self.hold:
            await self.wait_for(lambda: self.released or self.roll)
            if self.roll:
                self.continue_as_new(OrderInput(generation=self.generation + 1, hold=True))
        try:
            decision = await self.wait_for_signal(Order.approval, timeout=self.timeout)
        except corral.SignalTimeoutError:
            return Outcome(timed_out=True, generation=self.generation)
        self.resumed += 1
        await self.checkpoint()
        return Outcome(approved=decision.approved, note=decision.note,
                       generation=self.generation)


class Strict(corral.Entity):
    """Refuses deliveries made before run() waits."""

    early_signals = "reject"
    approval = corral.wait(Decision)

    def __init__(self, init: OrderInput) -> None:
        self.released = False

    @corral.signal
    def go(self) -> None:
        self.released = True

    async def run(self) -> bool:
        await self.wait_for(lambda: self.released)
        return (await self.wait_for_signal(Strict.approval)).approved


class Passive(corral.Entity):
    """Passivated while it waits (idle_timeout), brought back by the delivery."""

    idle_timeout = 0.05
    approval = corral.wait(Decision)

    def __init__(self, init: OrderInput) -> None:
        self.timeout = init.timeout

    async def run(self) -> Outcome:
        try:
            d = await self.wait_for_signal(Passive.approval, timeout=self.timeout)
        except corral.SignalTimeoutError:
            return Outcome(timed_out=True)
        return Outcome(approved=d.approved)


class Timed(corral.Entity):
    """Waits with the timeout its start input names (limits are checked in run())."""

    approval = corral.wait(Decision, max_timeout=60.0)

    def __init__(self, init: OrderInput) -> None:
        self.timeout = init.timeout

    async def run(self) -> str:
        try:
            await self.wait_for_signal(Timed.approval, timeout=self.timeout)
        except corral.InvalidArgumentError as err:
            return f"refused: {err}"
        except corral.SignalTimeoutError:
            return "timed out"
        return "delivered"


ENTITIES: list[type[corral.Entity]] = [Order, Strict, Passive, Timed]
YES, NO = Decision(approved=True, note="yes"), Decision(approved=False, note="no")


async def waiting(rt: corral.Runtime, ref: corral.EntityRef[Any, Any]) -> None:
    """Until `run()` of `ref` has reached its wait (the operator listing shows it)."""
    async def listed() -> bool:
        page = await rt.signal_waits(ref.definition.name, limit=1000)
        return any(w.key == ref.key for w in page.items)
    await wait_until(listed, f"{ref!r} waits")


# -- the outcomes ----------------------------------------------------------------------


async def test_the_first_delivery_wins_its_retry_is_a_duplicate_and_others_hear_of_the_winner(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Order, fresh_key("order"))
        await ref.start(start=OrderInput())
        await waiting(rt, ref)
        won = await ref.deliver(Order.approval, YES, key="click-1", sender="ana")
        again = await ref.deliver(Order.approval, {"approved": True, "note": "yes"},
                                  key="click-1", sender="ana")
        lost = await ref.deliver(Order.approval, NO, key="click-2", sender="bob")
        outcome = await ref.result(timeout=10)
        assert await ref.query(Order.times_resumed) == 1
    assert (won.status, won.payload, won.sender, won.run_id) == ("delivered", YES, "ana", 1)
    assert won.delivered_at is not None
    assert again == corral.Delivery("duplicate", YES, "ana", won.delivered_at, 1)
    assert lost == corral.Delivery("already_delivered", YES, "ana", won.delivered_at, 1)
    assert outcome == Outcome(approved=True, note="yes")
    # The loser left nothing behind: one wait row, holding the winner.
    assert sql(db_path, "SELECT status, delivery_key, sender FROM signal_waits WHERE key=?",
               ref.key) == [("delivered", "click-1", "ana")]


async def test_a_key_reused_with_another_payload_or_sender_conflicts(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Order, fresh_key("order"))
        await ref.start(start=OrderInput())
        await waiting(rt, ref)
        await ref.deliver(Order.approval, YES, key="k", sender="ana")
        with pytest.raises(corral.IdempotencyConflictError) as payload:
            await ref.deliver(Order.approval, NO, key="k", sender="ana")
        with pytest.raises(corral.IdempotencyConflictError) as sender:
            await ref.deliver(Order.approval, YES, key="k", sender="bob")
        assert (await ref.result(timeout=10)).approved is True
    assert (payload.value.key, payload.value.message_id) == (ref.key, "k")
    assert "bob" in str(sender.value)


async def test_concurrent_deliveries_have_exactly_one_winner_that_every_caller_is_told(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Order, fresh_key("order"))
        await ref.start(start=OrderInput())
        await waiting(rt, ref)
        answers = await asyncio.gather(*(
            ref.deliver(Order.approval, Decision(approved=i % 2 == 0, note=f"m{i}"),
                        key=f"k{i}", sender=f"manager-{i}") for i in range(30)))
        outcome = await ref.result(timeout=10)
    winners = [a for a in answers if a.status == "delivered"]
    assert len(winners) == 1
    assert {a.status for a in answers} == {"delivered", "already_delivered"}
    assert winners[0].payload is not None
    assert {(repr(a.payload), a.sender, a.delivered_at) for a in answers} == \
        {(repr(winners[0].payload), winners[0].sender, winners[0].delivered_at)}
    assert outcome.note == winners[0].payload.note


async def test_a_delivery_before_the_wait_is_buffered_and_the_first_one_wins_when_run_gets_there(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Order, fresh_key("order"))
        await ref.start(start=OrderInput(hold=True))
        early = await ref.deliver(Order.approval, NO, key="early", sender="ana")
        later = await ref.deliver(Order.approval, YES, key="later", sender="bob")
        retry = await ref.deliver(Order.approval, NO, key="early", sender="ana")
        assert (await rt.signal_waits(Order)).items == []  # buffered is not waiting
        await ref.signal(Order.go)
        outcome = await ref.result(timeout=10)
        after = await ref.deliver(Order.approval, YES, key="after")
    assert (early.status, early.payload, early.run_id) == ("buffered", NO, 1)
    assert (later.status, later.payload, later.sender) == ("already_delivered", NO, "ana")
    assert retry.status == "duplicate"
    assert outcome == Outcome(approved=False, note="no")
    assert (after.status, after.payload) == ("already_delivered", NO)


async def test_a_type_that_rejects_early_deliveries_answers_not_waiting_and_keeps_nothing(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Strict, fresh_key("strict"))
        await ref.start(start=OrderInput())
        early = await ref.deliver(Strict.approval, YES, key="early")
        assert row_counts(db_path)["signal_waits"] == 0
        await ref.signal(Strict.go)
        await waiting(rt, ref)
        late = await ref.deliver(Strict.approval, NO, key="early")  # the key was not kept
        assert await ref.result(timeout=10) is False
    assert early == corral.Delivery("not_waiting", None, None, None, None)
    assert (late.status, late.payload) == ("delivered", NO)


async def test_a_timed_out_wait_raises_in_run_and_answers_stale_for_good(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Order, fresh_key("order"))
        await ref.start(start=OrderInput(timeout=0.05))
        assert await ref.result(timeout=10) == Outcome(timed_out=True)
        late = await ref.deliver(Order.approval, YES, key="late", sender="ana")
    assert (late.status, late.payload, late.run_id) == ("stale", None, 1)
    assert sql(db_path, "SELECT status FROM signal_waits WHERE key=?", ref.key) == \
        [("timed_out",)]


async def test_delivering_to_an_entity_that_is_not_running_raises(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        never = rt.ref(Order, fresh_key("never"))
        with pytest.raises(corral.EntityNotRunningError, match="never started"):
            await never.deliver(Order.approval, YES, key="k")
        ended = rt.ref(Strict, fresh_key("ended"))  # ends before it ever waits
        await ended.start(start=OrderInput())
        await ended.terminate("cancelled")
        with pytest.raises(corral.EntityNotRunningError, match="terminated"):
            await ended.deliver(Strict.approval, YES, key="k")
    assert row_counts(db_path)["signal_waits"] == 0


async def test_termination_closes_an_open_wait_and_a_delivery_after_it_is_stale(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Order, fresh_key("order"))
        await ref.start(start=OrderInput())
        await waiting(rt, ref)
        await ref.terminate("withdrawn")
        late = await ref.deliver(Order.approval, YES, key="late")
        assert (await rt.signal_waits()).items == []
    assert (late.status, late.run_id) == ("stale", 1)


async def test_a_delivery_buffered_before_continue_as_new_is_received_by_the_next_runs_wait(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Order, fresh_key("order"))
        await ref.start(start=OrderInput(hold=True))
        buffered = await ref.deliver(Order.approval, NO, key="k1", sender="ana")
        await ref.signal(Order.roll_over)  # run 1 continues as new before it waits
        await wait_until(lambda: _run_ids(db_path, ref.key) == [1, 2], "run 2 started")
        to_run_1 = await ref.deliver(Order.approval, YES, key="k2", run_id=1)
        retry = await ref.deliver(Order.approval, NO, key="k1", sender="ana")
        other = await ref.deliver(Order.approval, YES, key="k3", sender="bob")
        await ref.signal(Order.go)
        outcome = await ref.result(timeout=10)
    assert (buffered.status, buffered.run_id) == ("buffered", 1)
    assert (to_run_1.status, to_run_1.payload, to_run_1.run_id) == ("stale", None, 1)
    # Carried like an unconsumed signal: run 2's wait holds it, and it counted there.
    assert retry == corral.Delivery("duplicate", NO, "ana", buffered.delivered_at, 2)
    assert other == corral.Delivery("already_delivered", NO, "ana", buffered.delivered_at, 2)
    assert outcome == Outcome(approved=False, note="no", generation=1)
    assert sql(db_path, "SELECT run_id, status, delivery_key FROM signal_waits WHERE key=?",
               ref.key) == [(2, "delivered", "k1")]


async def test_a_retry_of_a_buffered_delivery_whose_run_ended_before_waiting_is_stale(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Order, fresh_key("order"))
        await ref.start(start=OrderInput(hold=True))
        buffered = await ref.deliver(Order.approval, YES, key="k", sender="ana")
        await ref.terminate("withdrawn")  # before run() ever reached the wait
        retry = await ref.deliver(Order.approval, YES, key="k", sender="ana")
        with pytest.raises(corral.IdempotencyConflictError):
            await ref.deliver(Order.approval, NO, key="k", sender="ana")
    assert (buffered.status, buffered.run_id) == ("buffered", 1)
    # Not "duplicate": the caller is told its delivery was never used.
    assert retry == corral.Delivery("stale", None, None, None, 1)


def _run_ids(db_path: str, key: str) -> list[int]:
    return [r[0] for r in sql(db_path, "SELECT run_id FROM runs WHERE key=? ORDER BY run_id",
                              key)]


# -- durability within one process ---------------------------------------------------------


async def test_a_passivated_waiting_entity_is_brought_back_by_its_delivery(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Passive, fresh_key("passive"))
        await ref.start(start=OrderInput())
        await waiting(rt, ref)
        host = rt.host
        assert host is not None
        await wait_until(lambda: host.shards[ref.shard].get("Passive", ref.key) is None,
                         "the waiting entity is passivated")
        won = await ref.deliver(Passive.approval, YES, key="k")
        assert won.status == "delivered"
        assert await ref.result(timeout=10) == Outcome(approved=True)


async def test_a_wait_reached_again_after_a_restart_returns_the_retained_delivery(
        db_path: str) -> None:
    key = fresh_key("order")
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Order, key)
        await ref.start(start=OrderInput(hold=True))
        await ref.signal(Order.go)
        await waiting(rt, ref)
    async with corral.open_runtime(db_path, entities=ENTITIES, host=False) as client:
        won = await client.ref(Order, key).deliver(Order.approval, YES, key="k")
    assert won.status == "delivered"  # decided with no host running
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        assert await rt.ref(Order, key).result(timeout=10) == Outcome(approved=True, note="yes")


async def test_a_passivated_wait_times_out_at_its_original_deadline(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Passive, fresh_key("passive"))
        await ref.start(start=OrderInput(timeout=0.6))
        await waiting(rt, ref)
        deadline = (await rt.signal_waits(Passive)).items[0].deadline
        host = rt.host
        assert host is not None
        assert deadline is not None
        await wait_until(lambda: host.shards[ref.shard].get("Passive", ref.key) is None,
                         "the waiting entity is passivated")
        assert await ref.result(timeout=10) == Outcome(timed_out=True)
        # The durable timer brought it back; the wait kept its deadline.
        assert sql(db_path, "SELECT deadline FROM signal_waits WHERE key=?", ref.key) == \
            [(pytest.approx(deadline),)]


# -- limits: each refused at the boundary, nothing stored -------------------------------------


async def test_delivery_keys_are_1_to_512_utf8_bytes_without_control_characters(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Strict, fresh_key("strict"))
        await ref.start(start=OrderInput())
        before = row_counts(db_path)
        for bad in ("", "é" * 256 + "x", "k\x00", "k\n", "\ud800", 7):
            with pytest.raises(corral.InvalidKeyError):
                await ref.deliver(Strict.approval, YES, key=bad)  # type: ignore[arg-type]
        assert row_counts(db_path) == before
        at_limit = await ref.deliver(Strict.approval, YES, key="é" * 256)  # 512 bytes
        assert at_limit.status == "not_waiting"


async def test_a_delivery_must_fit_its_waits_model_and_the_payload_limit(db_path: str) -> None:
    limits = corral.Limits(max_payload_bytes=200)
    async with corral.open_runtime(db_path, entities=ENTITIES, limits=limits) as rt:
        ref = rt.ref(Order, fresh_key("order"))
        await ref.start(start=OrderInput(hold=True))
        before = row_counts(db_path)
        with pytest.raises(corral.InvalidPayloadError, match="approved"):
            await ref.deliver(Order.approval, {"approved": "perhaps"}, key="k")
        with pytest.raises(corral.InvalidPayloadError):
            await ref.deliver(Order.approval, Decision.model_construct(approved="x"),  # type: ignore[arg-type]
                              key="k")
        with pytest.raises(corral.PayloadTooLargeError):
            await ref.deliver(Order.approval, Decision(approved=True, note="x" * 200), key="k")
        with pytest.raises(corral.InvalidPayloadError):
            await ref.deliver(Order.approval, Decision(approved=True, note="\ud800"), key="k")
        with pytest.raises(corral.UnknownHandlerError, match="not a wait of Order"):
            await ref.deliver(Strict.approval, YES, key="k")  # another type's wait
        with pytest.raises(corral.UnknownHandlerError, match="the wait itself"):
            await ref.deliver("approval", YES, key="k")  # type: ignore[arg-type]
        with pytest.raises(corral.InvalidArgumentError):
            await ref.deliver(Order.approval, YES, key="k", run_id=0)
        with pytest.raises(corral.InvalidKeyError):
            await ref.deliver(Order.approval, YES, key="k", sender="a\x00b")
        assert row_counts(db_path) == before
        fits = Decision(approved=True, note="x" * 150)
        assert (await ref.deliver(Order.approval, fits, key="k")).status == "buffered"


@pytest.mark.parametrize(("timeout", "refused"), [
    (0.001, False), (0.0009, True), (60.0, False), (60.001, True), (0, True), (-1, True),
])
async def test_a_waits_timeout_is_between_1_ms_and_its_max_timeout(
        tmp_path: Any, timeout: float, refused: bool) -> None:
    async with corral.open_runtime(str(tmp_path / "s.db"), entities=ENTITIES) as rt:
        ref = rt.ref(Timed, "t")
        await ref.start(start={"timeout": timeout})
        if not refused:
            await waiting(rt, ref) if timeout > 1 else None
            await ref.deliver(Timed.approval, YES, key="k")
        result = await ref.result(timeout=10)
    assert result.startswith("refused") == refused, result
    if refused:
        assert row_counts(str(tmp_path / "s.db"))["signal_waits"] == 0


def test_the_default_longest_timeout_is_7_days() -> None:
    week = Order.approval.definition
    assert check_wait_timeout(week, 7 * 86400.0) == 7 * 86400.0
    with pytest.raises(corral.InvalidArgumentError, match="604800"):
        check_wait_timeout(week, 7 * 86400.0 + 0.001)


def test_a_timeout_that_is_not_a_number_of_seconds_is_refused() -> None:
    wait = Timed.approval.definition
    for bad in (float("nan"), float("inf"), True, "1", None):
        if bad is None:
            assert check_wait_timeout(wait, bad) is None
            continue
        with pytest.raises(corral.InvalidArgumentError, match="timeout"):
            check_wait_timeout(wait, bad)


def test_a_wait_name_is_1_to_200_characters_without_surrounding_space_or_controls() -> None:
    assert corral.wait(Decision, name="n" * 200).name == "n" * 200
    for bad in ("", "n" * 201, " padded", "padded ", "a\tb", "a\x00b", "\ud800"):
        with pytest.raises(corral.EntityDefinitionError):
            corral.wait(Decision, name=bad)
    with pytest.raises(corral.EntityDefinitionError, match="pydantic model"):
        corral.wait(dict)  # type: ignore[type-var]
    with pytest.raises(corral.EntityDefinitionError, match="max_timeout"):
        corral.wait(Decision, max_timeout=0)


def test_definition_checks_see_waits_and_early_signals() -> None:
    with pytest.raises(corral.EntityDefinitionError) as err:
        class Bad(corral.Entity):
            early_signals = "drop"
            first = corral.wait(Decision, name="same")
            second = corral.wait(Decision, name="same")
            run_id = corral.wait(Decision)  # type: ignore[assignment]
    text = str(err.value)
    assert "early_signals" in text
    assert "'same'" in text
    assert "run_id" in text

    class Base(corral.Entity):
        approval = corral.wait(Decision)

    class Child(Base):
        pass

    assert set(Child._corral_definition.waits) == {"approval"}
    assert Base._corral_definition.fingerprint != Order._corral_definition.fingerprint


async def test_waiting_on_an_undeclared_wait_suspends_the_run_with_a_clear_error(
        tmp_path: Any) -> None:
    class Stray(corral.Entity):
        async def run(self) -> None:
            await self.wait_for_signal(Order.approval)

    async with corral.open_runtime(str(tmp_path / "s.db"), entities=[Stray]) as rt:
        ref = rt.ref(Stray, "s")
        await ref.start(start=None)

        async def suspended() -> bool:
            return (await ref.describe()).suspension is not None
        await wait_until(suspended, "the run is suspended (a bug in run())")
        found = (await ref.describe()).suspension
        assert found is not None
        assert "not a wait of Stray" in found.error


# -- operators and authorization ------------------------------------------------------------


async def test_open_waits_are_listed_oldest_first_in_pages_without_payloads(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        refs = [rt.ref(Order, f"list-{i}") for i in range(5)]
        for i, ref in enumerate(refs):
            await ref.start(start=OrderInput(timeout=3600 if i % 2 else None))
            await waiting(rt, ref)
        strict = rt.ref(Strict, "list-strict")
        await strict.start(start=OrderInput())
        await strict.signal(Strict.go)
        await waiting(rt, strict)
        await refs[2].deliver(Order.approval, YES, key="k")  # no longer open
        await refs[2].result(timeout=10)

        pages, after = [], None
        while True:
            page = await rt.signal_waits(Order, limit=2, after=after)
            pages.append(page.items)
            if page.next_cursor is None:
                break
            after = page.next_cursor
        every = (await rt.signal_waits()).items
        with pytest.raises(corral.InvalidArgumentError):
            await rt.signal_waits(after="not-a-cursor")
        with pytest.raises(corral.InvalidArgumentError):
            await rt.signal_waits(limit=0)
    listed = [w for p in pages for w in p]
    assert [len(p) for p in pages] == [2, 2]
    assert [w.key for w in listed] == ["list-0", "list-1", "list-3", "list-4"]
    assert [w.waiting_since for w in listed] == sorted(w.waiting_since for w in listed)
    assert [w.deadline is None for w in listed] == [True, False, False, True]
    assert all(w.name == "approval" and w.run_id == 1 for w in listed)
    assert not hasattr(listed[0], "payload")
    assert {w.key for w in every} == {"list-0", "list-1", "list-3", "list-4", "list-strict"}


async def test_authorize_sees_every_delivery_and_the_recorded_sender_is_the_authenticated_one(
        db_path: str) -> None:
    seen: list[corral.AuthRequest] = []

    def authorize(req: corral.AuthRequest) -> str | bool | None:
        seen.append(req)
        if req.kind != "deliver":
            return None
        return {"token-ana": "ana@example.com"}.get(req.sender or "", False)

    async with corral.open_runtime(db_path, entities=ENTITIES, authorize=authorize) as rt:
        ref = rt.ref(Order, fresh_key("order"))
        await ref.start(start=OrderInput())
        await waiting(rt, ref)
        with pytest.raises(corral.UnauthorizedError):
            await ref.deliver(Order.approval, YES, key="k0", sender="token-eve")
        won = await ref.deliver(Order.approval, YES, key="k1", sender="token-ana")
        await ref.result(timeout=10)
    assert won.sender == "ana@example.com"
    assert [(r.kind, r.name, r.sender) for r in seen if r.kind == "deliver"] == [
        ("deliver", "approval", "token-eve"), ("deliver", "approval", "token-ana")]
    assert sql(db_path, "SELECT sender FROM signal_waits WHERE key=?", ref.key) == \
        [("ana@example.com",)]


async def test_a_delivery_after_the_deadline_is_stale_even_before_the_host_timed_it_out(
        db_path: str) -> None:
    key = fresh_key("order")
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Order, key)
        await ref.start(start=OrderInput(timeout=0.3))
        await waiting(rt, ref)
    await asyncio.sleep(0.5)  # the deadline passes with no host running
    async with corral.open_runtime(db_path, entities=ENTITIES, host=False) as client:
        late = await client.ref(Order, key).deliver(Order.approval, YES, key="late")
    assert (late.status, late.payload) == ("stale", None)
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        assert await rt.ref(Order, key).result(timeout=10) == Outcome(timed_out=True)
