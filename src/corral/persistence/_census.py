"""The census: a whole deployment's numbers for operators, read from the store alone.

What a Prometheus scrape shows (`corral._scrape`) whichever process serves it: entities
by type and status, the backlog (messages accepted and not applied) with the age of the
oldest unapplied message, dead letters, open signal waits, suspended runs, and the live
processes with their builds and the shards held. Each number is one aggregate query
(GROUP BY in SQL, never a row per entity brought into Python), so a scrape costs a few
index scans however the store is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._progress import applied_sql, oldest_unapplied_sql, progress_from
from ._txn import Txn

__all__ = ["Census", "TypeBacklog", "census"]


@dataclass(frozen=True, slots=True)
class TypeBacklog:
    """The running entities of one type that are behind: how many, by how much in all,
    and when the oldest message none of them applied yet was accepted."""

    entity_type: str
    messages: int
    entities: int
    oldest_unapplied_at: float | None


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


async def census(q: Txn) -> Census:
    """Read the census through `q` (a read-only `Txn`)."""
    now = await q.clock()
    entities = await q.fetchall("SELECT etype, status, count(*) FROM entities "
                                "GROUP BY etype, status ORDER BY etype, status")
    behind = await q.fetchall(
        "SELECT etype, sum(accepted - applied), count(*), min(oldest) FROM ("
        f"SELECT entities.etype AS etype, entities.next_seq - 1 AS accepted, "
        f"{applied_sql(q)} AS applied, {oldest_unapplied_sql(q)} AS oldest "
        f"FROM {progress_from()} WHERE entities.status = 'running') t "
        "WHERE accepted > applied GROUP BY etype ORDER BY etype")
    dead = await q.fetchall("SELECT etype, count(*) FROM dead_letters GROUP BY etype "
                            "ORDER BY etype")
    waits = await q.fetchall("SELECT etype, count(*) FROM signal_waits WHERE status = 'open' "
                             "GROUP BY etype ORDER BY etype")
    suspended = await q.fetchall(
        "SELECT s.etype, count(*) FROM suspensions s JOIN entities e ON e.etype = s.etype "
        "AND e.key = s.key AND e.run_id = s.run_id WHERE e.status = 'running' "
        "GROUP BY s.etype ORDER BY s.etype")
    processes = await q.fetchall(
        "SELECT etype, fingerprint, role, count(*) FROM build_processes "
        "WHERE expires_at >= ? GROUP BY etype, fingerprint, role "
        "ORDER BY etype, fingerprint, role", now)
    held = await q.fetchone("SELECT count(DISTINCT owner), count(*) FROM leases "
                            "WHERE expires_at >= ? AND owner <> ''", now)
    shards = await q.fetchone("SELECT v FROM meta WHERE k = 'shards'")
    assert held is not None
    return Census(
        now, tuple((r[0], r[1], int(r[2])) for r in entities),
        tuple(TypeBacklog(r[0], int(r[1]), int(r[2]), r[3]) for r in behind),
        tuple((r[0], int(r[1])) for r in dead), tuple((r[0], int(r[1])) for r in waits),
        tuple((r[0], int(r[1])) for r in suspended),
        tuple((r[0], r[1], r[2], int(r[3])) for r in processes),
        int(held[0]), 0 if shards is None else int(shards[0]), int(held[1]))
