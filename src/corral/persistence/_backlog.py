"""The census's backlog: the holders' summaries per shard, the store's rows for the rest.

The backlog (messages accepted and not applied, by type: how many, by how many
entities, and when the oldest was accepted) is a fact about every running entity, so
reading it from the entity rows costs a seek per running entity (`EXACT`): 10,000
running entities of a million, 10,000 lookups a scrape. The process that knows it
without reading is each shard's holder: it routes every accepted entry of its entities
to an activation, which holds what it has not applied yet. So:

- The holder summarizes: with its progress round (`RecordProgressOp`, at most once per
  `PROGRESS_INTERVAL`, fenced by the shard's lease) it writes one row per
  (shard, type) with the shard's backlog of that type, and the shard's row of type ''
  saying which lease epoch vouches for them, only when the summary changed since its
  last write (one more statement in a round, none in an idle one). A holder vouches
  only for a shard whose every running entity it knows (all resident and their
  journal read: `Shard.backlog`); otherwise it writes the shard's row with epoch 0,
  which vouches for nothing.
- The census trusts a shard's rows only at the epoch of a live lease (`SUMMED`): a
  shard handed to a new holder (a new epoch, until the new holder's first round), one
  released or handed off (owner '' or expired), one whose holder died (its lease
  expires), one nobody holds: none is summarized, and each is counted exactly from
  the store (`EXACT`, a seek of `entities_running (shard)` and lookups by key per
  running entity of those shards). Nothing is ever written on release: a summary of
  a shard no live lease vouches for is never read, whatever it says, and a summary
  of "nothing left" written at release would be a lie about entities stopped with a
  backlog.
- Between two rounds the summary is the holder's view as of `recorded_at`: it lags
  the journal by up to a round (and the journal tail's poll, for entries other
  processes accepted); an entity passivated or closed leaves it at the next round. A
  holder that died is trusted until its lease expires (a lease term: the window in
  which its shards are not served at all); a live one whose rounds keep failing
  (logged, with backoff) keeps its last summary.

The cost: with live holders vouching for every shard, the census reads a few rows
per shard and type, whatever the number of entities. Without hosts (a store read by
an operator's CLI while nothing runs) or while shards change hands, their shards
fall back to the exact count, whose cost grows with those shards' running entities:
the degraded mode, exact but not flat. So does a shard whose holder activates its
entities lazily after a takeover, until every running one is resident (or until such
a holder can tell the backlog of the ones it has not activated).

Considered and not chosen: counters kept by the accepting and recording transactions.
Messages behind would be a counter (accept adds one, a progress row subtracts what it
moved), but entities behind and the oldest unapplied message are not sums: they need
each entity's watermark against its journal, which is what the holder already has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ._tables import first_seq_sql
from ._txn import Fence, Txn

__all__ = ["EXACT", "SUMMARIZE", "SUMMED", "VOUCHED", "ShardBacklog", "TypeBacklog",
           "backlog", "exact_sql", "summary_rows"]


@dataclass(frozen=True, slots=True)
class TypeBacklog:
    """The running entities of one type that are behind: how many, by how much in all,
    and when the oldest message none of them applied yet was accepted."""

    entity_type: str
    messages: int
    entities: int
    oldest_unapplied_at: float | None


@dataclass(frozen=True, slots=True)
class ShardBacklog:
    """A holder's summary of one shard's backlog.

    Attributes:
        types: type -> (messages, entities, oldest accepted_at) of the types with
            entities behind; None when the holder does not know every running
            entity's backlog (not all resident, or some still reading their journal).
        gone: the types it summarized before with nothing left (written at zero).
    """

    types: Mapping[str, tuple[int, int, float | None]] | None
    gone: tuple[str, ...] = ()


SUMMARIZE = (
    "INSERT INTO backlogs (shard, etype, epoch, messages, entities, oldest_at, recorded_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (shard, etype) DO UPDATE SET "
    "epoch = excluded.epoch, messages = excluded.messages, entities = excluded.entities, "
    "oldest_at = excluded.oldest_at, recorded_at = excluded.recorded_at")

_LIVE = "l.expires_at >= ? AND l.owner <> ''"

VOUCHED = ("SELECT l.shard FROM leases l JOIN backlogs h ON h.shard = l.shard "
           f"AND h.etype = '' AND h.epoch = l.epoch WHERE {_LIVE}")
"""The shards a live holder vouches for, at its lease's epoch."""

SUMMED = (
    "SELECT b.etype, sum(b.messages), sum(b.entities), min(b.oldest_at) FROM leases l "
    "JOIN backlogs h ON h.shard = l.shard AND h.etype = '' AND h.epoch = l.epoch "
    "JOIN backlogs b ON b.shard = l.shard AND b.epoch = l.epoch AND b.etype <> '' "
    f"WHERE {_LIVE} AND b.entities > 0 GROUP BY b.etype")
"""The vouched summaries, summed by type."""

# Each running entity's accepted and applied seqs (`_progress.applied_sql`), its
# progress (and the run's first seq where its row has none: `_tables.first_seq_sql`)
# looked up by key per entity (scalar subqueries: never a join the planner may turn
# into a walk); the oldest unapplied entry of those behind, by its seq.
EXACT = """
SELECT etype, sum(accepted - applied), count(*), min(oldest) FROM (
    SELECT etype, accepted, applied, (SELECT j.accepted_at FROM journal j
        WHERE j.etype = b.etype AND j.key = b.key AND j.seq > b.applied
        ORDER BY j.seq LIMIT 1) AS oldest
    FROM (SELECT e.etype AS etype, e.key AS key, e.next_seq - 1 AS accepted, {greatest}(
            coalesce((SELECT p.applied_seq FROM progress p
                      WHERE p.etype = e.etype AND p.key = e.key), 0),
            coalesce(e.passivated_seq, 0), {first_seq} - 1) AS applied
          FROM entities e WHERE e.status = 'running'{shards}) b
    WHERE accepted > applied) t
GROUP BY etype
""".replace("{first_seq}", first_seq_sql("e"))


def exact_sql(q: Txn, shards: int | None = None) -> str:
    """The exact backlog's statement on `q`'s engine: of every shard, or of `shards`
    of them (`e.shard IN (?, ...)`, a seek of `entities_running` per shard)."""
    where = "" if shards is None else f" AND e.shard IN ({', '.join('?' * shards)})"
    return EXACT.format(greatest=q.GREATEST, shards=where)


def summary_rows(fence: Fence, summary: ShardBacklog, at: float
                 ) -> list[tuple[object, ...]]:
    """The rows of `SUMMARIZE` for the fence's shard: its row of type '' (vouched for
    at the fence's epoch, or at 0 when the summary's types are not known), each type
    of the summary, and each type gone, at zero."""
    known = summary.types is not None
    shard, epoch = fence.shard, fence.epoch if known else 0
    rows: list[tuple[object, ...]] = [(shard, "", epoch, 0, 0, None, at)]
    if summary.types is not None:
        for etype, (messages, entities, oldest) in sorted(summary.types.items()):
            rows.append((shard, etype, epoch, messages, entities, oldest, at))
        rows.extend((shard, etype, epoch, 0, 0, None, at) for etype in sorted(summary.gone))
    return rows


async def backlog(q: Txn, now: float, shards: int | None) -> tuple[TypeBacklog, ...]:
    """The backlog by type: the vouched summaries, plus the exact count of the shards
    (of `shards`; None: not pinned, every shard counted exactly) no live holder
    vouches for."""
    summed: dict[str, tuple[int, int, float | None]] = {}
    if shards is None:
        rest: list[int] | None = None
    else:
        summed = {r[0]: (int(r[1]), int(r[2]), r[3]) for r in await q.fetchall(SUMMED, now)}
        vouched = {int(r[0]) for r in await q.fetchall(VOUCHED, now)}
        rest = [s for s in range(shards) if s not in vouched]
    if rest is None or rest:
        exact = await q.fetchall(exact_sql(q, None if rest is None else len(rest)),
                                 *(rest or ()))
        for etype, messages, entities, oldest in exact:
            was = summed.get(etype, (0, 0, None))
            olds = [t for t in (was[2], oldest) if t is not None]
            summed[etype] = (was[0] + int(messages), was[1] + int(entities),
                             min(olds) if olds else None)
    return tuple(TypeBacklog(etype, *summed[etype]) for etype in sorted(summed)
                 if summed[etype][1] > 0)
