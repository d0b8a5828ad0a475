"""Shard leases: who hosts a shard, until when, and its fencing epoch."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ._txn import Txn

__all__ = ["AcquireLeasesOp", "ReleaseLeasesOp", "RenewLeasesOp"]


@dataclass(frozen=True, slots=True)
class AcquireLeasesOp:
    """Take every listed shard whose lease is free, expired or already ours.

    Taking a shard from someone else (or afresh) bumps its epoch: the fencing token
    that makes the previous holder's writes fail. With `force`, every listed shard is
    taken at a new epoch even if its lease is live: a restarted Ray shard actor (whose
    name maps to exactly one live incarnation) fences out its predecessor at once.
    `orphaned` shards are taken the same way: their holder is known to be dead (the
    store obtained the shard's OS lock, see `_locks`).
    """

    owner: str
    shards: tuple[int, ...]
    ttl: float
    force: bool = False
    orphaned: frozenset[int] = frozenset()

    def apply(self, txn: Txn) -> dict[int, int]:
        now = time.time()
        taken: dict[int, int] = {}
        for shard in self.shards:
            row = txn.db.execute(
                "SELECT owner, epoch, expires_at FROM leases WHERE shard=?", (shard,)
            ).fetchone()
            if row is not None and row[0] == self.owner and not self.force:
                epoch = row[1]
            elif row is None or row[2] < now or self.force or shard in self.orphaned:
                epoch = (row[1] if row else 0) + 1
            else:
                continue
            txn.db.execute(
                "INSERT INTO leases (shard, owner, epoch, expires_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (shard) DO UPDATE SET owner=excluded.owner, "
                "epoch=excluded.epoch, expires_at=excluded.expires_at",
                (shard, self.owner, epoch, now + self.ttl),
            )
            taken[shard] = epoch
        return taken


@dataclass(frozen=True, slots=True)
class RenewLeasesOp:
    """Extend the leases still held at their epoch; returns the shards that remain ours."""

    owner: str
    held: tuple[tuple[int, int], ...]
    ttl: float

    def apply(self, txn: Txn) -> set[int]:
        expires = time.time() + self.ttl
        kept: set[int] = set()
        for shard, epoch in self.held:
            cur = txn.db.execute(
                "UPDATE leases SET expires_at=? WHERE shard=? AND owner=? AND epoch=?",
                (expires, shard, self.owner, epoch),
            )
            if cur.rowcount == 1:
                kept.add(shard)
        return kept


@dataclass(frozen=True, slots=True)
class ReleaseLeasesOp:
    owner: str

    def apply(self, txn: Txn) -> None:
        txn.db.execute("UPDATE leases SET expires_at=0 WHERE owner=?", (self.owner,))
