"""PostgreSQL write ops of suspended runs (the SQLite ones and the statements: `_suspensions`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._codec import storable_text
from ._pg_txn import LockPlan, PgTxn
from ._records import Suspension
from ._suspensions import CLEAR, SUSPEND, numbered
from ._txn import Fence

__all__ = ["PgClearSuspensionOp", "PgSuspendOp"]

_SUSPEND, _CLEAR = numbered(SUSPEND), numbered(CLEAR)


@dataclass(frozen=True, slots=True)
class PgSuspendOp:
    """Record (or update) the suspension of a run (fenced)."""

    fence: Fence
    record: Suspension
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)

    async def apply(self, txn: PgTxn) -> None:
        await txn.check(self.fence)
        r = self.record
        await txn.conn.execute(_SUSPEND, r.entity_type, r.key, r.run_id, self.fence.shard,
                               storable_text(r.error), r.attempts, r.since, r.next_attempt_at)


@dataclass(frozen=True, slots=True)
class PgClearSuspensionOp:
    """The run got past the point that suspended it: forget the suspension (fenced)."""

    fence: Fence
    entity_type: str
    key: str
    run_id: int
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)

    async def apply(self, txn: PgTxn) -> None:
        await txn.check(self.fence)
        await txn.conn.execute(_CLEAR, self.entity_type, self.key, self.run_id)
