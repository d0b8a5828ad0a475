"""Every read of the store, written once for both engines on a transaction's `fetchone`
/ `fetchall` (a `Txn` that never writes: SQLite's reader connection, a pooled
PostgreSQL connection). Only the journal tail differs by engine (SQLite's global `pos`,
PostgreSQL's per-shard ticks: `_pg_tail`).

The entity listing walks an index in key order: by (etype, key) (the primary key) with
or without a type, and by `entities_status` (status, etype, key) with a status, so a
page costs the same however many entities the store holds.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

from corral._common import RunStatus
from corral._errors import CorruptRowError

from ._progress import applied_sql, oldest_unapplied_sql, page_with_progress, progress_from
from ._records import (
    DeadLetter,
    EntityDetails,
    EntityRecord,
    EntryKind,
    JournalEntry,
    Progress,
    RunRecord,
    Suspension,
    UnreadableRow,
    UpdateOutcome,
    WaitRecord,
)
from ._rows import Row
from ._suspensions import OF_ENTITY, OF_SHARD, SUSPENDED_COLUMN, suspension_from_row
from ._tables import first_seq_sql
from ._txn import Txn
from ._unapplied import DEAD_LETTER_COLUMNS
from ._waits import WAIT_COLUMNS, WaitPosition, wait_from_row

__all__ = [
    "ENTRY_COLUMNS",
    "after_within",
    "count_running",
    "dead_letter_seqs",
    "dead_letters",
    "due_timers",
    "entity_details",
    "entry_from_row",
    "journal",
    "latest_run",
    "latest_snapshot",
    "list_entities",
    "next_timer",
    "open_waits",
    "running_entities",
    "runs",
    "shard_suspensions",
    "tail_entries",
    "update_outcome",
    "urgent_entities",
]

log = logging.getLogger("corral.store")

ENTRY_COLUMNS = ("etype, key, seq, run_id, kind, name, message_id, payload, sender, "
                 "accepted_at, trace")
_ENTITY_COLUMNS = ", ".join(f"entities.{c}" for c in (
    "etype", "key", "shard", "run_id", "status")) + (
    ", entities.next_seq - 1, entities.passivated_seq, entities.updated_at, "
    f"{SUSPENDED_COLUMN}")


def _progress_columns(q: Txn) -> str:
    """The `Progress` columns, over `progress_from()`."""
    return f"{applied_sql(q)}, p.mailbox, p.recorded_at, {oldest_unapplied_sql(q)}"


def _progress(etype: str, key: str, r: Sequence[Any]) -> Progress:
    row = Row("progress", etype, key)
    return Progress(row.integer("applied_seq", r[0]), row.maybe_integer("mailbox", r[1]),
                    row.maybe_seconds("recorded_at", r[2]),
                    Row("journal", etype, key).maybe_seconds("accepted_at", r[3]))


_RUN_COLUMNS = ("run_id, status, start_input, result, error, started_at, closed_at, "
                "continued_from, first_seq")


_KINDS = {k.value: k for k in EntryKind}


def entry_from_row(r: Sequence[Any]) -> JournalEntry:
    """A journal row (`ENTRY_COLUMNS`) as an entry; `CorruptRowError` if its kind or
    time does not decode (checked on the way, at the cost of a lookup: every applied
    entry passes here)."""
    kind, at = _KINDS.get(r[4]), r[9]
    if kind is None or type(at) is not float:
        row = Row("journal", r[0], r[1], r[3], what=f"seq {r[2]}")
        kind, at = row.enum("kind", EntryKind, r[4]), row.seconds("accepted_at", at)
    return JournalEntry(r[0], r[1], r[2], r[3], kind, r[5], r[6], r[7], r[8], at, r[10])


def tail_entries(rows: Sequence[Sequence[Any]]) -> list[JournalEntry]:
    """The entries of a journal tail read (rows start at `ENTRY_COLUMNS`), without
    those that do not decode: one bad row must not stop a host delivering every other
    entity's entries. It is logged; its entity meets it again when it recovers from
    its journal (a gap, a restart), which suspends its run with the `CorruptRowError`."""
    entries: list[JournalEntry] = []
    for r in rows:
        try:
            entries.append(entry_from_row(r))
        except CorruptRowError as err:
            log.warning("journal tail: entry left to its entity's recovery: %s", err)
    return entries


def _run(etype: str, key: str, r: Sequence[Any]) -> RunRecord:
    row = Row("runs", etype, key, r[0])
    return RunRecord(etype, key, row.integer("run_id", r[0]),
                     row.enum("status", RunStatus, r[1]), r[2], r[3], r[4],
                     row.seconds("started_at", r[5]), row.maybe_seconds("closed_at", r[6]),
                     row.maybe_integer("continued_from", r[7]), row.integer("first_seq", r[8]))


def _marks(values: Collection[Any]) -> str:
    return ", ".join("?" * len(values))


async def due_timers(q: Txn, shards: frozenset[int], now: float) -> list[tuple[str, str]]:
    """Entities of `shards` with a timer due at `now`, the earliest due first."""
    if not shards:
        return []
    rows = await q.fetchall(
        f"SELECT etype, key, min(due_at) AS due FROM timers WHERE shard IN ({_marks(shards)}) "
        "AND due_at <= ? GROUP BY etype, key ORDER BY due", *sorted(shards), now)
    return [(r[0], r[1]) for r in rows]


async def next_timer(q: Txn, shards: frozenset[int]) -> float | None:
    """When the earliest durable timer of `shards` is due (None: no timer)."""
    if not shards:
        return None
    row = await q.fetchone(f"SELECT min(due_at) FROM timers WHERE shard IN ({_marks(shards)})",
                           *sorted(shards))
    due = None if row is None else row[0]
    if due is None or (isinstance(due, int | float) and not isinstance(due, bool)):
        return None if due is None else float(due)
    # Only text left (SQLite: text sorts after numbers): no timer of these shards is
    # readable; each entity meets its own when it is read (`CorruptRowError`).
    log.warning("shards %s: the earliest timer's due_at is %r, not a number; no timer "
                "of theirs is due", sorted(shards), due)
    return None


async def latest_snapshot(q: Txn, etype: str, key: str, run_id: int
                          ) -> tuple[int, bytes] | None:
    """The newest snapshot of the run: (applied_seq, its JSON envelope), or None."""
    row = await q.fetchone(
        "SELECT applied_seq, state FROM snapshots WHERE etype = ? AND key = ? "
        "AND run_id = ? ORDER BY applied_seq DESC LIMIT 1", etype, key, run_id)
    if row is None:
        return None
    where = Row("snapshots", etype, key, run_id, what=f"snapshot at seq {row[0]}")
    return where.integer("applied_seq", row[0]), where.blob("state", row[1])


async def journal(q: Txn, etype: str, key: str, run_id: int, after_seq: int,
                  limit: int | None = None) -> list[JournalEntry]:
    """The run's journal entries after `after_seq`, in order (at most `limit`)."""
    rows = await q.fetchall(
        f"SELECT {ENTRY_COLUMNS} FROM journal WHERE etype = ? AND key = ? AND seq > ? "
        f"AND run_id = ? ORDER BY seq{'' if limit is None else ' LIMIT ?'}",
        etype, key, after_seq, run_id, *(() if limit is None else (limit,)))
    return [entry_from_row(r) for r in rows]


async def latest_run(q: Txn, etype: str, key: str) -> tuple[RunRecord, int] | None:
    """The entity's latest run and its next journal seq, or None if never started."""
    row = await q.fetchone(
        f"SELECT {', '.join('r.' + c for c in _RUN_COLUMNS.split(', '))}, e.next_seq "
        "FROM entities e JOIN runs r ON r.etype = e.etype AND r.key = e.key "
        "AND r.run_id = e.run_id WHERE e.etype = ? AND e.key = ?", etype, key)
    return None if row is None else (_run(etype, key, row),
                                     Row("entities", etype, key).integer("next_seq", row[9]))


async def runs(q: Txn, etype: str, key: str) -> list[RunRecord]:
    rows = await q.fetchall(f"SELECT {_RUN_COLUMNS} FROM runs WHERE etype = ? AND key = ? "
                            "ORDER BY run_id", etype, key)
    return [_run(etype, key, r) for r in rows]


URGENT = (
    # a durable timer due (a sleep, or a signal wait's deadline): one seek of the
    # shard's due timers (`timers_shard_due`), hashed, never a lookup per entity
    "((etype, key) IN (SELECT t.etype, t.key FROM timers t WHERE t.shard = ? "
    "AND t.due_at <= ?) "
    # a backlog: accepted beyond the applied watermark (`_progress.applied_sql`: its
    # passivation, its recorded progress, its run's first seq - 1), read by primary-key
    # lookups in that order, each only if the ones before leave it a backlog (a join
    # may walk `runs` and `progress` on PostgreSQL); the run's, seldom needed, last
    "OR CASE WHEN next_seq - 1 <= coalesce(passivated_seq, 0) THEN 0 "
    "WHEN next_seq - 1 <= coalesce((SELECT p.applied_seq FROM progress p "
    "WHERE p.etype = entities.etype AND p.key = entities.key), 0) THEN 0 "
    f"WHEN next_seq - 1 > {first_seq_sql()} - 1 THEN 1 "
    "ELSE 0 END = 1 "
    # a step recorded that no checkpoint covers yet: run() was between its steps
    "OR EXISTS (SELECT 1 FROM steps s WHERE s.etype = entities.etype "
    "AND s.key = entities.key AND s.run_id = entities.run_id))")
"""Whether a running entity needs its activation before the rest of its shard's
(`runtime/host/_shard.recover`): something of it is waiting to be done. Updates
waiting for their callers and deliveries to signal waits are journal entries: a
backlog. An entity whose progress its last host did not record yet reads as urgent
(its applied watermark is behind): it is activated early, which costs nothing but its
place in the line. Parameters: the shard, then the time timers are due by."""

RUNNING = ("shard = ? AND status = 'running' "
           "AND (passivated_seq IS NULL OR next_seq - 1 > passivated_seq)")
"""A shard's running entities to recover (not the passivated ones with nothing new to
apply): a seek of the partial index `entities_running` (shard). Parameter: the shard."""

RUNNING_ENTITIES = "SELECT etype, key FROM entities{index} WHERE " + RUNNING
"""A shard's recovery read: its running entities (`RUNNING`), nothing else looked up.
`{index}`: `Txn.RUNNING_INDEX`."""

URGENT_ENTITIES = "SELECT etype, key FROM entities{index} WHERE " + f"{RUNNING} AND {URGENT}"
"""A shard's running entities that are urgent (`URGENT`): the first recovery read, few
rows however many are running (`{index}`: `Txn.RUNNING_INDEX`). Parameters: the shard,
the shard, the time. Per entity it costs the lookup of its progress (and of a step):
what is urgent is known from other tables' rows, and an index of entities over it would
be updated by every accept (`next_seq`), which then could no longer update the row in
place."""


async def running_entities(q: Txn, shards: Sequence[int]) -> dict[int, list[tuple[str, str]]]:
    """{shard: [(type, key)]} for every one of `shards`, on one connection: a statement
    per shard, each a seek of its own (with the shards in one `IN` list, SQLite walked
    every running entity through `entities_status` instead)."""
    found: dict[int, list[tuple[str, str]]] = {}
    for shard in shards:
        found[shard] = [(r[0], r[1]) for r in await q.fetchall(
            RUNNING_ENTITIES.format(index=q.RUNNING_INDEX), shard)]
    return found


async def urgent_entities(q: Txn, shards: Sequence[int], now: float
                          ) -> dict[int, list[tuple[str, str]]]:
    """{shard: [(type, key)]} of the urgent running entities (`URGENT_ENTITIES`, a
    timer due at `now`) for every one of `shards`, on one connection."""
    found: dict[int, list[tuple[str, str]]] = {}
    for shard in shards:
        found[shard] = [(r[0], r[1])
                        for r in await q.fetchall(URGENT_ENTITIES.format(index=q.RUNNING_INDEX),
                                                    shard, shard, now)]
    return found


async def count_running(q: Txn, shard: int) -> int:
    """Entities of `shard` whose run is running (passivated ones included)."""
    row = await q.fetchone(
        "SELECT count(*) FROM entities WHERE shard = ? AND status = 'running'", shard)
    assert row is not None
    return int(row[0])


async def update_outcome(q: Txn, etype: str, key: str, message_id: str
                         ) -> UpdateOutcome | None:
    row = await q.fetchone("SELECT outcome FROM dedupe WHERE etype = ? AND key = ? "
                           "AND message_id = ?", etype, key, message_id)
    if row is None or row[0] is None:
        return None
    where = Row("dedupe", etype, key, what=f"update {message_id!r}")
    data = where.json("outcome", row[0])
    if not (isinstance(data, dict) and all(
            isinstance(data.get(k), str | None) for k in ("result", "error"))):
        raise where.corrupt("outcome", "is not an update's outcome")
    return UpdateOutcome(data.get("result"), data.get("error"))


def dead_letter_page(etype: str | None, key: str | None, *, row_cursor: bool
                     ) -> tuple[str, int]:
    """The statement of a page of dead letters (`dead_letters`) and how many of the
    fixed values (etype, key as given) come before the cursor's `after` in its
    arguments; the fixed values again and the limit follow.

    One type's, or one entity's, page is a seek of `dead_letters_type` (etype, id) or
    `dead_letters_key` (etype, key, id). `row_cursor` (`Txn.ROW_CURSOR`): the cursor is
    a row value over the index's columns, which only that index can seek (with
    `id > ?` PostgreSQL walked the primary key past every other type's letters: x39
    from 10k to 1M entities); else `id > ?` beside the equalities (SQLite)."""
    fixed = [c for c, v in (("etype", etype), ("key", key)) if v is not None]
    columns = [*fixed, "id"] if etype is not None else ["id"]
    by_row = row_cursor and len(columns) > 1
    cursor = f"({', '.join(columns)}) > ({', '.join('?' * len(columns))})" if by_row \
        else "id > ?"
    where = " AND ".join([cursor, *(f"{c} = ?" for c in fixed)])
    return (f"SELECT id, {DEAD_LETTER_COLUMNS} FROM dead_letters WHERE {where} "
            f"ORDER BY {', '.join(columns)} LIMIT ?"), len(fixed) if by_row else 0


async def dead_letters(q: Txn, etype: str | None, key: str | None, limit: int,
                       after: int) -> list[DeadLetter]:
    """Dead letters with an id above `after`, oldest first, optionally of one entity
    type and/or key."""
    fixed = [v for v in (etype, key) if v is not None]
    sql, before = dead_letter_page(etype, key, row_cursor=q.ROW_CURSOR)
    rows = await q.fetchall(sql, *fixed[:before], after, *fixed, limit)
    return [_dead_letter(r) for r in rows]


def _dead_letter(r: Sequence[Any]) -> DeadLetter:
    row = Row("dead_letters", r[1], r[2], r[3], what=f"dead letter {r[0]}")
    return DeadLetter(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10],
                      r[11], row.seconds("failed_at", r[12]))


async def dead_letter_seqs(q: Txn, etype: str, key: str, run_id: int) -> frozenset[int]:
    """The journal seqs of the run that have a dead letter."""
    rows = await q.fetchall("SELECT seq FROM dead_letters WHERE etype = ? AND key = ? "
                            "AND run_id = ?", etype, key, run_id)
    return frozenset(int(r[0]) for r in rows)


def after_within(etype: str | None, after: tuple[str, str] | None
                 ) -> tuple[str, str] | bool | None:
    """Where a page of one type (`etype`) starts: `after`, None (from the type's first
    key), or False (nothing: the cursor is past the type). With one type the query
    compares keys only (`key > ?`), which both databases seek in the index directly."""
    if etype is None or after is None or after[0] == etype:
        return after
    return None if after[0] < etype else False


async def list_entities(q: Txn, etype: str | None, status: RunStatus | None, limit: int,
                        after: tuple[str, str] | None, key_prefix: str | None = None
                        ) -> list[EntityRecord | UnreadableRow]:
    """A page of entities in (etype, key) order after `after`, optionally only those
    whose key starts with `key_prefix` (a seek for one type: SQLite's key range, or
    PostgreSQL's `entities_key_prefix`; across types, the same seek type after type,
    `_prefix_across_types`). A row that does not decode is an `UnreadableRow` in its
    place."""
    if key_prefix and etype is None:
        return await _prefix_across_types(q, status, limit, after, key_prefix)
    start = after_within(etype, after)
    if start is False:
        return []
    where: list[str] = []
    args: list[Any] = []
    if status is not None:
        where.append("entities.status = ?")
        args.append(status.value)
    if etype is not None:
        where.append("entities.etype = ?")
        args.append(etype)
    if key_prefix:
        condition, prefix_args = q.starts_with("entities.key", key_prefix)
        where.append(condition)
        args.extend(prefix_args)
    if isinstance(start, tuple) and etype is not None:
        where.append("entities.key > ?")
        args.append(start[1])
    elif isinstance(start, tuple):
        where.append("(entities.etype, entities.key) > (?, ?)")
        args.extend(start)
    # One type and a prefix: planned for the prefix, a seek of `entities_key_prefix` on
    # PostgreSQL (a cached generic plan walks the type's keys).
    fetch = q.fetchall_replanned if key_prefix else q.fetchall
    page = (f"SELECT * FROM entities {'WHERE ' if where else ''}{' AND '.join(where)} "
            "ORDER BY entities.etype, entities.key LIMIT ?")
    rows = await fetch(page_with_progress(f"{_ENTITY_COLUMNS}, {_progress_columns(q)}", page,
                                          ranged=q.PAGE_RANGE), *args, limit)
    return [_listed(r) for r in rows]


async def _prefix_across_types(q: Txn, status: RunStatus | None, limit: int,
                               after: tuple[str, str] | None, key_prefix: str
                               ) -> list[EntityRecord | UnreadableRow]:
    """A key-prefix page across every type: the types in order from the cursor's, each
    found by one seek of the primary key (the next type after the last), and each
    searched with the one-type seek for what the page still needs. Its cost grows with
    the number of types and the page, never with the entities (a filter on a walk of
    the whole table read every row when fewer than a page matched: 3.0M SQLite VM
    steps at 1M entities)."""
    found: list[EntityRecord | UnreadableRow] = []
    etype = await _next_type(q, None if after is None else after[0], inclusive=True)
    while etype is not None:
        found += await list_entities(q, etype, status, limit - len(found), after, key_prefix)
        if len(found) >= limit:  # full: no seek for a type it would not search
            break
        etype = await _next_type(q, etype, inclusive=False)
    return found


async def _next_type(q: Txn, etype: str | None, *, inclusive: bool) -> str | None:
    """The first entity type from `etype` on (after it unless `inclusive`; None: from
    the first): one seek of the primary key, whatever the entities of each type."""
    if etype is None:
        row = await q.fetchone("SELECT min(etype) FROM entities")
    else:
        row = await q.fetchone(
            f"SELECT min(etype) FROM entities WHERE etype {'>=' if inclusive else '>'} ?",
            etype)
    return None if row is None else row[0]


def _listed(r: Sequence[Any]) -> EntityRecord | UnreadableRow:
    """A listing row as a record, or as unreadable (never an error: one bad row must not
    break a deployment-wide listing)."""
    try:
        row = Row("entities", r[0], r[1])
        return EntityRecord(r[0], r[1], row.integer("shard", r[2]),
                            row.integer("run_id", r[3]), row.enum("status", RunStatus, r[4]),
                            row.integer("next_seq", r[5]),
                            row.maybe_integer("passivated_seq", r[6]),
                            row.maybe_seconds("updated_at", r[7]), bool(r[8]),
                            _progress(r[0], r[1], r[9:]))
    except CorruptRowError as err:
        return UnreadableRow(r[0], r[1], str(err))


async def entity_details(q: Txn, etype: str, key: str, run_id: int) -> EntityDetails:
    """The run's latest snapshot, the entity's pending timers, the run's signal waits,
    the entity's dead-letter count and its suspension."""
    snap = await q.fetchone(
        "SELECT applied_seq, created_at FROM snapshots WHERE etype = ? AND key = ? "
        "AND run_id = ? ORDER BY applied_seq DESC LIMIT 1", etype, key, run_id)
    timers = await q.fetchall("SELECT due_at FROM timers WHERE etype = ? AND key = ? "
                              "ORDER BY due_at", etype, key)
    waits = await q.fetchall(f"SELECT {WAIT_COLUMNS} FROM signal_waits WHERE etype = ? "
                             "AND key = ? AND run_id = ? ORDER BY name", etype, key, run_id)
    dead = await q.fetchone("SELECT count(*) FROM dead_letters WHERE etype = ? AND key = ?",
                            etype, key)
    suspended = await q.fetchone(OF_ENTITY, etype, key)
    progress = await q.fetchone(
        f"SELECT {_progress_columns(q)} FROM {progress_from()} "
        "WHERE entities.etype = ? AND entities.key = ?", etype, key)
    assert dead is not None
    row = Row("snapshots", etype, key, run_id)
    return EntityDetails(None if snap is None else row.integer("applied_seq", snap[0]),
                         None if snap is None else row.seconds("created_at", snap[1]),
                         tuple(Row("timers", etype, key).seconds("due_at", t[0])
                               for t in timers),
                         tuple(wait_from_row(w) for w in waits), int(dead[0]),
                         None if suspended is None else suspension_from_row(suspended),
                         None if progress is None else _progress(etype, key, progress))


async def shard_suspensions(q: Txn, shards: Sequence[int]) -> dict[int, list[Suspension]]:
    """{shard: its suspended running runs} for every one of `shards` (a host taking
    them reads them), on one connection: a seek of `suspensions_shard` per shard (in
    one `IN` list, SQLite walked every running entity through `entities_status`)."""
    found: dict[int, list[Suspension]] = {}
    for shard in shards:
        found[shard] = []
        for r in await q.fetchall(OF_SHARD, shard):
            try:
                found[shard].append(suspension_from_row(r))
            except CorruptRowError as err:  # one bad row must not stop a host taking it
                log.warning("shard %d: suspension left out: %s", shard, err)
    return found


async def open_waits(q: Txn, etype: str | None, limit: int, after: WaitPosition | None
                     ) -> list[WaitRecord]:
    """Open waits, oldest first, after the `after` position (opened_at, etype, key,
    run_id, name)."""
    where: list[str] = ["status = 'open'"]
    args: list[Any] = []
    if etype is not None:
        where.append("etype = ?")
        args.append(etype)
    if after is not None:
        where.append("(opened_at, etype, key, run_id, name) > "
                     "(CAST(? AS DOUBLE PRECISION), ?, ?, CAST(? AS BIGINT), ?)")
        args.extend(after)
    rows = await q.fetchall(
        f"SELECT {WAIT_COLUMNS} FROM signal_waits WHERE {' AND '.join(where)} "
        "ORDER BY opened_at, etype, key, run_id, name LIMIT ?", *args, limit)
    found = []
    for r in rows:
        try:
            found.append(wait_from_row(r))
        except CorruptRowError as err:  # one bad row must not break the listing
            log.warning("open waits: a wait left out of the listing: %s", err)
    return found
