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
entry after it (an index seek).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._backlog import SUMMARIZE
from ._txn import Fence, Fenced, Txn

__all__ = ["RECORD", "RecordProgressOp", "applied_sql", "oldest_unapplied_sql",
           "progress_from"]

RECORD = (
    "INSERT INTO progress (etype, key, applied_seq, mailbox, recorded_at) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (etype, key) DO UPDATE SET "
    "applied_seq = excluded.applied_seq, mailbox = excluded.mailbox, "
    "recorded_at = excluded.recorded_at WHERE excluded.applied_seq >= progress.applied_seq"
)

PROGRESS_JOIN = (
    "JOIN runs r ON r.etype = entities.etype AND r.key = entities.key "
    "AND r.run_id = entities.run_id "
    "LEFT JOIN progress p ON p.etype = entities.etype AND p.key = entities.key"
)


def progress_from(page: str | None = None) -> str:
    """`entities` with its current run (`r`) and its recorded progress (`p`). `page`: a
    `SELECT ... FROM entities ... LIMIT ?` to join instead of the whole table, so a
    page's joins are lookups of its own rows (a join of the tables walked `runs` from
    the type's first key up to a cursor: 8 ms a page at 25,000 keys on PostgreSQL)."""
    source = "entities" if page is None else f"({page}) AS entities"
    return f"{source} {PROGRESS_JOIN}"


def applied_sql(q: Txn) -> str:
    """The entity's applied watermark, over `progress_from()`."""
    return (f"{q.GREATEST}(coalesce(p.applied_seq, 0), coalesce(entities.passivated_seq, 0),"
            " r.first_seq - 1)")


def oldest_unapplied_sql(q: Txn) -> str:
    """When the entity's oldest unapplied message was accepted (NULL: none, or its run
    is not running), over `progress_from()`."""
    return ("CASE WHEN entities.status = 'running' THEN (SELECT j.accepted_at FROM journal j "
            "WHERE j.etype = entities.etype AND j.key = entities.key "
            f"AND j.seq > {applied_sql(q)} ORDER BY j.seq LIMIT 1) END")


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
