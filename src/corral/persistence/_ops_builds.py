"""The registry of builds' writes (see `_build_registry`), written once for both engines; the
clock is `Txn.clock` (on PostgreSQL the database server's), so every process judges a
registration's expiry alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._build_registry import BuildCheck, TxnBuildFacts
from ._txn import LockPlan, Txn

__all__ = ["ForgetProcessOp", "RegisterBuildsOp"]

_BUILD = (
    "INSERT INTO builds (etype, fingerprint, manifest, first_seen, last_seen, older) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (etype, fingerprint) DO UPDATE SET "
    "last_seen = excluded.last_seen"
)
_PROCESS = (
    "INSERT INTO build_processes (process, etype, fingerprint, role, last_seen, expires_at) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (process, etype) DO UPDATE SET "
    "fingerprint = excluded.fingerprint, role = excluded.role, "
    "last_seen = excluded.last_seen, expires_at = excluded.expires_at"
)


@dataclass(frozen=True, slots=True)
class RegisterBuildsOp:
    """Record (or refresh) that `process` runs these builds until `ttl` seconds from now.

    `builds`: (entity type, fingerprint, manifest JSON) each. A build's first_seen is
    kept from its first registration; so is `older` (given to a build first registered
    after a newer one: it never becomes the newest). Expired registrations are swept
    here, so the table holds about one row per live process and type. Returns the
    clock's now.

    With `check`, the registry lock is taken first (`LockPlan.registry`) and `check`
    decides over the registry as this transaction reads it which builds are `older`,
    or refuses (raises) before anything is written: the decision and the registration
    are one (see `BuildRegistry.register_builds`).
    """

    process: str
    role: str
    builds: tuple[tuple[str, str, str], ...]
    ttl: float
    older: frozenset[str] = frozenset()
    check: BuildCheck | None = None
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.registry = plan.registry or self.check is not None

    async def apply(self, txn: Txn) -> float:
        older = self.older if self.check is None else await self.check(TxnBuildFacts(txn))
        now = await txn.clock()
        ordered = sorted(self.builds)  # one row order for every process: no deadlock
        await txn.executemany(_BUILD, [(t, f, m, now, now, t in older)
                                      for t, f, m in ordered])
        await txn.executemany(_PROCESS, [(self.process, t, f, self.role, now, now + self.ttl)
                                         for t, f, _ in ordered])
        await txn.execute("DELETE FROM build_processes WHERE expires_at < ?", now)
        return now


@dataclass(frozen=True, slots=True)
class ForgetProcessOp:
    """`process` stops (its runtime closes): it runs no build any more."""

    process: str
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        pass

    async def apply(self, txn: Txn) -> None:
        await txn.execute("DELETE FROM build_processes WHERE process = ?", self.process)
