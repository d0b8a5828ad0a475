"""Shard leases: who hosts a shard, until when, and its fencing epoch. Written once for
both engines. On PostgreSQL expiry is judged by `Txn.clock`, the database server's, the
one clock every process sharing the store agrees on; on SQLite, where each process has
only its own wall clock, by the holder's renewals as the acquirer sees them
(`_sightings`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from corral._common import MAX_SHARDS
from corral._errors import ShardCountError

from ._ops_handoff import reserved_heirs
from ._txn import Lease, LockPlan, Txn

__all__ = ["AcquireLeasesOp", "ReleaseLeasesOp", "RenewLeasesOp", "check_lease_shards"]


def _outside(shard: int, count: int) -> bool:
    """Whether no host of a store of `count` shards asks for `shard`: below 0, or past
    the count but short of where Ray's dedicated pseudo-shards begin (`MAX_SHARDS` past
    it), where only a router of another shard count lands."""
    return shard < 0 or count <= shard < count + MAX_SHARDS


def check_lease_shards(shards: Iterable[int], count: int) -> None:
    """Refuse (`ShardCountError`) a lease of a shard a store of `count` shards lacks: a
    host routing by another count would run the same keys as this store's hosts."""
    wrong = sorted(s for s in shards if _outside(s, count))
    if wrong:
        raise ShardCountError(
            f"shard {wrong[0]} is past this store's {count} shards: the host asking for "
            f"it routes by another shard count (open the runtime with shards={count})",
            store_shards=count)

_SET_LEASE = (
    "INSERT INTO leases (shard, owner, epoch, expires_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (shard) DO UPDATE SET owner = excluded.owner, epoch = excluded.epoch, "
    "expires_at = excluded.expires_at"
)


@dataclass(frozen=True, slots=True)
class AcquireLeasesOp:
    """Take every listed shard whose lease is free, ended or already ours.

    Taking a shard from someone else (or afresh) bumps its epoch: the fencing token
    that makes the previous holder's writes fail. With `force`, every listed shard is
    taken at a new epoch even if its lease is live: a restarted Ray shard actor (whose
    name maps to exactly one live incarnation) fences out its predecessor at once.
    `orphaned` shards are taken the same way: their holder is known to be dead (the
    store obtained the shard's OS or advisory lock, see `_locks`, `_pg_session`). A
    shard its holder released to an heir (`_ops_handoff`) is the heir's at once, and
    nobody else's (unless forced) until that reservation ends.

    A lease ends when its holder releases it, or when it expires: by `Txn.clock`
    (PostgreSQL: the server's) when `stale` is None; else only if the acquirer saw the
    row unchanged for a full lease term and it still is that row here (`stale`, the
    (shard, row) pairs so seen: SQLite, see `_sightings`), and a reservation ends with
    the row it reserves.
    """

    owner: str
    shards: tuple[int, ...]
    ttl: float
    count: int  # the store's shard count: a shard it lacks is refused, no row made
    force: bool = False
    orphaned: frozenset[int] = frozenset()
    stale: frozenset[tuple[int, Lease]] | None = None
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.update(s for s in self.shards if not _outside(s, self.count))
        plan.lease_update = plan.new_leases = True

    async def apply(self, txn: Txn) -> dict[int, int]:
        check_lease_shards(self.shards, self.count)
        now = await txn.clock()
        heirs = await reserved_heirs(txn, self.shards, now if self.stale is None else None)
        taken: dict[int, int] = {}
        for shard in self.shards:
            row = await txn.lease(shard)
            heir = heirs.get(shard)
            ended = row is None or self._ended(shard, row, now)
            if row is not None and row[0] == self.owner and not self.force:
                epoch = row[1]
            elif heir is not None and heir != self.owner and not self.force and not ended:
                continue  # released to another host: theirs until the reservation ends
            elif ended or self.force or shard in self.orphaned or heir == self.owner:
                epoch = (row[1] if row else 0) + 1
            else:
                continue
            taken[shard] = epoch
            txn.leases[shard] = (self.owner, epoch, now + self.ttl)
        await txn.executemany(_SET_LEASE, [(shard, self.owner, epoch, now + self.ttl)
                                           for shard, epoch in taken.items()])
        await txn.executemany("DELETE FROM lease_handoffs WHERE shard = ?",
                              [(shard,) for shard in taken])  # met, or moot: a new holder
        return taken

    def _ended(self, shard: int, row: Lease, now: float) -> bool:
        """Whether the lease `row` of `shard` has ended: released (`ReleaseLeasesOp`
        leaves it expiring at 0), or expired (see the class docstring)."""
        if self.stale is None:
            return row[2] < now
        return row[2] <= 0 or (shard, row) in self.stale


@dataclass(frozen=True, slots=True)
class RenewLeasesOp:
    """Extend the leases still held at their epoch; returns the shards that remain ours."""

    owner: str
    held: tuple[tuple[int, int], ...]
    ttl: float
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.update(shard for shard, _ in self.held)
        plan.lease_update = True

    async def apply(self, txn: Txn) -> set[int]:
        expires = await txn.clock() + self.ttl
        kept: set[int] = set()
        for shard, epoch in self.held:
            row = await txn.lease(shard)
            if row is not None and (row[0], row[1]) == (self.owner, epoch):
                kept.add(shard)
                txn.leases[shard] = (self.owner, epoch, expires)
        await txn.executemany("UPDATE leases SET expires_at = ? WHERE shard = ?",
                              [(expires, shard) for shard in sorted(kept)])
        return kept


@dataclass(frozen=True, slots=True)
class ReleaseLeasesOp:
    """Let every lease of `owner` expire now (a host shutting down), and withdraw its
    requests for other hosts' shards (`_ops_handoff`) that no holder met yet: a shard
    released to a host that is gone would wait a lease term for anyone else."""

    owner: str
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        pass

    async def apply(self, txn: Txn) -> None:
        await txn.execute("UPDATE leases SET expires_at = 0 WHERE owner = ?", self.owner)
        await txn.execute("DELETE FROM lease_handoffs WHERE requester = ? AND released = ?",
                          self.owner, False)
        for shard, (owner, epoch, _) in list(txn.leases.items()):
            if owner == self.owner:
                txn.leases[shard] = (owner, epoch, 0.0)
