"""Graceful shard hand-off: a host asks for a shard, its holder releases it to that host.

The steps, each an op or a read here (written once for both engines, judged by
`Txn.clock` like the leases they sit beside, but for a reservation on SQLite, which
ends with the lease row it reserves, see `AcquireLeasesOp`):

1. The receiver *requests* the shard (`RequestLeasesOp`): a `lease_handoffs` row naming
   it, valid for one lease term. A requester keeps renewing its request while it waits,
   so the request of a requester that died expires by itself.
2. The holder reads the live requests for its shards several times a second
   (`requests_for`), stops taking work for the shard, lets the commits in flight land,
   and releases the lease *to* the requester (`HandOffLeaseOp`): the lease row loses
   its owner (fencing the holder out) and stays reserved for the heir for one term.
3. The heir takes it at once at the next epoch (`AcquireLeasesOp` consults
   `reserved_heirs`); any other host, even one that finds the shard's OS or advisory
   lock free, leaves it alone until the reservation ends. If the heir dies before
   taking it, the shard is anyone's when the reservation ends: within one lease term.

The hosts alive to receive shards (`live_hosts`, the heirs of a host that closes) are
the processes registered as hosts in the registry of builds (`build_processes`, kept
live by each process's registration, see `runtime/_build_registration`): one notion of a live
process, not a second table beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ._txn import Fence, LockPlan, Txn

__all__ = ["HandOffLeaseOp", "RequestLeasesOp", "held_by", "live_hosts", "offered_to",
           "requests_for", "reserved_heirs"]

_SET_HANDOFF = (
    "INSERT INTO lease_handoffs (shard, requester, until, released) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (shard) DO UPDATE SET requester = excluded.requester, "
    "until = excluded.until, released = excluded.released"
)


async def reserved_heirs(txn: Txn, shards: Sequence[int], now: float | None
                         ) -> dict[int, str]:
    """{shard: heir} of `shards` released to a host that has not taken them yet, and
    whose reservation lasts past `now` (None: whenever it ends; the caller judges that
    by the lease row, see `AcquireLeasesOp`)."""
    rows = await txn.fetchall("SELECT shard, requester, until FROM lease_handoffs "
                              "WHERE released = ?", True)
    wanted = set(shards)
    return {r[0]: r[1] for r in rows if r[0] in wanted and (now is None or r[2] > now)}


async def offered_to(q: Txn, heir: str) -> set[int]:
    """The shards released to `heir` that it has not taken yet (a read: the requester
    polls it while it waits, and takes them through `AcquireLeasesOp`)."""
    rows = await q.fetchall("SELECT shard FROM lease_handoffs WHERE requester = ? "
                            "AND released = ?", heir, True)
    return {r[0] for r in rows}


async def held_by(q: Txn) -> dict[int, str]:
    """{shard: owner} of the leases held now (not expired, not released): a read, for a
    host deciding which shards to request (`runtime/host/_newest`)."""
    rows = await q.fetchall("SELECT shard, owner FROM leases WHERE owner <> '' AND "
                            "expires_at > ?", await q.clock())
    return {r[0]: r[1] for r in rows}


@dataclass(frozen=True, slots=True)
class RequestLeasesOp:
    """`requester` asks for `shards` for `ttl` seconds (renewed while it waits). A shard
    it holds already, or one released to a host that has not taken it yet, is skipped."""

    requester: str
    shards: tuple[int, ...]
    ttl: float
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.update(self.shards)  # serialised with the holder's hand-off
        plan.lease_update = True

    async def apply(self, txn: Txn) -> None:
        now = await txn.clock()
        heirs = await reserved_heirs(txn, self.shards, now)
        rows = []
        for shard in self.shards:
            lease = await txn.lease(shard)
            if shard not in heirs and (lease is None or lease[0] != self.requester):
                rows.append((shard, self.requester, now + self.ttl, False))
        await txn.executemany(_SET_HANDOFF, rows)


async def requests_for(q: Txn, owner: str) -> dict[int, str]:
    """The live requests for the shards `owner` holds, {shard: requester} (a read: the
    holder polls it between lease renewals)."""
    now, at = await q.clock_sql()  # in the statement: a poll is one statement
    rows = await q.fetchall(
        "SELECT h.shard, h.requester FROM lease_handoffs h JOIN leases l ON "
        f"l.shard = h.shard WHERE l.owner = ? AND h.released = ? AND h.until > {now}",
        owner, False, *at)
    return {r[0]: r[1] for r in rows}


async def live_hosts(q: Txn, owner: str) -> list[str]:
    """The hosts other than `owner` alive to receive shards (registered as hosts and
    not expired), sorted; a host closing hands its shards to them (a read: a closing
    host has left the registry already, `BuildRegistration.close`)."""
    rows = await q.fetchall(
        "SELECT DISTINCT process FROM build_processes WHERE role = 'host' AND "
        "process <> ? AND expires_at >= ? ORDER BY process", owner, await q.clock())
    return [r[0] for r in rows]


@dataclass(frozen=True, slots=True)
class HandOffLeaseOp:
    """Release the shard `fence` holds to `heir`: the lease row keeps its epoch but no
    owner (every later write of the holder is refused), and is reserved for `heir`
    for `ttl` seconds. False (nothing written) if `fence` no longer holds the shard."""

    fence: Fence
    heir: str
    ttl: float
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)
        plan.lease_update = True

    async def apply(self, txn: Txn) -> bool:
        shard, epoch = self.fence.shard, self.fence.epoch
        lease = await txn.lease(shard)
        if lease is None or (lease[0], lease[1]) != (self.fence.owner, epoch):
            return False
        until = await txn.clock() + self.ttl
        await txn.execute("UPDATE leases SET owner = '', expires_at = ? WHERE shard = ?",
                          until, shard)
        txn.leases[shard] = ("", epoch, until)
        await txn.execute(_SET_HANDOFF, shard, self.heir, until, True)
        return True
