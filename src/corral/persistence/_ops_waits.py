"""Writes of durable signal waits, written once for both engines; `_waits` decides,
these do the I/O.

A delivery is open to any process (like an acceptance); opening and timing out a wait
are the host's, fenced. Every op takes the entity row (`LockPlan.entities`; on SQLite
the file's write lock) before it reads the wait, so a delivery, `run()` reaching the
wait, its timeout and the run's end are linearised per entity across processes:
exactly one delivery wins a wait.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

from corral._common import WaitStatus

from ._ops_steps import forget_run_steps
from ._records import DeliveryRequest, DeliveryResult, EntryKind, JournalEntry, WaitRecord
from ._suspensions import end_suspension
from ._txn import OPEN_WAITS, Fence, Fenced, LockPlan, Txn
from ._waits import (
    WAIT_COLUMNS,
    Decision,
    decide_delivery,
    decide_expiry,
    decide_open,
    delivery_message_id,
    timer_id,
    under_old_name,
    wait_from_row,
    wait_name,
)

__all__ = ["SET_TIMER", "DeliverOp", "ExpireWaitOp", "OpenWaitOp", "close_waits", "end_run"]

SET_TIMER = (
    "INSERT INTO timers (etype, key, run_id, timer_id, shard, due_at) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (etype, key, timer_id) DO UPDATE "
    "SET run_id = excluded.run_id, shard = excluded.shard, due_at = excluded.due_at"
)
_DELETE_TIMER = "DELETE FROM timers WHERE etype = ? AND key = ? AND timer_id = ?"
_STORE = (
    f"INSERT INTO signal_waits ({WAIT_COLUMNS}, shard) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (etype, key, run_id, name) DO UPDATE SET status = excluded.status, "
    "opened_at = excluded.opened_at, deadline = excluded.deadline, "
    "delivery_key = excluded.delivery_key, payload = excluded.payload, "
    "sender = excluded.sender, delivered_at = excluded.delivered_at"
)
_CARRY = (
    f"INSERT INTO signal_waits ({WAIT_COLUMNS}, shard) SELECT etype, key, "
    "CAST(? AS BIGINT), name, status, opened_at, deadline, delivery_key, payload, sender, "
    "delivered_at, shard "
    "FROM signal_waits WHERE etype = ? AND key = ? AND run_id = ? AND status = 'buffered'"
)
_FORGET_CARRIED = (
    "UPDATE signal_waits SET delivery_key = NULL, payload = NULL, sender = NULL, "
    "delivered_at = NULL WHERE etype = ? AND key = ? AND run_id = ? AND status = 'buffered'"
)


async def _wait(txn: Txn, etype: str, key: str, run_id: int, name: str) -> WaitRecord | None:
    r = await txn.fetchone(f"SELECT {WAIT_COLUMNS} FROM signal_waits WHERE etype = ? "
                           "AND key = ? AND run_id = ? AND name = ?", etype, key, run_id, name)
    return None if r is None else wait_from_row(r)


async def _store(txn: Txn, w: WaitRecord, shard: int, was: WaitStatus | None) -> None:
    """Write wait `w` over its row, which was in status `was` (None: no row), and count
    an open wait more or fewer (`_census`)."""
    await txn.execute(_STORE, w.entity_type, w.key, w.run_id, w.name, w.status.value,
                      w.opened_at, w.deadline, w.delivery_key, w.payload, w.sender,
                      w.delivered_at, shard)
    txn.add_count(w.entity_type, OPEN_WAITS, shard,
                  (w.status is WaitStatus.OPEN) - (was is WaitStatus.OPEN))


async def close_waits(txn: Txn, etype: str, key: str, run_id: int, *,
                      carry_to: int | None = None) -> None:
    """The run ends: close its waits still open or buffered (an open wait fewer each,
    `_census`), and forget the waits of the runs before it (a delivery's key is
    remembered for this run and the next; none of theirs is open: their runs ended).

    With `carry_to` (continue-as-new) a buffered delivery moves to that run's wait of
    the same name, still buffered; the closed wait left in this run keeps none."""
    if carry_to is not None:
        await txn.execute(_CARRY, carry_to, etype, key, run_id)
        await txn.execute(_FORGET_CARRIED, etype, key, run_id)
    for status in ("open", "buffered"):
        closed = await txn.execute("UPDATE signal_waits SET status = 'closed' WHERE etype = ? "
                                   "AND key = ? AND run_id = ? AND status = ?",
                                   etype, key, run_id, status)
        if closed and status == "open":
            txn.add_count(etype, OPEN_WAITS, await txn.shard_of(etype, key), -closed)
    await txn.execute("DELETE FROM signal_waits WHERE etype = ? AND key = ? AND run_id < ?",
                      etype, key, run_id)


async def end_run(txn: Txn, etype: str, key: str, run_id: int, status: str,
                  result: str | None, error: str | None, at: float) -> None:
    """The run closed (`status`): its timers, step records and suspension go, its waits
    close, its row records how."""
    await txn.execute("DELETE FROM timers WHERE etype = ? AND key = ?", etype, key)
    await forget_run_steps(txn, etype, key, run_id)
    await close_waits(txn, etype, key, run_id)
    await end_suspension(txn, etype, key, run_id)
    await txn.execute("UPDATE runs SET status = ?, result = ?, error = ?, closed_at = ? "
                      "WHERE etype = ? AND key = ? AND run_id = ?",
                      status, result, error, at, etype, key, run_id)


@dataclass(frozen=True, slots=True)
class DeliverOp:
    """Decide a delivery (`_waits.decide_delivery`) on `clock`, the store's (SQLite: the
    machine's, which every process sharing the file reads alike), or when None on the
    transaction's (PostgreSQL: the server's, the one clock every process agrees on)."""

    req: DeliveryRequest
    clock: Callable[[], float] | None = None
    buffered: ClassVar[bool] = True  # reads only its own table; appends like an accept

    def plan(self, plan: LockPlan) -> None:
        plan.ticks.add(self.req.shard)
        plan.entities.add((self.req.entity_type, self.req.key))

    async def apply(self, txn: Txn) -> DeliveryResult:
        r = self.req
        now = self.clock() if self.clock is not None else None
        row = await txn.entity(r.entity_type, r.key)
        run_id = row.run_id if row is not None and r.run_id is None else (r.run_id or 0)
        asked = r.name
        target = await _wait(txn, r.entity_type, r.key, run_id, asked)
        if (name := wait_name(asked, target)) != asked:  # an old name: today's wait decides
            r = replace(r, name=name)
            target = await _wait(txn, r.entity_type, r.key, run_id, name)
        elif target is None and r.aliases and (old := under_old_name(
                [await _wait(txn, r.entity_type, r.key, run_id, a) for a in r.aliases])):
            r, target = replace(r, name=old.name), old  # the old code's wait is this one
        k = await txn.fetchone(
            f"SELECT {WAIT_COLUMNS} FROM signal_waits WHERE etype = ? AND key = ? "
            "AND name IN (?, ?) AND delivery_key = ? ORDER BY run_id DESC LIMIT 1",
            r.entity_type, r.key, asked, r.name, r.delivery_key)
        if now is None:
            now = await txn.clock()
        decision = decide_delivery(r, row, target, None if k is None else wait_from_row(k),
                                   now=now)
        entry = None
        if decision.write:
            assert decision.wait is not None
            await _store(txn, decision.wait, r.shard,
                         None if target is None else target.status)
        if decision.wake:
            assert row is not None
            entry = JournalEntry(
                r.entity_type, r.key, row.next_seq, run_id, EntryKind.DELIVER, r.name,
                delivery_message_id(run_id, r.name, r.delivery_key), r.payload, r.sender, now)
            txn.append(r.shard, entry, b"")
            row.next_seq += 1
            txn.put_entity(r.entity_type, r.key, row)
            await txn.execute(_DELETE_TIMER, r.entity_type, r.key, timer_id(r.name))
        return DeliveryResult(decision.status, decision.wait, entry)


@dataclass(frozen=True, slots=True)
class OpenWaitOp(Fenced):
    """`run()` reached a wait: open it (and arm its durable timer) or take its delivery."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    name: str
    deadline: float | None
    now: float
    aliases: tuple[str, ...] = ()
    locks_entity: ClassVar[bool] = True

    async def apply(self, txn: Txn) -> WaitRecord:
        await txn.check(self.fence)
        ident = (self.entity_type, self.key, self.run_id)
        wait = await _wait(txn, *ident, self.name)
        olds = [w for w in [await _wait(txn, *ident, old) for old in self.aliases]
                if w is not None]
        d = decide_open(await txn.entity(self.entity_type, self.key), wait, self.entity_type,
                        self.key, self.run_id, self.name, deadline=self.deadline, now=self.now,
                        olds=olds, aliases=self.aliases)
        was = {w.name: w.status for w in (wait, *olds) if w is not None}
        return await _settle(txn, self.fence, d, was)


@dataclass(frozen=True, slots=True)
class ExpireWaitOp(Fenced):
    """An open wait's deadline passed: time it out (unless a delivery won meanwhile)."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    name: str
    now: float
    locks_entity: ClassVar[bool] = True

    async def apply(self, txn: Txn) -> WaitRecord:
        await txn.check(self.fence)
        wait = await _wait(txn, self.entity_type, self.key, self.run_id, self.name)
        was = {} if wait is None else {wait.name: wait.status}
        return await _settle(txn, self.fence, decide_expiry(wait, now=self.now), was)


async def _settle(txn: Txn, fence: Fence, d: Decision, was: Mapping[str, WaitStatus]
                  ) -> WaitRecord:
    """Store a host's wait decision, with the wait's durable timer armed while it is open.
    `was`: the status of each of this run's rows it may write, by name, as read."""
    w = d.wait
    assert w is not None
    for alias in d.aliases:  # an old name: its row now points here, its timer is gone
        await _store(txn, alias, fence.shard, was.get(alias.name))
        await txn.execute(_DELETE_TIMER, w.entity_type, w.key, timer_id(alias.name))
    if d.write:
        await _store(txn, w, fence.shard, was.get(w.name))
    if w.deadline is not None and w.status.value == "open":
        await txn.execute(SET_TIMER, w.entity_type, w.key, w.run_id, timer_id(w.name),
                          fence.shard, w.deadline)
    elif d.write:
        await txn.execute(_DELETE_TIMER, w.entity_type, w.key, timer_id(w.name))
    return w
