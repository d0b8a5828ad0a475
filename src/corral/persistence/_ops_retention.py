"""Retention (`corral.Retention`): purge runs closed before a cutoff, with their rows.
Written once for both engines (see `_txn`).

An entity whose latest run closed before the cutoff goes entirely: every row keyed by
its type and key, so a later signal-with-start finds a key never seen. A run the
entity left behind (continued as new, or closed before a restart) goes with its own
rows (snapshots, waits, dead letters); its journal rows were carried or are covered,
and its dedupe ids stay for the dedupe window to forget (a carried entry's id must
keep answering duplicate). A closed run waits for its sends: one with a send not
delivered yet is not purged until it is (the entity's latest run, until every send of
the entity is).

Bounded: one purge is one transaction that takes at most `limit` runs as candidates
and deletes at most `rows` rows. A run may own any number of rows (the dedupe window's
ids, a backlog a terminate left in the journal, dead letters, waits, undelivered
sends), so the rows are deleted table by table, each statement limited to the rows left
in the budget; the rows that name the run and the entity (`runs`, `entities`) go last,
once every other row of theirs is gone, and only as far as the budget still covers
them. A purge that runs out of budget stops there and the next one (the next round)
picks the same closed run again, as long as its entity is still closed at that run:
a key a new run reopened meanwhile (its `IdReusePolicy` allowing) is left alone, minus
the rows of its closed run already gone (message ids that run saw among them: they
are not recognised as duplicates any more, as after a purge).

A purge takes no shard's tick row, so acceptances never wait for it. An entity row
some other transaction holds is skipped (PostgreSQL: `SKIP LOCKED`) and taken in a
later round; an acceptance racing the purge of its key may still be answered
duplicate from the dedupe row it read before the purge committed (the id was
accepted, by the purged run).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from corral._common import PURGE_ROWS, RunStatus

from ._txn import DEAD_LETTERS, Fence, LockPlan, Txn

__all__ = ["PurgeClosedOp", "Purged", "purgeable"]

T = TypeVar("T")

# Every table with rows of one entity, keyed by (etype, key), and the columns that name
# one of its rows within the entity: a limited delete picks its rows by them. `runs`
# and `entities` come last: a candidate is found by them until its other rows are gone.
_ROW_KEYS = {"journal": "seq", "dedupe": "message_id", "snapshots": "applied_seq",
             "timers": "timer_id", "dead_letters": "id", "signal_waits": "run_id, name",
             "suspensions": "", "steps": "run_id, name", "step_history": "run_id, name",
             "outbox": "run_id, seq",
             "progress": "", "runs": "run_id", "entities": ""}
_ENTITY_TABLES = tuple(_ROW_KEYS)
_NAMING = ("runs", "entities")  # the rows that name a run and its entity
# The tables with rows of one run (besides `runs`), keyed by (etype, key, run_id).
_RUN_TABLES = ("snapshots", "dead_letters", "signal_waits", "steps", "step_history",
               "outbox")


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
    of a type closed before a cutoff (on the shards named), but for those that still
    have sends to deliver (`_UNSENT`)."""
    where = "" if shards is None else f" AND e.shard IN ({', '.join('?' * len(shards))})"
    return ("SELECT r.key, r.run_id, e.run_id, e.status FROM runs r JOIN entities e "
            "ON e.etype = r.etype AND e.key = r.key "
            f"WHERE r.etype = ? AND r.closed_at < ?{where} AND NOT {_UNSENT} "
            "ORDER BY r.closed_at LIMIT ?")


# A closed run with a send not delivered yet (its target over its `max_backlog`, or
# the sender's host gone before delivering) is kept until the send is delivered: a send
# written with its sender's progress is delivered whatever becomes of the sender, and
# delivering it reads only its outbox row. The entity's latest run (purged with every
# row of the entity) waits for the sends of all its runs; a run left behind, for its own.
# No run takes new sends once closed, so a run found without one stays without.
_UNSENT = ("EXISTS (SELECT 1 FROM outbox o WHERE o.etype = r.etype AND o.key = r.key "
           "AND NOT o.delivered AND (o.run_id = r.run_id OR r.run_id = e.run_id))")


@dataclass(frozen=True, slots=True)
class PurgeClosedOp:
    """Purge at most `limit` runs of `entity_type` closed before `closed_before`,
    deleting at most `rows` rows (a run with more goes over several purges).

    A host passes the `fences` of the shards it holds: only their entities are
    purged, and the op is refused (`LeaseLostError`, nothing deleted) once one of them
    is no longer current. An operator (`corral purge`) passes none: every shard.
    """

    entity_type: str
    closed_before: float
    limit: int
    fences: tuple[Fence, ...] = ()
    rows: int = PURGE_ROWS
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
        budget = _Budget(self.rows)
        purged, gone = Purged(), set[str]()
        for keys in _chunks(sorted(whole), _CHUNK):
            done, deleted = await self._purge_entities(txn, {k: whole[k] for k in keys},
                                                       budget)
            gone |= deleted
            purged += done
        # Runs left behind, of entities not gone whole (their rows went with them).
        left = [(key, run_id) for key, run_id, latest, _ in rows
                if run_id != latest and key not in gone and key not in whole]
        for pairs in _chunks(left, _CHUNK // 2):
            purged += await self._purge_runs(txn, pairs, budget)
        return purged

    async def _purge_entities(self, txn: Txn, runs: dict[str, int], budget: _Budget
                              ) -> tuple[Purged, set[str]]:
        """The entities whose latest run is `runs[key]`, closed: every row they have
        (within `budget`), except those whose row is busy or changed since the
        candidates were read. Those whose every row went are returned."""
        if not budget.left:
            return Purged(), set()
        marks = ", ".join("?" * len(runs))
        found = await txn.fetchall(f"SELECT key, run_id, status, shard FROM entities "
                                   f"WHERE etype = ? AND key IN ({marks}){txn.SKIP_LOCKED}",
                                   self.entity_type, *runs)
        counted = {key: (shard, status) for key, run_id, status, shard in found
                   if runs[key] == run_id and status != RunStatus.RUNNING.value}
        keys = sorted(counted)
        if not keys:
            return Purged(), set()
        marks = ", ".join("?" * len(keys))
        where, args = f"etype = ? AND key IN ({marks})", (self.entity_type, *keys)
        deleted = 0
        shards = {key: shard for key, (shard, _) in counted.items()}
        for table in _ENTITY_TABLES:
            if table in _NAMING:
                continue
            n, complete = await self._delete(txn, budget, table, where, args, shards)
            deleted += n
            if not complete:
                return Purged(0, 0, deleted), set()
        # The runs they left behind, then the latest run's and the entity's own rows:
        # two per entity, for as many entities as the budget still covers.
        n, complete = await budget.delete(txn, "runs", where + " AND run_id < (SELECT "
                                          "e.run_id FROM entities e WHERE e.etype = "
                                          "runs.etype AND e.key = runs.key)", args)
        deleted += n
        keys = keys[:budget.left // 2] if complete else []
        if not keys:
            return Purged(n, 0, deleted), set()
        marks = ", ".join("?" * len(keys))
        for table in _NAMING:
            deleted += budget.spend(await txn.execute(
                f"DELETE FROM {table} WHERE etype = ? AND key IN ({marks})",
                self.entity_type, *keys))
        for key in keys:  # this batch's later ops read the truth: no entity, no window
            shard, status = counted[key]
            txn.add_count(self.entity_type, status, shard, -1)
            txn.read_entity((self.entity_type, key), None)
            txn.forget_window(self.entity_type, key)
        return Purged(n + len(keys), len(keys), deleted), set(keys)

    async def _purge_runs(self, txn: Txn, pairs: Sequence[tuple[str, int]],
                          budget: _Budget) -> Purged:
        """Runs the entities left behind: their own rows, then (for as many as the
        budget still covers) their `runs` rows."""
        which = " OR ".join(["(key = ? AND run_id = ?)"] * len(pairs))
        where = f"etype = ? AND ({which})"
        args = (self.entity_type, *(value for pair in pairs for value in pair))
        deleted = 0
        for table in _RUN_TABLES:
            n, complete = await self._delete(txn, budget, table, where, args, {})
            deleted += n
            if not complete:
                return Purged(0, 0, deleted)
        pairs = pairs[:budget.left]
        if not pairs:
            return Purged(0, 0, deleted)
        which = " OR ".join(["(key = ? AND run_id = ?)"] * len(pairs))
        deleted += budget.spend(await txn.execute(
            f"DELETE FROM runs WHERE etype = ? AND ({which})", self.entity_type,
            *(value for pair in pairs for value in pair)))
        return Purged(len(pairs), 0, deleted)

    async def _delete(self, txn: Txn, budget: _Budget, table: str, where: str,
                      args: Sequence[object], shards: Mapping[str, int]) -> tuple[int, bool]:
        """`budget.delete`, uncounting the dead letters it deletes on their entities'
        shards (`shards` by key, else read). The other counted rows a purge deletes
        count for nothing: the waits and suspensions of closed runs are closed or stale
        (`_census`)."""
        if table != "dead_letters":
            return await budget.delete(txn, table, where, args)
        keys, complete = await budget.delete_letters(txn, where, args)
        for key, n in sorted(Counter(keys).items()):
            shard = shards[key] if key in shards else await txn.shard_of(self.entity_type, key)
            txn.add_count(self.entity_type, DEAD_LETTERS, shard, -n)
        return len(keys), complete


class _Budget:
    """The rows one purge may still delete."""

    __slots__ = ("left",)

    def __init__(self, rows: int) -> None:
        self.left = rows

    def spend(self, rows: int) -> int:
        self.left -= rows
        return rows

    async def delete(self, txn: Txn, table: str, where: str, args: Sequence[object]
                     ) -> tuple[int, bool]:
        """Delete the rows of `table` matching `where`, at most as many as are left:
        how many went, and whether they were all (False: the budget ran out)."""
        if not self.left:
            return 0, False
        n = self.spend(await txn.execute(self._statement(table, where), *args, *args,
                                         self.left))
        return n, self.left > 0

    async def delete_letters(self, txn: Txn, where: str, args: Sequence[object]
                             ) -> tuple[list[str], bool]:
        """`delete` of dead letters, returning the key of each one deleted: read (and
        on PostgreSQL locked) first, then deleted by id (no `RETURNING`: SQLite has it
        only from 3.35)."""
        if not self.left:
            return [], False
        rows = await txn.fetchall(f"SELECT id, key FROM dead_letters WHERE {where} "
                                  f"LIMIT ?{txn.ROW_LOCK}", *args, self.left)
        await txn.executemany("DELETE FROM dead_letters WHERE id = ?", [(r[0],) for r in rows])
        self.spend(len(rows))
        return [str(r[1]) for r in rows], self.left > 0

    @staticmethod
    def _statement(table: str, where: str) -> str:
        row = ", ".join(("key", *filter(None, [_ROW_KEYS[table]])))
        return (f"DELETE FROM {table} WHERE {where} AND ({row}) IN "
                f"(SELECT {row} FROM {table} WHERE {where} LIMIT ?)")


_CHUNK = 400  # keys per statement (twice, and a limit): under SQLite's oldest limit of
# 999 arguments; runs left behind take two arguments each, so half as many


def _chunks(items: Sequence[T], size: int) -> list[Sequence[T]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


async def purgeable(q: Txn, entity_type: str, closed_before: float) -> Purged:
    """What `PurgeClosedOp` would purge of `entity_type` at `closed_before`, without a
    limit (`corral purge --dry-run`): runs and entities; rows are not counted."""
    row = await q.fetchone(
        "SELECT count(*), coalesce(sum(CASE WHEN r.run_id = e.run_id "
        "AND e.status <> 'running' THEN 1 ELSE 0 END), 0) FROM runs r JOIN entities e "
        "ON e.etype = r.etype AND e.key = r.key WHERE r.etype = ? AND r.closed_at < ? "
        f"AND NOT {_UNSENT}", entity_type, closed_before)
    assert row is not None
    return Purged(int(row[0]), int(row[1]))
