"""PostgreSQL's primitives under the shared `Txn` (see `_txn`): statements (the `?` of
the SQL written once numbered `$n`), the batch's locks, and the set-based flush.

Locking (READ COMMITTED): before any op of a batch runs, the transaction locks what
the batch's ops declared (`LockPlan`), always in one global order so two processes'
batches never deadlock on each other: the registry of builds' advisory lock (a checked
registration, `_ops_builds`), then lease rows (sorted by shard), then the shard tick
rows of every shard the batch accepts into (sorted), then the entity rows (sorted).
Each step is its own statement, so what a later step reads is read after the earlier
locks were granted: an acceptance reads the entity and the dedupe window only once it
holds its shard's tick row, which every acceptance into that shard must take, so two
processes can never both start a run, nor both accept one message id, and per entity
the seqs never repeat or reorder; the tick row also numbers the shard's entries in
commit order, for the journal tail (see `_pg_schema`). A fenced host write holds its
lease row `FOR SHARE` until commit, so a takeover (`FOR UPDATE`) either committed
before the write's check, which then refuses it, or waits until the write committed.
Locks an op takes later (rows it writes) can still meet in a cycle in rare cases;
PostgreSQL then aborts one transaction and its batch is re-run one op at a time.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import asyncpg  # type: ignore[import-untyped, import-not-found, unused-ignore]
import orjson

from corral._common import RunStatus
from corral._errors import StoreError, StoreUnavailableError

from ._pg_schema import NOTIFY_CHANNEL
from ._txn import EntityRow, LockPlan, Txn, code_point_range

__all__ = ["LockPlan", "PgTxn", "is_connection_error", "numbered", "store_error"]

_Ident = tuple[str, str]
_NUMBERED: dict[str, str] = {}
_REGISTRY_LOCK = 0x636F7272616C + 1  # "corral" + 1: one checked registration of builds
# at a time (the schema's lock is "corral" itself, `_pg_schema`)


def numbered(sql: str) -> str:
    """`sql` with PostgreSQL's `$1, $2, ...` for the `?` (or `?N`) placeholders it is
    written with (cached: the same few statements come back every batch)."""
    found = _NUMBERED.get(sql)
    if found is None:
        count = iter(range(1, sql.count("?") + 1))
        found = _NUMBERED[sql] = re.sub(
            r"\?(\d*)", lambda m: f"${m.group(1) or next(count)}", sql)
    return found


def is_connection_error(err: BaseException) -> bool:
    """Whether `err` means the connection (not the op) failed: lost, closed, timed out,
    caught mid-reconnect (asyncpg's "another operation is in progress" while a server
    restarts), or the server gave up waiting for a lock (`lock_timeout`: a session cut
    off inside a transaction holds it until the server ends it)."""
    return isinstance(err, OSError | asyncio.TimeoutError | asyncpg.PostgresConnectionError
                      | asyncpg.InterfaceError | asyncpg.exceptions.OperatorInterventionError
                      | asyncpg.exceptions.InternalClientError
                      | asyncpg.exceptions.LockNotAvailableError)


def store_error(what: str, cause: BaseException, *, committed: bool | None = False,
                unavailable: bool = False) -> StoreError:
    """A `StoreError` of its own for one caller, with the driver's error as its cause: a
    `StoreUnavailableError` (retryable) if the connection failed, or if `unavailable`
    (no connection could be had, whatever the driver's error says)."""
    text = f"{what}: {type(cause).__name__}: {cause}"
    err: StoreError
    if unavailable or is_connection_error(cause):
        state = "nothing was committed" if committed is False else "the commit may have landed"
        err = StoreUnavailableError(f"{text} ({state}; retry)", committed=committed)
    else:
        err = StoreError(text)
    err.__cause__ = cause
    return err


_LOCK_LEASES = ("SELECT shard, owner, epoch, expires_at, "
                "extract(epoch FROM clock_timestamp())::float8 FROM leases "
                "WHERE shard = ANY($1::int[]) ORDER BY shard FOR ")
_LOCK_TICKS = ("SELECT shard, tick FROM shard_ticks WHERE shard = ANY($1::int[]) "
               "ORDER BY shard FOR UPDATE")
_LOCK_ENTITIES = (
    "SELECT e.etype, e.key, e.shard, e.run_id, e.status, e.next_seq FROM entities e "
    "JOIN unnest($1::text[], $2::text[]) AS u(etype, key) ON e.etype = u.etype "
    "AND e.key = u.key ORDER BY e.etype, e.key FOR UPDATE OF e"
)
_READ_DEDUPE = (
    "SELECT d.etype, d.key, d.message_id, d.seq, d.run_id, d.payload_hash, d.sender, "
    "d.accepted_at FROM dedupe d JOIN unnest($1::text[], $2::text[], $3::text[]) "
    "AS u(etype, key, message_id) ON d.etype = u.etype AND d.key = u.key "
    "AND d.message_id = u.message_id"
)
_LOCK_AND_READ = f"""
WITH e AS ({_LOCK_ENTITIES}),
d AS (
    SELECT d.etype, d.key, d.message_id, d.seq, d.run_id, d.payload_hash, d.sender,
           d.accepted_at FROM dedupe d
    JOIN unnest($3::text[], $4::text[], $5::text[]) AS u(etype, key, message_id)
    ON d.etype = u.etype AND d.key = u.key AND d.message_id = u.message_id
)
SELECT true, etype, key, NULL::text, shard, run_id, status, next_seq, NULL::bytea,
       NULL::text, NULL::float8 FROM e
UNION ALL
SELECT false, etype, key, message_id, NULL::int, run_id, NULL::text, seq, payload_hash,
       sender, accepted_at FROM d
"""
# One statement writes everything buffered: runs started, journal and dedupe rows (the
# same rows), entity rows, shard ticks, and the commit notification. The rows travel as
# JSON arrays (one text parameter each, parsed by the server), not as one array per
# column: asyncpg checks every element of an array parameter in Python (~3.5 us a journal
# row here, against ~0.5 us for the JSON). Every text in them is free of NUL (ids and
# keys are checked at the boundary, payloads are canonical JSON), which jsonb refuses.
_FLUSH = """
WITH r AS (
    INSERT INTO runs (etype, key, run_id, status, start_input, started_at, first_seq)
    SELECT x->>0, x->>1, (x->>2)::bigint, 'running', x->>3, (x->>4)::float8,
           (x->>5)::bigint
    FROM jsonb_array_elements($1::jsonb) x
), a AS (
    SELECT x->>0 AS etype, x->>1 AS key, (x->>2)::bigint AS seq, (x->>3)::bigint AS run_id,
           (x->>4)::int AS shard, (x->>5)::bigint AS tick, x->>6 AS kind, x->>7 AS name,
           x->>8 AS message_id, x->>9 AS payload, x->>10 AS sender,
           (x->>11)::float8 AS accepted_at, decode(x->>12, 'hex') AS payload_hash,
           x->>13 AS trace
    FROM jsonb_array_elements($2::jsonb) x
), j AS (
    INSERT INTO journal (etype, key, seq, run_id, shard, tick, kind, name, message_id,
                         payload, sender, accepted_at, trace)
    SELECT etype, key, seq, run_id, shard, tick, kind, name, message_id, payload, sender,
           accepted_at, trace FROM a
), d AS (
    INSERT INTO dedupe (etype, key, message_id, seq, run_id, payload_hash, sender,
                        accepted_at)
    SELECT etype, key, message_id, seq, run_id, payload_hash, sender, accepted_at FROM a
), e AS (
    INSERT INTO entities (etype, key, shard, run_id, status, next_seq, updated_at,
                          first_seq)
    SELECT x->>0, x->>1, (x->>2)::int, (x->>3)::bigint, x->>4, (x->>5)::bigint,
           extract(epoch FROM clock_timestamp())::float8, (x->>6)::bigint
    FROM jsonb_array_elements($3::jsonb) x
    ON CONFLICT (etype, key) DO UPDATE SET run_id = excluded.run_id,
        status = excluded.status, next_seq = excluded.next_seq,
        updated_at = excluded.updated_at,
        first_seq = coalesce(excluded.first_seq, entities.first_seq)
), t AS (
    UPDATE shard_ticks s SET tick = u.tick
    FROM unnest($4::int[], $5::bigint[]) AS u(shard, tick) WHERE s.shard = u.shard
)
SELECT pg_notify($6, $7) WHERE $7 <> ''
"""

# One statement for a transaction's changes to the counts (rows in a fixed order, one
# per counter: `Txn.count`).
_ADD_COUNTS = """
INSERT INTO census_counts (etype, what, shard, n)
SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[])
ON CONFLICT (etype, what, shard) DO UPDATE SET n = census_counts.n + excluded.n
"""


# After the snapshot row is written: keep the newest `keep`, delete the journal they
# cover and the dedupe ids that left the window, mark passivation; returns the floor
# and the journal and dedupe rows deleted (the dead rows a vacuum reclaims: `_pg_vacuum`).
# The dedupe sweep is SQLite's (`_sqlite_txn.SWEEP_DEDUPE`): applied ids ($4) past the
# count bound ($5), and too old ones ($6) before the first id kept in seq order, read
# through the partial index `dedupe_sweep` (its predicate `seq > 0` is in both WHEREs).
# The delete's bounds are row comparisons, (etype, key, seq) between ($1, $2, 0) and
# ($1, $2, bound): exactly this entity's ids below the bound, and a condition only an
# index on (etype, key, seq) can serve. With `etype = $1 AND key = $2` the planner,
# on a table not analyzed yet, scanned the primary key and filtered every id by seq.
_TRIM = """
WITH kept AS (
    SELECT applied_seq FROM snapshots WHERE etype = $1 AND key = $2
    ORDER BY applied_seq DESC LIMIT $3
), floor AS (SELECT min(applied_seq) AS seq FROM kept),
s AS (DELETE FROM snapshots WHERE etype = $1 AND key = $2
      AND applied_seq < (SELECT seq FROM floor)),
j AS (DELETE FROM journal WHERE etype = $1 AND key = $2 AND seq <= (SELECT seq FROM floor)
      RETURNING 1),
d AS (DELETE FROM dedupe WHERE (etype, key, seq) > ($1, $2, 0) AND seq > 0
      AND (etype, key, seq) < ($1, $2, LEAST($4 + 1, GREATEST($5 + 1, COALESCE(
          (SELECT seq FROM dedupe WHERE etype = $1 AND key = $2 AND seq > 0
           AND (accepted_at >= $6 OR seq > $4) ORDER BY seq LIMIT 1), $4 + 1))))
      RETURNING 1),
p AS (UPDATE entities SET passivated_seq = $4 WHERE $7 AND etype = $1 AND key = $2)
SELECT (SELECT seq FROM floor), (SELECT count(*) FROM j) + (SELECT count(*) FROM d)
"""


@dataclass(slots=True)
class PgTxn(Txn):
    """One open transaction on the writer connection, with what it locked and buffered.

    Entity rows are read once (locked) and written back once per flush; accepted
    journal and dedupe rows are buffered and written set-based (`flush`, before any op
    that is not `buffered` reads or changes them), numbered per shard by its tick row.
    """

    ROW_LOCK: ClassVar[str] = " FOR UPDATE"
    SHARE_LOCK: ClassVar[str] = " FOR SHARE"
    SKIP_LOCKED: ClassVar[str] = " FOR UPDATE SKIP LOCKED"
    # Re-inserted carried entries get tick 0: they are not new acceptances, and the
    # host that carries them holds them already.
    CARRY_JOURNAL: ClassVar[str] = (
        "INSERT INTO journal (etype, key, seq, run_id, shard, tick, kind, name, message_id, "
        "payload, sender, accepted_at, trace) VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (etype, key, seq) DO UPDATE SET run_id = excluded.run_id"
    )

    conn: Any = field(kw_only=True)
    token: str = field(kw_only=True)  # this store's identity in commit notifications
    # Shards this store holds: their host (this process) delivers its own acceptances,
    # so they need no notification (NOTIFY serialises every notifying commit).
    quiet: frozenset[int] = frozenset()
    # Behind a pooler in transaction mode: no statement prepared by name (the next
    # transaction may run on another server session), and no NOTIFY (nobody LISTENs).
    pooled: bool = False
    # The database's collation orders text by code point ("C", `keys_in_code_points`):
    # a prefix is a range the primary key seeks in key order (`starts_with`), the one
    # plan there is (with `starts_with()` the planner, misjudging how many keys a narrow
    # prefix matches, read them all through `entities_key_prefix` and sorted them).
    code_points: bool = False
    now: float = 0.0  # the server's clock when the lease rows were locked
    ticks: dict[int, int] = field(default_factory=dict)
    deleted: int = 0  # journal and dedupe rows its trims deleted (see `_pg_vacuum`)

    # -- statements -----------------------------------------------------------------

    async def execute(self, sql: str, *args: Any) -> int:
        status = await self.conn.execute(numbered(sql), *args)
        tail = status.rpartition(" ")[2]
        return int(tail) if tail.isdigit() else 0

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            await self.conn.executemany(numbered(sql), rows)

    async def fetchone(self, sql: str, *args: Any) -> Sequence[Any] | None:
        row: Sequence[Any] | None = await self.conn.fetchrow(numbered(sql), *args)
        return row

    async def fetchall(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        return list(await self.conn.fetch(numbered(sql), *args))

    async def fetchall_replanned(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        # A statement prepared for this call alone, outside asyncpg's cache: the server
        # plans it for its parameters (a cached one goes generic after five runs).
        # Pooled, every statement is unnamed (no cache), so planned for its parameters.
        if self.pooled:
            return await self.fetchall(sql, *args)
        statement = await self.conn.prepare(numbered(sql))
        return list(await statement.fetch(*args))

    async def add_counts(self, rows: Sequence[tuple[str, str, int, int]]) -> None:
        await self.conn.execute(_ADD_COUNTS, *(list(c) for c in zip(*rows, strict=True)))

    async def insert_id(self, sql: str, *args: Any) -> int:
        return int(await self.conn.fetchval(numbered(sql) + " RETURNING id", *args))

    def starts_with(self, column: str, prefix: str) -> tuple[str, tuple[Any, ...]]:
        if self.code_points:
            return code_point_range(column, prefix)
        return f"starts_with({column}, ?)", (prefix,)  # independent of the collation

    def joined(self, expr: str, separator: str, *, order: str) -> str:
        return f"string_agg({expr}, {separator} ORDER BY {order})"

    def in_pairs(self, first: str, second: str, pairs: Sequence[tuple[int, int]]
                 ) -> tuple[str, tuple[Any, ...]]:
        return (f"({first}, {second}) IN (SELECT * FROM unnest(?::int[], ?::bigint[]))",
                ([a for a, _ in pairs], [b for _, b in pairs]))

    async def trim(self, etype: str, key: str, *, keep: int, applied_seq: int,
                   forget_seq: int, forget_before: float, passivate: bool) -> int:
        floor, deleted = await self.conn.fetchrow(
            _TRIM, etype, key, keep, applied_seq, forget_seq, forget_before, passivate)
        self.deleted += deleted
        return int(floor)

    # -- locking ------------------------------------------------------------------

    async def lock(self, plan: LockPlan) -> None:
        """Take the plan's locks in the global order (see the module docstring)."""
        if plan.registry:  # first: a registration's batch may hold anything after it
            await self.conn.execute("SELECT pg_advisory_xact_lock($1)", _REGISTRY_LOCK)
        if plan.leases:
            await self._lock_leases(sorted(plan.leases), plan)
        if plan.ticks:
            await self._lock_ticks(sorted(plan.ticks))
        if plan.entities and plan.dedupe:  # an acceptance batch: one round trip for both
            await self._lock_entities_and_read_windows(sorted(plan.entities),
                                                        list(plan.dedupe))
        elif plan.entities:
            await self._lock_entities(sorted(plan.entities))
        elif plan.dedupe:
            await self._read_windows(list(plan.dedupe))

    async def _lock_leases(self, shards: list[int], plan: LockPlan) -> None:
        if plan.new_leases:  # an acquisition may name a shard beyond the pinned count
            await self.conn.execute(
                "INSERT INTO leases (shard, owner, epoch, expires_at) SELECT s, '', 0, 0 "
                "FROM unnest($1::int[]) s ON CONFLICT DO NOTHING", shards)
        mode = "UPDATE" if plan.lease_update else "SHARE"
        for r in await self.conn.fetch(_LOCK_LEASES + mode, shards):
            self.leases[r[0]] = (r[1], r[2], r[3])
            self.now = r[4]

    async def _lock_entities(self, keys: list[_Ident]) -> None:
        for ident in keys:  # absent unless found: only an acceptance creates an entity
            self.read_entity(ident, None)  # row, holding its shard's tick row (held by now)
        rows = await self.conn.fetch(_LOCK_ENTITIES, [k[0] for k in keys], [k[1] for k in keys])
        for r in rows:
            self.read_entity((r[0], r[1]), EntityRow(r[2], r[3], RunStatus(r[4]), r[5]))

    async def _lock_entities_and_read_windows(self, keys: list[_Ident],
                                              ids: list[tuple[str, str, str]]) -> None:
        """`_lock_entities` and `_read_windows` in one statement. Its snapshot is taken
        before it waits for an entity row, which is safe for the dedupe rows: only an
        acceptance adds them, holding its shard's tick row, which this batch holds."""
        for ident in keys:
            self.read_entity(ident, None)
        for etype, key, mid in ids:
            self.dedupe.setdefault((etype, key), {})[mid] = None
        rows = await self.conn.fetch(
            _LOCK_AND_READ, [k[0] for k in keys], [k[1] for k in keys], [i[0] for i in ids],
            [i[1] for i in ids], [i[2] for i in ids])
        for r in rows:
            if r[0]:
                self.read_entity((r[1], r[2]), EntityRow(r[4], r[5], RunStatus(r[6]), r[7]))
            else:
                self.dedupe[(r[1], r[2])][r[3]] = (r[7], r[5], bytes(r[8]), r[9], r[10])

    async def _read_windows(self, ids: list[tuple[str, str, str]]) -> None:
        for etype, key, mid in ids:
            self.dedupe.setdefault((etype, key), {})[mid] = None
        rows = await self.conn.fetch(_READ_DEDUPE, [i[0] for i in ids], [i[1] for i in ids],
                                     [i[2] for i in ids])
        for r in rows:
            self.dedupe[(r[0], r[1])][r[2]] = (r[3], r[4], bytes(r[5]), r[6], r[7])

    async def _lock_ticks(self, shards: list[int]) -> None:
        rows = await self.conn.fetch(_LOCK_TICKS, shards)
        missing = set(shards) - {r[0] for r in rows}
        if missing:  # a shard beyond the pinned count: create its row, then lock it
            await self.conn.execute(
                "INSERT INTO shard_ticks (shard, tick) SELECT s, 0 FROM unnest($1::int[]) s "
                "ON CONFLICT DO NOTHING", sorted(missing))
            rows += await self.conn.fetch(_LOCK_TICKS, sorted(missing))
        for r in rows:
            self.ticks[r[0]] = r[1]

    async def clock(self) -> float:
        """The server's clock when the lease rows were locked (read now if none were)."""
        if not self.now:
            self.now = await self.conn.fetchval(
                "SELECT extract(epoch FROM clock_timestamp())::float8")
        return self.now

    async def clock_sql(self) -> tuple[str, tuple[Any, ...]]:
        if self.now:
            return "?::float8", (self.now,)
        return "extract(epoch FROM clock_timestamp())::float8", ()

    # -- buffered writes --------------------------------------------------------------

    async def flush(self) -> None:
        """Write every buffered row in one statement (and notify the shards on commit)."""
        dirty = self.dirty_entities()
        if not (self.runs_rows or self.appended or dirty):
            return
        self.tally(dirty)
        unplanned = sorted({s for s, _, _ in self.appended} - set(self.ticks))
        if unplanned:
            await self._lock_ticks(unplanned)  # not planned: lock them now (still correct)
        journal_rows = []
        for shard, e, digest in self.appended:  # numbered by the shard's tick, in order
            self.ticks[shard] += 1
            journal_rows.append((
                e.entity_type, e.key, e.seq, e.run_id, shard, self.ticks[shard],
                e.kind._value_, e.name, e.message_id, e.payload, e.sender, e.accepted_at,
                digest.hex(), e.trace))
        shards = sorted({s for s, _, _ in self.appended})
        loud = [] if self.pooled else [s for s in shards if s not in self.quiet]
        note = f"{self.token} {','.join(map(str, loud))}" if loud else ""
        tables = (_json_chunks(self.runs_rows), _json_chunks(journal_rows), _json_chunks(
            [(e, k, r.shard, r.run_id, r.status._value_, r.next_seq, r.first_seq)
             for e, k, r in dirty]))
        for i in range(max(map(len, tables))):  # one statement, unless the rows are huge
            first = i == 0
            await self.conn.execute(
                _FLUSH, *(chunks[i] if i < len(chunks) else "[]" for chunks in tables),
                shards if first else [], [self.ticks[s] for s in shards] if first else [],
                NOTIFY_CHANNEL, (note if len(note) < 7900 else f"{self.token} *")
                if first else "",
            )
        self.runs_rows.clear()
        self.appended.clear()
        for _, _, r in dirty:
            r.dirty = False


_JSONB_BUDGET = 64 * 2**20
"""Most bytes of JSON in one parameter (jsonb refuses a value beyond 256 MiB; 1,000
payloads of 256 KiB, the default limit, would be more)."""


def _json_chunks(rows: list[tuple[Any, ...]]) -> list[str]:
    """Rows as JSON arrays of arrays for `jsonb_array_elements`: one, or several of at
    most `_JSONB_BUDGET` bytes each (unless a single row is larger)."""
    text = orjson.dumps(rows)
    if len(text) <= _JSONB_BUDGET or len(rows) == 1:
        return [text.decode()]
    half = len(rows) // 2
    return _json_chunks(rows[:half]) + _json_chunks(rows[half:])
