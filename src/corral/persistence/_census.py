"""The census: a whole deployment's numbers for operators, read from the store alone.

What a Prometheus scrape shows (`corral._scrape`) whichever process serves it: entities
by type and status, the backlog (messages accepted and not applied) with the age of the
oldest unapplied message, dead letters, open signal waits, suspended runs, and the live
processes with their builds and the shards held. Each number is one aggregate query
(never a row per entity brought into Python) that reads only a few rows per shard and
type, never every entity or every dead letter, wait or suspension:

- Entities by type and status, dead letters, open signal waits and suspended runs: the
  sums of `census_counts` (etype, what, shard, n), `what` an entity status or one of
  `DEAD_LETTERS`, `OPEN_WAITS`, `SUSPENDED_RUNS`. The transactions that write those
  rows keep them (`Txn.add_count`), and `Txn.count` writes a transaction's changes
  once, last, in one order:
  - entities: `Txn.tally` counts a row a flush creates or whose status it changes
    (start, re-run, close, failure, terminate; continue-as-new keeps the status and
    changes none; an acceptance into a running entity changes none), retention's purge
    uncounts the rows it deletes;
  - dead letters: each insert (a poison verdict, a close's or a terminate's leftovers,
    an overflowing acceptance) and delete (replay, discard, purge), on the entity's
    shard;
  - open waits: a wait stored open, or stored otherwise after it was open (delivered,
    timed out, renamed), and a run's end closing its open waits. Only a running run
    has open waits, so a purge (of closed runs) and the end's delete of older runs'
    waits remove none;
  - suspended runs: a suspension recorded for the running run, cleared, or deleted
    with its run's end (close, terminate, continue-as-new).
  `recount` recomputes them all from the rows (a migration's backfill, a bulk load).
- The backlog: the summaries the shards' live holders write with their progress
  rounds, a few rows per shard and type; a shard no live holder vouches for (none
  running, or changing hands) is counted exactly from its running entities, a seek
  per entity (see `_backlog`: the degraded mode, exact but not flat).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._backlog import TypeBacklog, backlog
from ._txn import DEAD_LETTERS, OPEN_WAITS, SUSPENDED_RUNS, Txn

__all__ = ["RECOUNT", "Census", "TypeBacklog", "census", "recount"]

_INSERT = "INSERT INTO census_counts (etype, what, shard, n) "
RECOUNT = (
    "DELETE FROM census_counts",
    _INSERT + "SELECT etype, status, shard, count(*) FROM entities "
    "GROUP BY etype, status, shard",
    # A dead letter counts on its entity's shard (0 for one whose entity is gone: a
    # removal finds that shard too, `Txn.shard_of`).
    _INSERT + f"SELECT d.etype, '{DEAD_LETTERS}', coalesce(e.shard, 0), count(*) "
    "FROM dead_letters d LEFT JOIN entities e ON e.etype = d.etype AND e.key = d.key "
    "GROUP BY d.etype, coalesce(e.shard, 0)",
    _INSERT + f"SELECT etype, '{OPEN_WAITS}', shard, count(*) FROM signal_waits "
    "WHERE status = 'open' GROUP BY etype, shard",
    _INSERT + f"SELECT s.etype, '{SUSPENDED_RUNS}', s.shard, count(*) FROM suspensions s "
    "JOIN entities e ON e.etype = s.etype AND e.key = s.key AND e.run_id = s.run_id "
    "WHERE e.status = 'running' GROUP BY s.etype, s.shard",
)
"""The statements that recompute `census_counts` from the rows they count (a walk of
every row: for a migration and a bulk load, never a scrape)."""


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
    """Recompute the census's counters from the rows they count, through `q` (a write
    transaction): after rows were loaded or changed in bulk outside corral's writes."""
    for statement in RECOUNT:
        await q.execute(statement)


COUNTS = ("SELECT etype, what, sum(n) FROM census_counts GROUP BY etype, what "
          "HAVING sum(n) <> 0 ORDER BY etype, what")
_ROWS = (DEAD_LETTERS, OPEN_WAITS, SUSPENDED_RUNS)  # the other `what`s are statuses


async def census(q: Txn) -> Census:
    """Read the census through `q` (a read-only `Txn`)."""
    now = await q.clock()
    counted = [(str(r[0]), str(r[1]), int(r[2])) for r in await q.fetchall(COUNTS)]
    rows = {what: tuple((t, n) for t, w, n in counted if w == what) for what in _ROWS}
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
        now, tuple(c for c in counted if c[1] not in _ROWS), behind,
        rows[DEAD_LETTERS], rows[OPEN_WAITS], rows[SUSPENDED_RUNS],
        tuple((r[0], r[1], r[2], int(r[3])) for r in processes),
        int(held[0]), 0 if shards is None else int(shards[0]), int(held[1]))
