"""Hosts' progress: each entity's applied watermark and mailbox depth, in the store.

A host records what it applied so that any process (an operator's CLI, the dashboard,
a metrics scrape) sees how far behind an entity is without asking the host. The host
batches it (`runtime/host/_progress`): at most once per `PROGRESS_INTERVAL` it writes one
`RecordProgressOp` per shard with the entities whose watermark or mailbox depth moved,
fenced like its other writes and never on the path of a message. A watermark never
moves back: a row is only replaced by one at the same or a higher seq (seqs number an
entity's messages across its runs), so a late write of a former holder, or a new holder
replaying from a snapshot, never hides progress already recorded.

The applied watermark operators see (`applied_sql`) is the highest of what a host
recorded, the seq the entity was passivated at, and the seq before its run's first
entry (a new run starts with nothing of its own applied; what an earlier run left
unapplied became dead letters, not backlog). Its backlog is what the entity accepted
after it, while its run is running; the oldest unapplied message is the first journal
entry after it (an index seek, made only for an entity with a backlog).

A listing page reads, per entity, its row and its progress row: the run's first seq is
on the entity's row (`_tables.first_seq_sql`), so no run is looked up (a lookup per row is one
B-tree level deeper at 1M entities than at 10k: a page of 100 rows read 895 buffers at
1M and 523 at 10k with the run joined, x1.71).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._backlog import SUMMARIZE
from ._tables import first_seq_sql
from ._txn import Fence, Fenced, Txn

__all__ = ["RECORD", "RecordProgressOp", "applied_sql", "oldest_unapplied_sql",
           "page_with_progress", "progress_from"]

RECORD = (
    "INSERT INTO progress (etype, key, applied_seq, mailbox, recorded_at) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (etype, key) DO UPDATE SET "
    "applied_seq = excluded.applied_seq, mailbox = excluded.mailbox, "
    "recorded_at = excluded.recorded_at WHERE excluded.applied_seq >= progress.applied_seq"
)

RANGE_PER_ROW = 4
"""A listing page's range scan of `progress` reads at most this many rows per page row
(`page_with_progress`)."""

PROGRESS_JOIN = "LEFT JOIN progress p ON p.etype = entities.etype AND p.key = entities.key"


def progress_from() -> str:
    """`entities` with its recorded progress (`p`)."""
    return f"entities {PROGRESS_JOIN}"


def page_with_progress(columns: str, page: str, *, ranged: bool) -> str:
    """`SELECT columns` over the entities of `page` (a `SELECT * FROM entities ...
    ORDER BY etype, key LIMIT ?`) with their progress (`p`), in (etype, key) order: a
    page's joins are lookups of its own rows (a join of the tables walked `runs` from
    the type's first key up to a cursor: 8 ms a page at 25,000 keys on PostgreSQL).

    `ranged` (`Txn.PAGE_RANGE`): the page's progress rows are read by one bounded range
    scan per type on the page (materialized, so the planner cannot turn it back into a
    lookup per row: 375 buffers for a page of 100 rows at 1M entities, 66 at 10k where
    it scanned `progress`): from the type's first key on the page to its last, at most
    `RANGE_PER_ROW` progress rows per page row of the type (a row-value upper bound
    does not end a B-tree scan before the type's last key). A page of every entity in
    its span (no filter but type, key prefix and cursor) is covered by it; a status's
    page is too while the status is common (a few leaf pages), and a rare status's
    rows past the bound are looked up one by one (a lookup its `key > upto` skips for a
    covered row: a one-time filter), so its cost is the bound plus a lookup per such
    row, never a walk of the span."""
    order = "ORDER BY entities.etype, entities.key"
    if not ranged:
        return f"SELECT {columns} FROM ({page}) AS entities {PROGRESS_JOIN} {order}"
    bound = f"{RANGE_PER_ROW} * span.n"
    return (f"WITH page AS MATERIALIZED ({page}), "
            "span AS (SELECT etype, min(key) AS low, max(key) AS high, count(*) AS n "
            "FROM page GROUP BY etype), "
            "ranged AS MATERIALIZED (SELECT p.* FROM span CROSS JOIN LATERAL (SELECT * "
            "FROM progress p WHERE p.etype = span.etype AND p.key >= span.low "
            f"AND p.key <= span.high ORDER BY p.key LIMIT {bound}) p), "
            f"reach AS (SELECT span.etype, CASE WHEN count(r.key) < {bound} THEN span.high "
            "ELSE max(r.key) END AS upto FROM span LEFT JOIN ranged r "
            "ON r.etype = span.etype GROUP BY span.etype, span.high, span.n), "
            "p AS (SELECT * FROM ranged UNION ALL SELECT f.* FROM page "
            "JOIN reach ON reach.etype = page.etype CROSS JOIN LATERAL (SELECT * "
            "FROM progress p WHERE page.key > reach.upto AND p.etype = page.etype "
            "AND p.key = page.key OFFSET 0) f) "
            f"SELECT {columns} FROM page AS entities LEFT JOIN p "
            f"ON p.etype = entities.etype AND p.key = entities.key {order}")


def applied_sql(q: Txn) -> str:
    """The entity's applied watermark, over `progress_from()`."""
    return (f"{q.GREATEST}(coalesce(p.applied_seq, 0), coalesce(entities.passivated_seq, 0),"
            f" {first_seq_sql()} - 1)")


def oldest_unapplied_sql(q: Txn) -> str:
    """When the entity's oldest unapplied message was accepted (NULL: none, or its run
    is not running), over `progress_from()`."""
    applied = applied_sql(q)
    return ("CASE WHEN entities.status = 'running' AND entities.next_seq - 1 > "
            f"{applied} THEN (SELECT j.accepted_at FROM journal j "
            "WHERE j.etype = entities.etype AND j.key = entities.key "
            f"AND j.seq > {applied} ORDER BY j.seq LIMIT 1) END")


@dataclass(frozen=True, slots=True)
class RecordProgressOp(Fenced):
    """Record the applied watermark and mailbox depth of entities of one shard, and
    its holder's summary of the shard's backlog when it changed (fenced).

    `rows`: (etype, key, applied_seq, mailbox depth) each. A row whose watermark is
    below the recorded one is left out by the statement itself. `backlog`: the rows of
    `_backlog.SUMMARIZE` (`_backlog.summary_rows`), empty when unchanged.
    """

    fence: Fence
    rows: tuple[tuple[str, str, int, int], ...]
    at: float
    backlog: tuple[tuple[object, ...], ...] = ()

    async def apply(self, txn: Txn) -> None:
        await txn.check(self.fence)
        if self.rows:
            await txn.executemany(RECORD, [(*row, self.at) for row in self.rows])
        if self.backlog:
            await txn.executemany(SUMMARIZE, self.backlog)
