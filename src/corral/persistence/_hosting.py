"""Which cluster hosts a store: every host process claims the store for its cluster.

A *cluster* is where a store's hosts run: `"local"` for local hosts (any number of
processes, on one machine or, with PostgreSQL, many, share a store through leases), or
one Ray instance (`"ray:<session>"`) whose host actors take leases at once to fence out
a restarted predecessor. Hosts of two clusters on one store would take the same
shards' leases from each other, so a host claims the store for its cluster before it
takes a lease (`ClaimHostingOp`): refused, writing nothing, while a live host of
another cluster holds a claim. Each host renews its claim (every quarter of its ttl)
and drops it when it closes; a host that died stops renewing and its claim lapses
after its ttl. Judged by `Txn.clock`, like the leases (on PostgreSQL the server's).

The store's half of hosting, hence the name it shares with the host's half,
`corral.runtime.host._hosting` (which claims, renews and drops, and refuses a host of
another cluster).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from ._txn import LockPlan, Txn

__all__ = ["MIGRATION_CLUSTER", "ClaimHostingOp", "HostingClaim", "HostingRegistry",
           "ReleaseHostingOp", "hosting_claims"]

MIGRATION_CLUSTER = "migration"
"""The cluster of a copy moving the store (`_migrate`): its claim refuses every host."""

_CLAIM = (
    "INSERT INTO hosting (process, cluster, holder, expires_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (process) DO UPDATE SET cluster = excluded.cluster, "
    "holder = excluded.holder, expires_at = excluded.expires_at"
)


@dataclass(frozen=True, slots=True)
class HostingClaim:
    """One live host's claim: its `process`, its `cluster`, a description of it for
    people (`holder`: where it runs, how to reach its cluster) and when the claim
    lapses unless renewed (`expires_at`, epoch s)."""

    process: str
    cluster: str
    holder: str
    expires_at: float


class HostingRegistry(Protocol):
    """The store's role for hosting claims (see the module docstring)."""

    async def claim_hosting(self, process: str, cluster: str, holder: str, *,
                            ttl: float) -> HostingClaim | None:
        """Claim (or renew) the store for `process` of `cluster` for `ttl` seconds:
        None, or, writing nothing, a live claim of another cluster that refuses it."""
        ...

    async def release_hosting(self, process: str) -> None:
        """`process` stops hosting: its claim goes."""
        ...

    async def hosting_claims(self) -> list[HostingClaim]:
        """The live claims, oldest expiry first (a read: a client checks before it
        starts hosts)."""
        ...


async def hosting_claims(q: Txn) -> list[HostingClaim]:
    """Claims that have not lapsed, soonest expiry first."""
    rows = await q.fetchall("SELECT process, cluster, holder, expires_at FROM hosting "
                            "WHERE expires_at > ? ORDER BY expires_at, process",
                            await q.clock())
    return [HostingClaim(*r) for r in rows]


@dataclass(frozen=True, slots=True)
class ClaimHostingOp:
    """`process` of `cluster` claims the store until `ttl` seconds from now, unless a
    live claim of another cluster exists: then that claim (the longest-lived one) is
    the answer and nothing is written. Lapsed claims are swept here."""

    process: str
    cluster: str
    holder: str
    ttl: float
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        # PostgreSQL: two claimers serialise on shard 0's lease row (every store has
        # it), so both cannot see an empty table; SQLite's writer locks the file.
        plan.leases.add(0)
        plan.lease_update = plan.new_leases = True

    async def apply(self, txn: Txn) -> HostingClaim | None:
        now = await txn.clock()
        other = await txn.fetchone(
            "SELECT process, cluster, holder, expires_at FROM hosting WHERE cluster <> ? "
            "AND expires_at > ? ORDER BY expires_at DESC, process LIMIT 1",
            self.cluster, now)
        if other is not None:
            return HostingClaim(*other)
        await txn.execute("DELETE FROM hosting WHERE expires_at <= ?", now)
        await txn.execute(_CLAIM, self.process, self.cluster, self.holder, now + self.ttl)
        return None


@dataclass(frozen=True, slots=True)
class ReleaseHostingOp:
    """`process` stops hosting (closed cleanly): its claim goes at once."""

    process: str
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        pass

    async def apply(self, txn: Txn) -> None:
        await txn.execute("DELETE FROM hosting WHERE process = ?", self.process)
