"""The transaction every group-committed write op runs in, and the fence it checks.

Write ops live in `_accept`, `_lifecycle`, `_leases` and `_dead_letters`. An op raises
a `CorralError` *before* writing anything when it refuses (conflict, closed run, lost
lease), so the other ops of its batch still commit.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from corral._common import RunStatus
from corral._errors import LeaseLostError

__all__ = ["EntityRow", "Fence", "Txn", "WriteOp"]


@dataclass(slots=True)
class EntityRow:
    shard: int
    run_id: int
    status: RunStatus
    next_seq: int
    dirty: bool = False


@dataclass(frozen=True, slots=True)
class Fence:
    """A host's claim to write for a shard: refused unless `epoch` is still current."""

    shard: int
    owner: str
    epoch: int


_JOURNAL_INSERT = (
    "INSERT INTO journal (etype, key, seq, run_id, shard, kind, name, message_id, payload, "
    "sender, accepted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_DEDUPE_INSERT = (
    "INSERT INTO dedupe (etype, key, message_id, seq, run_id, payload_hash, sender, "
    "accepted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


@dataclass(slots=True)
class Txn:
    """One open transaction.

    Caches entity rows so a batch updates each row once, and buffers accepted journal
    and dedupe rows for one `executemany` each (`flush`, before any other kind of op
    reads or changes them). `accepted` answers dedupe lookups for ids accepted earlier
    in this same batch.
    """

    db: sqlite3.Connection
    entities: dict[tuple[str, str], EntityRow | None] = field(default_factory=dict)
    journal_rows: list[tuple[Any, ...]] = field(default_factory=list)
    dedupe_rows: list[tuple[Any, ...]] = field(default_factory=list)
    accepted: dict[tuple[str, str, str], tuple[Any, ...]] = field(default_factory=dict)

    def entity(self, etype: str, key: str) -> EntityRow | None:
        ident = (etype, key)
        if ident not in self.entities:
            row = self.db.execute(
                "SELECT shard, run_id, status, next_seq FROM entities WHERE etype=? AND key=?",
                ident,
            ).fetchone()
            self.entities[ident] = (
                None if row is None else EntityRow(row[0], row[1], RunStatus(row[2]), row[3])
            )
        return self.entities[ident]

    def put_entity(self, etype: str, key: str, row: EntityRow) -> None:
        row.dirty = True
        self.entities[(etype, key)] = row

    def check(self, fence: Fence) -> None:
        row = self.db.execute(
            "SELECT owner, epoch FROM leases WHERE shard=?", (fence.shard,)
        ).fetchone()
        if row is None or (row[0], row[1]) != (fence.owner, fence.epoch):
            raise LeaseLostError(
                f"shard {fence.shard}: epoch {fence.epoch} of {fence.owner} is no longer current"
            )

    def flush(self) -> None:
        if self.journal_rows:
            self.db.executemany(_JOURNAL_INSERT, self.journal_rows)
            self.db.executemany(_DEDUPE_INSERT, self.dedupe_rows)
            self.journal_rows.clear()
            self.dedupe_rows.clear()
            self.accepted.clear()
        dirty = [(k[0], k[1], r) for k, r in self.entities.items() if r is not None and r.dirty]
        if dirty:
            now = time.time()
            self.db.executemany(
                "INSERT INTO entities (etype, key, shard, run_id, status, next_seq, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (etype, key) DO UPDATE SET "
                "run_id=excluded.run_id, status=excluded.status, next_seq=excluded.next_seq, "
                "updated_at=excluded.updated_at",
                [(e, k, r.shard, r.run_id, r.status._value_, r.next_seq, now)
                 for e, k, r in dirty],
            )
            for _, _, r in dirty:
                r.dirty = False


class WriteOp(Protocol):
    def apply(self, txn: Txn) -> Any: ...
