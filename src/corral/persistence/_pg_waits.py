"""PostgreSQL writes and reads of durable signal waits; the twin of `_wait_ops`, with
`_waits` deciding for both.

Every op locks the entity row (`LockPlan.entities`) before it reads the wait, so a
delivery, `run()` reaching the wait, its timeout and the run's end are linearised per
entity across processes: exactly one delivery wins a wait.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ._pg_txn import LockPlan, PgTxn
from ._records import DeliveryRequest, DeliveryResult, EntryKind, JournalEntry, WaitRecord
from ._txn import Fence
from ._waits import (
    WAIT_COLUMNS,
    Decision,
    WaitPosition,
    decide_delivery,
    decide_expiry,
    decide_open,
    delivery_message_id,
    timer_id,
    under_old_name,
    wait_from_row,
    wait_name,
)

__all__ = ["DeliverOp", "ExpireWaitOp", "OpenWaitOp", "close_waits", "open_waits"]


# One statement: the copy reads the rows as they were before the update clears them.
_CARRY = (
    f"WITH c AS (INSERT INTO signal_waits ({WAIT_COLUMNS}, shard) SELECT etype, key, "
    "$4::bigint, name, status, opened_at, deadline, delivery_key, payload, sender, "
    "delivered_at, shard "
    "FROM signal_waits WHERE etype = $1 AND key = $2 AND run_id = $3 AND status = 'buffered') "
    "UPDATE signal_waits SET delivery_key = NULL, payload = NULL, sender = NULL, "
    "delivered_at = NULL WHERE etype = $1 AND key = $2 AND run_id = $3 AND status = 'buffered'")


async def _wait(conn: Any, etype: str, key: str, run_id: int, name: str) -> WaitRecord | None:
    r = await conn.fetchrow(f"SELECT {WAIT_COLUMNS} FROM signal_waits WHERE etype = $1 "
                            "AND key = $2 AND run_id = $3 AND name = $4", etype, key, run_id, name)
    return None if r is None else wait_from_row(r)


async def _store(conn: Any, w: WaitRecord, shard: int) -> None:
    await conn.execute(
        f"INSERT INTO signal_waits ({WAIT_COLUMNS}, shard) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) "
        "ON CONFLICT (etype, key, run_id, name) DO UPDATE SET status = excluded.status, "
        "opened_at = excluded.opened_at, deadline = excluded.deadline, "
        "delivery_key = excluded.delivery_key, payload = excluded.payload, "
        "sender = excluded.sender, delivered_at = excluded.delivered_at",
        w.entity_type, w.key, w.run_id, w.name, w.status.value, w.opened_at, w.deadline,
        w.delivery_key, w.payload, w.sender, w.delivered_at, shard)


async def close_waits(conn: Any, etype: str, key: str, run_id: int, *,
                      carry_to: int | None = None) -> None:
    """The run ends: close its open or buffered waits; forget the runs before it. With
    `carry_to` (continue-as-new) a buffered delivery moves to that run's wait of the
    same name, still buffered; the closed wait left in this run keeps none."""
    if carry_to is not None:
        await conn.execute(_CARRY, etype, key, run_id, carry_to)
    await conn.execute(
        "WITH c AS (UPDATE signal_waits SET status = 'closed' WHERE etype = $1 AND key = $2 "
        "AND run_id = $3 AND status IN ('open', 'buffered')) "
        "DELETE FROM signal_waits WHERE etype = $1 AND key = $2 AND run_id < $3",
        etype, key, run_id)


@dataclass(frozen=True, slots=True)
class DeliverOp:
    """Decide a delivery (`_waits.decide_delivery`) on the database server's clock, the
    one clock every process sharing the store agrees on (leases are judged by it too)."""

    req: DeliveryRequest
    buffered: ClassVar[bool] = True  # reads only its own table; appends like an accept

    def plan(self, plan: LockPlan) -> None:
        plan.ticks.add(self.req.shard)
        plan.entities.add((self.req.entity_type, self.req.key))

    async def apply(self, txn: PgTxn) -> DeliveryResult:
        r, conn = self.req, txn.conn
        row = await txn.entity(r.entity_type, r.key)
        run_id = row.run_id if row is not None and r.run_id is None else (r.run_id or 0)
        asked = r.name
        target = await _wait(conn, r.entity_type, r.key, run_id, asked)
        if (name := wait_name(asked, target)) != asked:  # an old name: today's wait decides
            r = replace(r, name=name)
            target = await _wait(conn, r.entity_type, r.key, run_id, name)
        elif target is None and r.aliases and (old := under_old_name(
                [await _wait(conn, r.entity_type, r.key, run_id, a) for a in r.aliases])):
            r, target = replace(r, name=old.name), old  # the old code's wait is this one
        k = await conn.fetchrow(
            f"SELECT {WAIT_COLUMNS} FROM signal_waits WHERE etype = $1 AND key = $2 "
            "AND name IN ($3, $4) AND delivery_key = $5 ORDER BY run_id DESC LIMIT 1",
            r.entity_type, r.key, asked, r.name, r.delivery_key)
        now = await txn.clock()
        decision = decide_delivery(r, row, target, None if k is None else wait_from_row(k),
                                   now=now)
        entry = None
        if decision.write:
            assert decision.wait is not None
            await _store(conn, decision.wait, r.shard)
        if decision.wake:
            assert row is not None
            entry = JournalEntry(
                r.entity_type, r.key, row.next_seq, run_id, EntryKind.DELIVER, r.name,
                delivery_message_id(run_id, r.name, r.delivery_key), r.payload, r.sender, now)
            await txn.append(r.shard, entry, b"")
            row.next_seq += 1
            txn.put_entity(r.entity_type, r.key, row)
            await conn.execute("DELETE FROM timers WHERE etype = $1 AND key = $2 "
                               "AND timer_id = $3", r.entity_type, r.key, timer_id(r.name))
        return DeliveryResult(decision.status, decision.wait, entry)


@dataclass(frozen=True, slots=True)
class OpenWaitOp:
    """`run()` reached a wait: open it (and arm its durable timer) or take its delivery."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    name: str
    deadline: float | None
    now: float
    aliases: tuple[str, ...] = ()
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)
        plan.entities.add((self.entity_type, self.key))

    async def apply(self, txn: PgTxn) -> WaitRecord:
        await txn.check(self.fence)
        conn, ident = txn.conn, (self.entity_type, self.key, self.run_id)
        wait = await _wait(conn, *ident, self.name)
        olds = [w for w in [await _wait(conn, *ident, old) for old in self.aliases]
                if w is not None]
        d = decide_open(await txn.entity(self.entity_type, self.key), wait, self.entity_type,
                        self.key, self.run_id, self.name, deadline=self.deadline, now=self.now,
                        olds=olds, aliases=self.aliases)
        return await _settle(txn, self.fence, d)


@dataclass(frozen=True, slots=True)
class ExpireWaitOp:
    """An open wait's deadline passed: time it out (unless a delivery won meanwhile)."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    name: str
    now: float
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)
        plan.entities.add((self.entity_type, self.key))

    async def apply(self, txn: PgTxn) -> WaitRecord:
        await txn.check(self.fence)
        wait = await _wait(txn.conn, self.entity_type, self.key, self.run_id, self.name)
        return await _settle(txn, self.fence, decide_expiry(wait, now=self.now))


async def _settle(txn: PgTxn, fence: Fence, d: Decision) -> WaitRecord:
    """Store a host's wait decision, with the wait's durable timer armed while it is open."""
    w = d.wait
    assert w is not None
    for alias in d.aliases:  # an old name: its row now points here, its timer is gone
        await _store(txn.conn, alias, fence.shard)
        await txn.conn.execute("DELETE FROM timers WHERE etype = $1 AND key = $2 "
                               "AND timer_id = $3", w.entity_type, w.key, timer_id(alias.name))
    if d.write:
        await _store(txn.conn, w, fence.shard)
    if w.deadline is not None and w.status.value == "open":
        await txn.conn.execute(
            "INSERT INTO timers (etype, key, run_id, timer_id, shard, due_at) "
            "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (etype, key, timer_id) "
            "DO UPDATE SET run_id = excluded.run_id, shard = excluded.shard, "
            "due_at = excluded.due_at",
            w.entity_type, w.key, w.run_id, timer_id(w.name), fence.shard, w.deadline)
    elif d.write:
        await txn.conn.execute("DELETE FROM timers WHERE etype = $1 AND key = $2 "
                               "AND timer_id = $3", w.entity_type, w.key, timer_id(w.name))
    return w


async def open_waits(conn: Any, etype: str | None, limit: int, after: WaitPosition | None
                     ) -> list[WaitRecord]:
    """Open waits, oldest first, after the `after` position."""
    where: list[str] = ["status = 'open'"]
    args: list[Any] = []
    if etype is not None:
        args.append(etype)
        where.append(f"etype = ${len(args)}")
    if after is not None:
        args.extend(after)
        n = len(args)
        where.append(f"(opened_at, etype, key, run_id, name) > (${n - 4}::float8, ${n - 3}, "
                     f"${n - 2}, ${n - 1}::bigint, ${n})")
    args.append(limit)
    rows = await conn.fetch(
        f"SELECT {WAIT_COLUMNS} FROM signal_waits WHERE {' AND '.join(where)} "
        f"ORDER BY opened_at, etype, key, run_id, name LIMIT ${len(args)}", *args)
    return [wait_from_row(r) for r in rows]
