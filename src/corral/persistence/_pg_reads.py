"""PostgreSQL reads on a pooled connection (single statements: no transaction needed),
and the journal tail's position: one opaque int packing a tick per shard.

The tail never goes by a global sequence (see `_pg_schema`): per shard, ticks become
visible in commit order with no gaps, so "every entry of shard k with tick > t" read
twice can only grow, and nothing committed late is skipped. A position packs the last
tick seen of every shard into one int, 64 bits per shard (`pack_position`). A shard
the caller does not tail jumps to its current tick, so a position never lags far
behind for shards it does not own, unless the store is acquiring or holding it: then
it keeps its place, so a host that registers the shard just after a tail still gets
what was accepted for it meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from corral._common import RunStatus

from ._dead_letters import DEAD_LETTER_COLUMNS
from ._listing import ENTITY_COLUMNS, after_within, entity_from_row
from ._records import (
    DeadLetter,
    EntityDetails,
    EntityRecord,
    EntryKind,
    JournalEntry,
    RunRecord,
    Suspension,
    UpdateOutcome,
)
from ._suspensions import OF_ENTITY, OF_SHARD, numbered, suspension_from_row
from ._waits import WAIT_COLUMNS, wait_from_row

__all__ = [
    "current_ticks",
    "dead_letter_seqs",
    "dead_letters",
    "due_timers",
    "journal",
    "latest_run",
    "latest_snapshot",
    "next_timer",
    "pack_position",
    "read_tail",
    "running_entities",
    "runs",
    "shard_suspensions",
    "suspension_of",
    "unpack_position",
    "update_outcome",
]

_TICK_BITS = 64
_TICK_MASK = (1 << _TICK_BITS) - 1
_ENTRY_COLS = "etype, key, seq, run_id, kind, name, message_id, payload, sender, accepted_at"


def pack_position(ticks: Sequence[int]) -> int:
    """One int holding each shard's last tick seen (shard k in bits 64k..64k+63)."""
    pos = 0
    for shard, tick in enumerate(ticks):
        pos |= (tick & _TICK_MASK) << (_TICK_BITS * shard)
    return pos


def unpack_position(pos: int, shards: int) -> list[int]:
    return [(max(pos, 0) >> (_TICK_BITS * s)) & _TICK_MASK for s in range(shards)]


def _entry(r: Sequence[Any]) -> JournalEntry:
    return JournalEntry(r[0], r[1], r[2], r[3], EntryKind(r[4]), r[5], r[6], r[7], r[8], r[9])


async def current_ticks(conn: Any, shards: int) -> list[int]:
    """Every shard's committed tick (entries accepted so far), shard by shard."""
    ticks = [0] * shards
    for r in await conn.fetch("SELECT shard, tick FROM shard_ticks WHERE shard < $1", shards):
        if r[0] >= 0:
            ticks[r[0]] = r[1]
    return ticks


_TAIL = f"""
SELECT j.shard, j.tick, {", ".join("j." + c for c in _ENTRY_COLS.split(", "))}
FROM unnest($1::int[], $2::bigint[]) AS c(shard, after)
CROSS JOIN LATERAL (
    SELECT * FROM journal WHERE journal.shard = c.shard AND journal.tick > c.after
    ORDER BY journal.tick LIMIT $3
) AS j
ORDER BY j.shard, j.tick
"""


async def read_tail(conn: Any, cursor: list[int], tailed: Iterable[int], held: Iterable[int],
                    limit: int) -> tuple[int, list[JournalEntry]]:
    """Entries after `cursor` of the `tailed` shards, and the position after them.

    A shard neither tailed nor `held` (being acquired or hosted through this store)
    jumps to its current tick; a held shard that is not tailed yet keeps its place, so
    a host that registers a shard just after this read still gets what was accepted
    for it meanwhile.
    """
    n = len(cursor)
    tailed = sorted(s for s in set(tailed) if 0 <= s < n)
    keep = set(tailed) | {s for s in held if 0 <= s < n}
    new = list(cursor)
    for shard, tick in enumerate(await current_ticks(conn, n)):
        if shard not in keep:
            new[shard] = max(new[shard], tick)
    entries: list[JournalEntry] = []
    if tailed:
        per_shard = max(1, -(-limit // len(tailed)))
        rows = await conn.fetch(_TAIL, tailed, [cursor[s] for s in tailed], per_shard)
        for r in rows:
            new[r[0]] = max(new[r[0]], r[1])
            entries.append(_entry(r[2:]))
    return pack_position(new), entries


async def due_timers(conn: Any, shards: frozenset[int], now: float) -> list[tuple[str, str]]:
    """Entities of `shards` with a timer due at `now`, the earliest due first."""
    rows = await conn.fetch(
        "SELECT etype, key, min(due_at) AS due FROM timers WHERE shard = ANY($1::int[]) "
        "AND due_at <= $2 GROUP BY etype, key ORDER BY due", sorted(shards), now)
    return [(r[0], r[1]) for r in rows]


async def next_timer(conn: Any, shards: frozenset[int]) -> float | None:
    """When the earliest durable timer of `shards` is due (None: no timer)."""
    due = await conn.fetchval("SELECT min(due_at) FROM timers WHERE shard = ANY($1::int[])",
                              sorted(shards))
    return None if due is None else float(due)


async def latest_snapshot(conn: Any, etype: str, key: str, run_id: int
                          ) -> tuple[int, bytes] | None:
    row = await conn.fetchrow(
        "SELECT applied_seq, state FROM snapshots WHERE etype = $1 AND key = $2 "
        "AND run_id = $3 ORDER BY applied_seq DESC LIMIT 1", etype, key, run_id)
    return None if row is None else (int(row[0]), bytes(row[1]))


async def journal(conn: Any, etype: str, key: str, run_id: int, after_seq: int
                  ) -> list[JournalEntry]:
    rows = await conn.fetch(
        f"SELECT {_ENTRY_COLS} FROM journal WHERE etype = $1 AND key = $2 AND seq > $3 "
        "AND run_id = $4 ORDER BY seq", etype, key, after_seq, run_id)
    return [_entry(r) for r in rows]


_RUN_COLS = ("run_id, status, start_input, result, error, started_at, closed_at, "
             "continued_from, first_seq")


def _run(etype: str, key: str, r: Sequence[Any]) -> RunRecord:
    return RunRecord(etype, key, r[0], RunStatus(r[1]), r[2], r[3], r[4], r[5], r[6], r[7],
                     r[8])


async def latest_run(conn: Any, etype: str, key: str) -> tuple[RunRecord, int] | None:
    row = await conn.fetchrow(
        f"SELECT {', '.join('r.' + c for c in _RUN_COLS.split(', '))}, e.next_seq "
        "FROM entities e JOIN runs r ON r.etype = e.etype AND r.key = e.key "
        "AND r.run_id = e.run_id WHERE e.etype = $1 AND e.key = $2", etype, key)
    return None if row is None else (_run(etype, key, row), row[9])


async def runs(conn: Any, etype: str, key: str) -> list[RunRecord]:
    rows = await conn.fetch(f"SELECT {_RUN_COLS} FROM runs WHERE etype = $1 AND key = $2 "
                            "ORDER BY run_id", etype, key)
    return [_run(etype, key, r) for r in rows]


async def running_entities(conn: Any, shard: int) -> list[tuple[str, str]]:
    rows = await conn.fetch(
        "SELECT etype, key FROM entities WHERE shard = $1 AND status = 'running' AND "
        "(passivated_seq IS NULL OR next_seq - 1 > passivated_seq)", shard)
    return [(r[0], r[1]) for r in rows]


async def count_running(conn: Any, shard: int) -> int:
    return int(await conn.fetchval(
        "SELECT count(*) FROM entities WHERE shard = $1 AND status = 'running'", shard))


async def update_outcome(conn: Any, etype: str, key: str, message_id: str
                         ) -> UpdateOutcome | None:
    text = await conn.fetchval("SELECT outcome FROM dedupe WHERE etype = $1 AND key = $2 "
                               "AND message_id = $3", etype, key, message_id)
    return None if text is None else UpdateOutcome.from_json(text)


async def dead_letters(conn: Any, etype: str | None, key: str | None, limit: int,
                       after: int) -> list[DeadLetter]:
    rows = await conn.fetch(
        f"SELECT id, {DEAD_LETTER_COLUMNS} FROM dead_letters WHERE id > $4 AND "
        "($1::text IS NULL OR etype = $1) AND ($2::text IS NULL OR key = $2) "
        "ORDER BY id LIMIT $3", etype, key, limit, after)
    return [DeadLetter(*r) for r in rows]


async def dead_letter_seqs(conn: Any, etype: str, key: str, run_id: int) -> frozenset[int]:
    rows = await conn.fetch("SELECT seq FROM dead_letters WHERE etype = $1 AND key = $2 "
                            "AND run_id = $3", etype, key, run_id)
    return frozenset(int(r[0]) for r in rows)


async def list_entities(conn: Any, etype: str | None, status: RunStatus | None, limit: int,
                        after: tuple[str, str] | None) -> list[EntityRecord]:
    """A page of entities in (etype, key) order (see `_listing.list_entities`)."""
    start = after_within(etype, after)
    if start is False:
        return []
    where: list[str] = []
    args: list[Any] = []
    if status is not None:
        args.append(status.value)
        where.append(f"status = ${len(args)}")
    if etype is not None:
        args.append(etype)
        where.append(f"etype = ${len(args)}")
    if isinstance(start, tuple) and etype is not None:
        args.append(start[1])
        where.append(f"key > ${len(args)}")
    elif isinstance(start, tuple):
        args.extend(start)
        where.append(f"(etype, key) > (${len(args) - 1}, ${len(args)})")
    args.append(limit)
    rows = await conn.fetch(
        f"SELECT {ENTITY_COLUMNS} FROM entities {'WHERE ' if where else ''}"
        f"{' AND '.join(where)} ORDER BY etype, key LIMIT ${len(args)}", *args)
    return [entity_from_row(r) for r in rows]


async def entity_details(conn: Any, etype: str, key: str, run_id: int) -> EntityDetails:
    snap = await conn.fetchrow(
        "SELECT applied_seq, created_at FROM snapshots WHERE etype = $1 AND key = $2 "
        "AND run_id = $3 ORDER BY applied_seq DESC LIMIT 1", etype, key, run_id)
    timers = await conn.fetch("SELECT due_at FROM timers WHERE etype = $1 AND key = $2 "
                              "ORDER BY due_at", etype, key)
    waits = await conn.fetch(f"SELECT {WAIT_COLUMNS} FROM signal_waits WHERE etype = $1 "
                             "AND key = $2 AND run_id = $3 ORDER BY name", etype, key, run_id)
    dead = await conn.fetchval("SELECT count(*) FROM dead_letters WHERE etype = $1 "
                               "AND key = $2", etype, key)
    return EntityDetails(None if snap is None else snap[0], None if snap is None else snap[1],
                         tuple(t[0] for t in timers), tuple(wait_from_row(w) for w in waits),
                         int(dead), await suspension_of(conn, etype, key))


async def suspension_of(conn: Any, etype: str, key: str) -> Suspension | None:
    """The suspension of the entity's running run (see `_suspensions`)."""
    row = await conn.fetchrow(numbered(OF_ENTITY), etype, key)
    return None if row is None else suspension_from_row(row)


async def shard_suspensions(conn: Any, shard: int) -> list[Suspension]:
    """The suspended running runs of `shard`."""
    return [suspension_from_row(r) for r in await conn.fetch(numbered(OF_SHARD), shard)]
