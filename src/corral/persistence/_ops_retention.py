"""Retention (`corral.Retention`): purge runs closed before a cutoff, with their rows.
Written once for both engines (see `_txn`).

An entity whose latest run closed before the cutoff goes entirely: every row keyed by
its type and key, so a later signal-with-start finds a key never seen. A run the
entity left behind (continued as new, or closed before a restart) goes with its own
rows (snapshots, waits, dead letters); its journal rows were carried or are covered,
and its dedupe ids stay for the dedupe window to forget (a carried entry's id must
keep answering duplicate).

A purge takes no shard's tick row, so acceptances never wait for it. An entity row
some other transaction holds is skipped (PostgreSQL: `SKIP LOCKED`) and taken in a
later round; an acceptance racing the purge of its key may still be answered
duplicate from the dedupe row it read before the purge committed (the id was
accepted, by the purged run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from corral._common import RunStatus

from ._txn import Fence, LockPlan, Txn

__all__ = ["PurgeClosedOp", "Purged", "purgeable"]

T = TypeVar("T")

# Every table with rows of one entity, keyed by (etype, key).
_ENTITY_TABLES = ("journal", "dedupe", "snapshots", "timers", "dead_letters",
                  "signal_waits", "suspensions", "steps", "outbox", "progress", "runs",
                  "entities")
# The tables with rows of one run (besides `runs`), keyed by (etype, key, run_id).
_RUN_TABLES = ("snapshots", "dead_letters", "signal_waits", "steps", "outbox")


@dataclass(frozen=True, slots=True)
class Purged:
    """What one purge removed (or, dry, would remove): `runs` (closed runs, those of an
    entity gone whole included), `entities` (the entities gone whole) and
    `rows` (every row deleted, runs and entities included; 0 when dry)."""

    runs: int = 0
    entities: int = 0
    rows: int = 0

    def __add__(self, other: Purged) -> Purged:
        return Purged(self.runs + other.runs, self.entities + other.entities,
                      self.rows + other.rows)


def _candidates(shards: Sequence[int] | None) -> str:
    """The query of (key, run_id, the entity's run_id, its status) of the oldest runs
    of a type closed before a cutoff (on the shards named)."""
    where = "" if shards is None else f" AND e.shard IN ({', '.join('?' * len(shards))})"
    return ("SELECT r.key, r.run_id, e.run_id, e.status FROM runs r JOIN entities e "
            "ON e.etype = r.etype AND e.key = r.key "
            f"WHERE r.etype = ? AND r.closed_at < ?{where} ORDER BY r.closed_at LIMIT ?")


@dataclass(frozen=True, slots=True)
class PurgeClosedOp:
    """Purge at most `limit` runs of `entity_type` closed before `closed_before`.

    A host passes the `fences` of the shards it holds: only their entities are
    purged, and the op is refused (`LeaseLostError`, nothing deleted) once one of them
    is no longer current. An operator (`corral purge`) passes none: every shard.
    """

    entity_type: str
    closed_before: float
    limit: int
    fences: tuple[Fence, ...] = ()
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.leases.update(fence.shard for fence in self.fences)

    async def apply(self, txn: Txn) -> Purged:
        for fence in self.fences:
            await txn.check(fence)
        shards = [fence.shard for fence in self.fences] if self.fences else None
        rows = await txn.fetchall(_candidates(shards), self.entity_type,
                                  self.closed_before, *(shards or ()), self.limit)
        whole = {key: run_id for key, run_id, latest, status in rows
                 if run_id == latest and status != RunStatus.RUNNING.value}
        purged, gone = Purged(), set[str]()
        for keys in _chunks(sorted(whole)):
            done, deleted = await self._purge_entities(txn, {k: whole[k] for k in keys})
            gone |= deleted
            purged += done
        # Runs left behind, of entities not gone whole (their rows went with them).
        left = [(key, run_id) for key, run_id, latest, _ in rows
                if run_id != latest and key not in gone and key not in whole]
        for pairs in _chunks(left):
            purged += await self._purge_runs(txn, pairs)
        return purged

    async def _purge_entities(self, txn: Txn, runs: dict[str, int]
                              ) -> tuple[Purged, set[str]]:
        """The entities whose latest run is `runs[key]`, closed: every row they have,
        except those whose row is busy or changed since the candidates were read."""
        marks = ", ".join("?" * len(runs))
        found = await txn.fetchall(f"SELECT key, run_id, status FROM entities WHERE etype = ? "
                                   f"AND key IN ({marks}){txn.SKIP_LOCKED}",
                                   self.entity_type, *runs)
        keys = sorted(key for key, run_id, status in found
                      if runs[key] == run_id and status != RunStatus.RUNNING.value)
        if not keys:
            return Purged(), set()
        marks = ", ".join("?" * len(keys))
        deleted = {table: await txn.execute(f"DELETE FROM {table} WHERE etype = ? "
                                            f"AND key IN ({marks})", self.entity_type, *keys)
                   for table in _ENTITY_TABLES}
        for key in keys:  # this batch's later ops read the truth: no entity, no window
            txn.entities[(self.entity_type, key)] = None
            txn.forget_window(self.entity_type, key)
        return Purged(deleted["runs"], len(keys), sum(deleted.values())), set(keys)

    async def _purge_runs(self, txn: Txn, pairs: Sequence[tuple[str, int]]) -> Purged:
        """Runs the entities left behind: their rows and their own rows."""
        which = " OR ".join(["(key = ? AND run_id = ?)"] * len(pairs))
        args = [value for pair in pairs for value in pair]
        deleted = 0
        for table in (*_RUN_TABLES, "runs"):
            deleted += await txn.execute(f"DELETE FROM {table} WHERE etype = ? AND ({which})",
                                         self.entity_type, *args)
        return Purged(len(pairs), 0, deleted)


_CHUNK = 400  # keys per statement: under SQLite's oldest limit of 999 arguments


def _chunks(items: Sequence[T]) -> list[Sequence[T]]:
    return [items[i:i + _CHUNK] for i in range(0, len(items), _CHUNK)]


async def purgeable(q: Txn, entity_type: str, closed_before: float) -> Purged:
    """What `PurgeClosedOp` would purge of `entity_type` at `closed_before`, without a
    limit (`corral purge --dry-run`): runs and entities; rows are not counted."""
    row = await q.fetchone(
        "SELECT count(*), coalesce(sum(CASE WHEN r.run_id = e.run_id "
        "AND e.status <> 'running' THEN 1 ELSE 0 END), 0) FROM runs r JOIN entities e "
        "ON e.etype = r.etype AND e.key = r.key WHERE r.etype = ? AND r.closed_at < ?",
        entity_type, closed_before)
    assert row is not None
    return Purged(int(row[0]), int(row[1]))
