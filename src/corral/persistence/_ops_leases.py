"""Shard leases: who hosts a shard, until when, and its fencing epoch. Written once for
both engines. On PostgreSQL expiry is judged by `Txn.clock`, the database server's, the
one clock every process sharing the store agrees on; on SQLite, where each process has
only its own wall clock, by the holder's renewals as the acquirer sees them
(`_sightings`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

from corral._common import MAX_SHARDS
from corral._errors import ShardCountError

from ._ops_handoff import reserved_heirs
from ._txn import Lease, LockPlan, Txn

__all__ = ["AcquireLeasesOp", "ReleaseLeasesOp", "RenewLeasesOp", "check_lease_shards",
           "lease_view"]


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

async def lease_view(q: Txn, shards: Iterable[int]) -> tuple[dict[int, Lease | None], float]:
    """{shard: (owner, epoch, expires_at) or None} of `shards`, and `Txn.clock`, in one
    read that locks nothing (`AcquireLeasesOp.narrowed`)."""
    found: dict[int, Lease | None] = dict.fromkeys(shards)
    if not found:
        return found, 0.0
    now, at = await q.clock_sql()
    listed = ",".join(str(int(s)) for s in sorted(found))  # ints only: safe inline
    rows = await q.fetchall(f"SELECT shard, owner, epoch, expires_at, {now} FROM leases "
                            f"WHERE shard IN ({listed})", *at)
    found.update({r[0]: (r[1], r[2], r[3]) for r in rows})
    return found, (rows[0][4] if rows else await q.clock())


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

    def narrowed(self, rows: Mapping[int, Lease | None], now: float) -> AcquireLeasesOp:
        """This op for only the shards it may take, judged from `rows` read without a
        lock (`lease_view`) at `now`: free, ended, ours, released (to some heir: `apply`
        tells whom), orphaned, or all when forced. A standby host finds none in a round
        where nothing changed, and then locks no row at all (it used to lock every lease
        row `FOR UPDATE` every round). `apply` judges each again under its lock."""
        if self.force:
            return self
        return replace(self, shards=tuple(
            s for s in self.shards if s in self.orphaned or (row := rows.get(s)) is None
            or row[0] in ("", self.owner) or self._ended(s, row, now)))

    def _ended(self, shard: int, row: Lease, now: float) -> bool:
        """Whether the lease `row` of `shard` has ended: released (`ReleaseLeasesOp`
        leaves it expiring at 0), or expired (see the class docstring)."""
        if self.stale is None:
            return row[2] < now
        return row[2] <= 0 or (shard, row) in self.stale


@dataclass(frozen=True, slots=True)
class RenewLeasesOp:
    """Extend the leases still held at their epoch; returns the shards that remain ours.

    One statement whatever the number of leases held (an idle host's cost must not
    grow with its shards): an `UPDATE` of the rows still `owner`'s at the held epochs.
    Its sub-select locks them (PostgreSQL: `FOR UPDATE`, in shard order like every
    batch's lease locks, see `_pg_txn`); one a takeover holds is waited for and judged
    as that takeover committed it (READ COMMITTED), so a lease taken by another holder
    is left alone and missing from the count. Only then (a lease was lost) a second
    statement reads which of them are still ours.
    """

    owner: str
    held: tuple[tuple[int, int], ...]
    ttl: float
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        pass  # the UPDATE locks the rows it extends, and only those

    async def apply(self, txn: Txn) -> set[int]:
        if not self.held:
            return set()
        now, at = await txn.clock_sql()
        pairs, args = txn.in_pairs("shard", "epoch", self.held)
        renewed = await txn.execute(
            f"UPDATE leases SET expires_at = {now} + ? WHERE shard IN (SELECT shard FROM "
            f"leases WHERE owner = ? AND {pairs} ORDER BY shard{txn.ROW_LOCK})",
            *at, self.ttl, self.owner, *args)
        if renewed == len(self.held):
            kept = {shard for shard, _ in self.held}
        else:  # lost to another holder: which ones (ours at our epoch are ours still)
            kept = {r[0] for r in await txn.fetchall(
                f"SELECT shard FROM leases WHERE owner = ? AND {pairs}", self.owner, *args)}
        for shard, _ in self.held:  # read again if a later op of the batch asks
            txn.leases.pop(shard, None)
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
