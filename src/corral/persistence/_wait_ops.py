"""SQLite writes and reads of durable signal waits; `_waits` decides, these do the I/O.

A delivery is open to any process (like an acceptance); opening and timing out a wait
are the host's, fenced. All of them run in the store's one writer transaction, so they
are linearised with each other and with every acceptance into the same entity.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ._records import DeliveryRequest, DeliveryResult, EntryKind, JournalEntry, WaitRecord
from ._txn import Fence, Txn
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


_CARRY = (
    f"INSERT INTO signal_waits ({WAIT_COLUMNS}, shard) SELECT etype, key, ?, name, status, "
    "opened_at, deadline, delivery_key, payload, sender, delivered_at, shard "
    "FROM signal_waits WHERE etype=? AND key=? AND run_id=? AND status='buffered'")
_FORGET_CARRIED = (
    "UPDATE signal_waits SET delivery_key=NULL, payload=NULL, sender=NULL, delivered_at=NULL "
    "WHERE etype=? AND key=? AND run_id=? AND status='buffered'")


def _wait(db: sqlite3.Connection, etype: str, key: str, run_id: int, name: str
          ) -> WaitRecord | None:
    r = db.execute(f"SELECT {WAIT_COLUMNS} FROM signal_waits WHERE etype=? AND key=? "
                   "AND run_id=? AND name=?", (etype, key, run_id, name)).fetchone()
    return None if r is None else wait_from_row(r)


def _store(db: sqlite3.Connection, w: WaitRecord, shard: int) -> None:
    db.execute(
        f"INSERT OR REPLACE INTO signal_waits ({WAIT_COLUMNS}, shard) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (w.entity_type, w.key, w.run_id, w.name, w.status.value, w.opened_at, w.deadline,
         w.delivery_key, w.payload, w.sender, w.delivered_at, shard))


def close_waits(db: sqlite3.Connection, etype: str, key: str, run_id: int, *,
                carry_to: int | None = None) -> None:
    """The run ends: close its waits still open or buffered, and forget the waits of
    the runs before it (a delivery's key is remembered for this run and the next).

    With `carry_to` (continue-as-new) a buffered delivery moves to that run's wait of
    the same name, still buffered; the closed wait left in this run keeps none."""
    if carry_to is not None:
        db.execute(_CARRY, (carry_to, etype, key, run_id))
        db.execute(_FORGET_CARRIED, (etype, key, run_id))
    db.execute("UPDATE signal_waits SET status='closed' WHERE etype=? AND key=? AND run_id=? "
               "AND status IN ('open', 'buffered')", (etype, key, run_id))
    db.execute("DELETE FROM signal_waits WHERE etype=? AND key=? AND run_id<?",
               (etype, key, run_id))


@dataclass(frozen=True, slots=True)
class DeliverOp:
    """Decide a delivery (`_waits.decide_delivery`) on `clock`, the store's: the
    machine's, which every process sharing the file reads alike."""

    req: DeliveryRequest
    clock: Callable[[], float]
    buffered: ClassVar[bool] = True  # reads only its own table; appends like an accept

    def apply(self, txn: Txn) -> DeliveryResult:
        r, db, now = self.req, txn.db, self.clock()
        row = txn.entity(r.entity_type, r.key)
        run_id = row.run_id if row is not None and r.run_id is None else (r.run_id or 0)
        asked = r.name
        target = _wait(db, r.entity_type, r.key, run_id, asked)
        if (name := wait_name(asked, target)) != asked:  # an old name: today's wait decides
            r = replace(r, name=name)
            target = _wait(db, r.entity_type, r.key, run_id, name)
        elif target is None and r.aliases and (old := under_old_name(
                [_wait(db, r.entity_type, r.key, run_id, a) for a in r.aliases])):
            r, target = replace(r, name=old.name), old  # the old code's wait is this one
        k = db.execute(f"SELECT {WAIT_COLUMNS} FROM signal_waits WHERE etype=? AND key=? "
                       "AND name IN (?, ?) AND delivery_key=? ORDER BY run_id DESC LIMIT 1",
                       (r.entity_type, r.key, asked, r.name, r.delivery_key)).fetchone()
        decision = decide_delivery(r, row, target, None if k is None else wait_from_row(k),
                                   now=now)
        entry = None
        if decision.write:
            assert decision.wait is not None
            _store(db, decision.wait, r.shard)
        if decision.wake:
            assert row is not None
            entry = JournalEntry(
                r.entity_type, r.key, row.next_seq, run_id, EntryKind.DELIVER, r.name,
                delivery_message_id(run_id, r.name, r.delivery_key), r.payload, r.sender, now)
            txn.journal_rows.append((
                r.entity_type, r.key, entry.seq, run_id, r.shard, entry.kind.value, r.name,
                entry.message_id, r.payload, r.sender, now))
            txn.dedupe_rows.append((r.entity_type, r.key, entry.message_id, entry.seq, run_id,
                                    b"", r.sender, now))
            row.next_seq += 1
            txn.put_entity(r.entity_type, r.key, row)
            db.execute("DELETE FROM timers WHERE etype=? AND key=? AND timer_id=?",
                       (r.entity_type, r.key, timer_id(r.name)))
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

    def apply(self, txn: Txn) -> WaitRecord:
        txn.check(self.fence)
        db, ident = txn.db, (self.entity_type, self.key, self.run_id)
        wait = _wait(db, *ident, self.name)
        olds = [w for w in (_wait(db, *ident, old) for old in self.aliases) if w is not None]
        d = decide_open(txn.entity(self.entity_type, self.key), wait, self.entity_type,
                        self.key, self.run_id, self.name, deadline=self.deadline, now=self.now,
                        olds=olds, aliases=self.aliases)
        return _settle(txn, self.fence, d)


@dataclass(frozen=True, slots=True)
class ExpireWaitOp:
    """An open wait's deadline passed: time it out (unless a delivery won meanwhile)."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    name: str
    now: float

    def apply(self, txn: Txn) -> WaitRecord:
        txn.check(self.fence)
        wait = _wait(txn.db, self.entity_type, self.key, self.run_id, self.name)
        return _settle(txn, self.fence, decide_expiry(wait, now=self.now))


def _settle(txn: Txn, fence: Fence, d: Decision) -> WaitRecord:
    """Store a host's wait decision, with the wait's durable timer armed while it is open."""
    w = d.wait
    assert w is not None
    for alias in d.aliases:  # an old name: its row now points here, its timer is gone
        _store(txn.db, alias, fence.shard)
        txn.db.execute("DELETE FROM timers WHERE etype=? AND key=? AND timer_id=?",
                       (w.entity_type, w.key, timer_id(alias.name)))
    if d.write:
        _store(txn.db, w, fence.shard)
    if w.deadline is not None and w.status.value == "open":
        txn.db.execute(
            "INSERT OR REPLACE INTO timers (etype, key, run_id, timer_id, shard, due_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (w.entity_type, w.key, w.run_id, timer_id(w.name), fence.shard, w.deadline))
    elif d.write:
        txn.db.execute("DELETE FROM timers WHERE etype=? AND key=? AND timer_id=?",
                       (w.entity_type, w.key, timer_id(w.name)))
    return w


def open_waits(db: sqlite3.Connection, etype: str | None, limit: int,
               after: WaitPosition | None) -> list[WaitRecord]:
    """Open waits, oldest first, after the `after` position (opened_at, etype, key,
    run_id, name)."""
    where: list[str] = ["status='open'"]
    args: list[Any] = []
    if etype is not None:
        where.append("etype=?")
        args.append(etype)
    if after is not None:
        where.append("(opened_at, etype, key, run_id, name) > (?, ?, ?, ?, ?)")
        args.extend(after)
    rows = db.execute(
        f"SELECT {WAIT_COLUMNS} FROM signal_waits WHERE {' AND '.join(where)} "
        "ORDER BY opened_at, etype, key, run_id, name LIMIT ?", (*args, limit)).fetchall()
    return [wait_from_row(r) for r in rows]
