"""The census: a whole deployment's numbers for operators, read from the store alone.

What a Prometheus scrape shows (`corral._scrape`) whichever process serves it: entities
by type and status, the backlog (messages accepted and not applied) with the age of the
oldest unapplied message, dead letters, open signal waits, suspended runs, and the live
processes with their builds and the shards held. Each number is one aggregate query
(never a row per entity brought into Python) that reads only the rows it counts or a
counter, never every entity:

- Entities by type and status: the sums of `entity_counts` (etype, status, shard, n),
  a few rows per type and shard. The counters are kept in the transactions that write
  entity rows: `Txn.tally` counts a row a flush creates or whose status it changes
  (start, re-run, close, failure, terminate; continue-as-new keeps the status and
  changes none), retention's purge uncounts the rows it deletes, and `Txn.count`
  writes the changes once, last, in one order. An acceptance into a running entity
  changes no counter. `recount` recomputes them from the rows (a migration's backfill,
  a bulk load).
- Dead letters, open signal waits, suspended runs: only those rows (dead letters by
  their type's index, open waits through `signal_waits_open`, suspensions each
  checked against its entity's row by primary key: no walk of the running entities).
- The backlog: the summaries the shards' live holders write with their progress
  rounds, a few rows per shard and type; a shard no live holder vouches for (none
  running, or changing hands) is counted exactly from its running entities, a seek
  per entity (see `_backlog`: the degraded mode, exact but not flat).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._backlog import TypeBacklog, backlog
from ._txn import Txn

__all__ = ["RECOUNT", "Census", "TypeBacklog", "census", "recount"]

RECOUNT = (
    "DELETE FROM entity_counts",
    "INSERT INTO entity_counts (etype, status, shard, n) SELECT etype, status, shard, "
    "count(*) FROM entities GROUP BY etype, status, shard",
)
"""The statements that recompute `entity_counts` from the entity rows (a walk of every
row: for a migration and a bulk load, never a scrape)."""


@dataclass(frozen=True, slots=True)
class Census:
    """A deployment's numbers, as one read of its store saw them (on PostgreSQL one
    statement after the other, each its own snapshot).

    Attributes:
        at: the store's clock when read (ages are measured from it).
        entities: (entity type, status, count) of every entity's latest run.
        backlog: the types with running entities behind.
        dead_letters, open_waits, suspended_runs: (entity type, count) each.
        processes: (entity type, build fingerprint, role, live processes) of the
            registry of builds: role `host` or `client` (the processes that opened a
            runtime; Ray's shard actors are not in it, their clients are); a process
            expired when it stopped refreshing its registration.
        hosts: the hosts holding a live lease on a shard (on every backend).
        shards: the store's shard count; shards_held: those with a live lease.
    """

    at: float
    entities: tuple[tuple[str, str, int], ...]
    backlog: tuple[TypeBacklog, ...]
    dead_letters: tuple[tuple[str, int], ...]
    open_waits: tuple[tuple[str, int], ...]
    suspended_runs: tuple[tuple[str, int], ...]
    processes: tuple[tuple[str, str, str, int], ...]
    hosts: int
    shards: int
    shards_held: int


async def recount(q: Txn) -> None:
    """Recompute the census's counters from the entity rows, through `q` (a write
    transaction): after rows were loaded or changed in bulk outside corral's writes."""
    for statement in RECOUNT:
        await q.execute(statement)


COUNTS = ("SELECT etype, status, sum(n) FROM entity_counts GROUP BY etype, status "
          "HAVING sum(n) <> 0 ORDER BY etype, status")
DEAD = "SELECT etype, count(*) FROM dead_letters GROUP BY etype ORDER BY etype"
WAITS = ("SELECT etype, count(*) FROM signal_waits WHERE status = 'open' "
         "GROUP BY etype ORDER BY etype")
SUSPENDED = (
    "SELECT s.etype, count(*) FROM suspensions s WHERE (SELECT e.status FROM entities e "
    "WHERE e.etype = s.etype AND e.key = s.key AND e.run_id = s.run_id) = 'running' "
    "GROUP BY s.etype ORDER BY s.etype")


async def census(q: Txn) -> Census:
    """Read the census through `q` (a read-only `Txn`)."""
    now = await q.clock()
    entities = await q.fetchall(COUNTS)
    dead = await q.fetchall(DEAD)
    waits = await q.fetchall(WAITS)
    suspended = await q.fetchall(SUSPENDED)
    processes = await q.fetchall(
        "SELECT etype, fingerprint, role, count(*) FROM build_processes "
        "WHERE expires_at >= ? GROUP BY etype, fingerprint, role "
        "ORDER BY etype, fingerprint, role", now)
    held = await q.fetchone("SELECT count(DISTINCT owner), count(*) FROM leases "
                            "WHERE expires_at >= ? AND owner <> ''", now)
    shards = await q.fetchone("SELECT v FROM meta WHERE k = 'shards'")
    assert held is not None
    behind = await backlog(q, now, None if shards is None else int(shards[0]))
    return Census(
        now, tuple((r[0], r[1], int(r[2])) for r in entities),
        behind,
        tuple((r[0], int(r[1])) for r in dead), tuple((r[0], int(r[1])) for r in waits),
        tuple((r[0], int(r[1])) for r in suspended),
        tuple((r[0], r[1], r[2], int(r[3])) for r in processes),
        int(held[0]), 0 if shards is None else int(shards[0]), int(held[1]))
