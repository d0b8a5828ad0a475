"""The transaction every PostgreSQL write op runs in: its locks, caches and buffers.

Locking (READ COMMITTED): before any op of a batch runs, the transaction locks what
the batch's ops declared (`LockPlan`), always in one global order so two processes'
batches never deadlock on each other: lease rows (sorted by shard), then the shard tick
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
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import asyncpg  # type: ignore[import-untyped, import-not-found, unused-ignore]
import orjson

from corral._common import RunStatus
from corral._errors import LeaseLostError, StoreError, StoreUnavailableError

from ._pg_schema import NOTIFY_CHANNEL
from ._records import JournalEntry
from ._txn import EntityRow, Fence

__all__ = [
    "LockPlan",
    "PgOp",
    "PgTxn",
    "Seen",
    "is_connection_error",
    "store_error",
]

_Ident = tuple[str, str]
Seen = tuple[int, int, bytes, str | None, float]  # seq, run_id, hash, sender, accepted_at


def is_connection_error(err: BaseException) -> bool:
    """Whether `err` means the connection (not the op) failed: lost, closed, timed out,
    or caught mid-reconnect (asyncpg's "another operation is in progress" while a
    server restarts)."""
    return isinstance(err, OSError | asyncio.TimeoutError | asyncpg.PostgresConnectionError
                      | asyncpg.InterfaceError | asyncpg.exceptions.OperatorInterventionError
                      | asyncpg.exceptions.InternalClientError)


def store_error(what: str, cause: BaseException, *, committed: bool | None = False
                ) -> StoreError:
    """A `StoreError` of its own for one caller, with the driver's error as its cause."""
    text = f"{what}: {type(cause).__name__}: {cause}"
    err: StoreError
    if is_connection_error(cause):
        state = "nothing was committed" if committed is False else "the commit may have landed"
        err = StoreUnavailableError(f"{text} ({state}; retry)", committed=committed)
    else:
        err = StoreError(text)
    err.__cause__ = cause
    return err


@dataclass(slots=True)
class LockPlan:
    """What a batch's ops need locked (or read) before the first of them runs."""

    leases: set[int] = field(default_factory=set)
    lease_update: bool = False  # lock the lease rows FOR UPDATE, not FOR SHARE
    new_leases: bool = False  # create missing lease rows first (an acquisition)
    ticks: set[int] = field(default_factory=set)
    entities: set[_Ident] = field(default_factory=set)
    dedupe: set[tuple[str, str, str]] = field(default_factory=set)


class PgOp(Protocol):
    """A write op: declares its locks, then applies itself inside the transaction.

    `apply` raises a `CorralError` before writing anything when the op refuses.
    """

    buffered: ClassVar[bool]

    def plan(self, plan: LockPlan) -> None: ...
    async def apply(self, txn: PgTxn) -> Any: ...


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
           (x->>11)::float8 AS accepted_at, decode(x->>12, 'hex') AS payload_hash
    FROM jsonb_array_elements($2::jsonb) x
), j AS (
    INSERT INTO journal (etype, key, seq, run_id, shard, tick, kind, name, message_id,
                         payload, sender, accepted_at)
    SELECT etype, key, seq, run_id, shard, tick, kind, name, message_id, payload, sender,
           accepted_at FROM a
), d AS (
    INSERT INTO dedupe (etype, key, message_id, seq, run_id, payload_hash, sender,
                        accepted_at)
    SELECT etype, key, message_id, seq, run_id, payload_hash, sender, accepted_at FROM a
), e AS (
    INSERT INTO entities (etype, key, shard, run_id, status, next_seq, updated_at)
    SELECT x->>0, x->>1, (x->>2)::int, (x->>3)::bigint, x->>4, (x->>5)::bigint,
           extract(epoch FROM clock_timestamp())::float8
    FROM jsonb_array_elements($3::jsonb) x
    ON CONFLICT (etype, key) DO UPDATE SET run_id = excluded.run_id,
        status = excluded.status, next_seq = excluded.next_seq,
        updated_at = excluded.updated_at
), t AS (
    UPDATE shard_ticks s SET tick = u.tick
    FROM unnest($4::int[], $5::bigint[]) AS u(shard, tick) WHERE s.shard = u.shard
)
SELECT pg_notify($6, $7) WHERE $7 <> ''
"""


@dataclass(slots=True)
class PgTxn:
    """One open transaction on the writer connection, with what it locked and buffered.

    Entity rows are read once (locked) and written back once per flush; accepted
    journal and dedupe rows are buffered and written set-based (`flush`, before any op
    that is not `buffered` reads or changes them). `dedupe` caches the dedupe window
    rows this batch read or wrote, per entity.
    """

    conn: Any
    token: str  # this store's identity in commit notifications
    # Shards this store holds: their host (this process) delivers its own acceptances,
    # so they need no notification (NOTIFY serialises every notifying commit).
    quiet: frozenset[int] = frozenset()
    now: float = 0.0  # the server's clock when the lease rows were locked
    leases: dict[int, tuple[str, int, float]] = field(default_factory=dict)
    ticks: dict[int, int] = field(default_factory=dict)
    entities: dict[_Ident, EntityRow | None] = field(default_factory=dict)
    dedupe: dict[_Ident, dict[str, Seen | None]] = field(default_factory=dict)
    runs_rows: list[tuple[Any, ...]] = field(default_factory=list)
    journal_rows: list[tuple[Any, ...]] = field(default_factory=list)
    dirty_ticks: set[int] = field(default_factory=set)

    # -- locking ------------------------------------------------------------------

    async def lock(self, plan: LockPlan) -> None:
        """Take the plan's locks in the global order (see the module docstring)."""
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
            self.entities[ident] = None  # row, holding its shard's tick row (held by now)
        rows = await self.conn.fetch(_LOCK_ENTITIES, [k[0] for k in keys], [k[1] for k in keys])
        for r in rows:
            self.entities[(r[0], r[1])] = EntityRow(r[2], r[3], RunStatus(r[4]), r[5])

    async def _lock_entities_and_read_windows(self, keys: list[_Ident],
                                              ids: list[tuple[str, str, str]]) -> None:
        """`_lock_entities` and `_read_windows` in one statement. Its snapshot is taken
        before it waits for an entity row, which is safe for the dedupe rows: only an
        acceptance adds them, holding its shard's tick row, which this batch holds."""
        for ident in keys:
            self.entities[ident] = None
        for etype, key, mid in ids:
            self.dedupe.setdefault((etype, key), {})[mid] = None
        rows = await self.conn.fetch(
            _LOCK_AND_READ, [k[0] for k in keys], [k[1] for k in keys], [i[0] for i in ids],
            [i[1] for i in ids], [i[2] for i in ids])
        for r in rows:
            if r[0]:
                self.entities[(r[1], r[2])] = EntityRow(r[4], r[5], RunStatus(r[6]), r[7])
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

    async def lease(self, shard: int) -> tuple[str, int, float] | None:
        """The shard's lease row (locked by the plan, else locked now)."""
        if shard not in self.leases:
            row = await self.conn.fetchrow(
                "SELECT owner, epoch, expires_at FROM leases WHERE shard = $1 FOR SHARE", shard)
            if row is None:
                return None
            self.leases[shard] = (row[0], row[1], row[2])
        return self.leases[shard]

    async def clock(self) -> float:
        """The server's clock when the lease rows were locked (read now if none were)."""
        if not self.now:
            self.now = await self.conn.fetchval(
                "SELECT extract(epoch FROM clock_timestamp())::float8")
        return self.now

    async def check(self, fence: Fence) -> None:
        """Refuse (before writing) unless `fence` still holds its shard at its epoch."""
        row = await self.lease(fence.shard)
        if row is None or (row[0], row[1]) != (fence.owner, fence.epoch):
            raise LeaseLostError(
                f"shard {fence.shard}: epoch {fence.epoch} of {fence.owner} is no longer current"
            )

    # -- entities and the dedupe window ---------------------------------------------

    async def entity(self, etype: str, key: str) -> EntityRow | None:
        ident = (etype, key)
        if ident not in self.entities:
            r = await self.conn.fetchrow(
                "SELECT shard, run_id, status, next_seq FROM entities WHERE etype = $1 "
                "AND key = $2 FOR UPDATE", etype, key)
            self.entities[ident] = None if r is None else EntityRow(r[0], r[1],
                                                                    RunStatus(r[2]), r[3])
        return self.entities[ident]

    def put_entity(self, etype: str, key: str, row: EntityRow) -> None:
        row.dirty = True
        self.entities[(etype, key)] = row

    async def seen(self, etype: str, key: str, message_id: str) -> Seen | None:
        """The dedupe window's row for the message id (this batch's acceptances included)."""
        window = self.dedupe.setdefault((etype, key), {})
        if message_id not in window:
            r = await self.conn.fetchrow(
                "SELECT seq, run_id, payload_hash, sender, accepted_at FROM dedupe "
                "WHERE etype = $1 AND key = $2 AND message_id = $3", etype, key, message_id)
            window[message_id] = None if r is None else (r[0], r[1], bytes(r[2]), r[3], r[4])
        return window[message_id]

    def forget_window(self, etype: str, key: str) -> None:
        """The entity's dedupe rows changed in the database: read them again when asked."""
        self.dedupe.pop((etype, key), None)

    # -- buffered writes --------------------------------------------------------------

    async def append(self, shard: int, entry: JournalEntry, digest: bytes) -> None:
        """Buffer an accepted entry (journal + dedupe row), numbered by its shard's tick."""
        if shard not in self.ticks:
            await self._lock_ticks([shard])  # not planned: lock it now (still correct)
        self.ticks[shard] += 1
        self.dirty_ticks.add(shard)
        self.journal_rows.append((
            entry.entity_type, entry.key, entry.seq, entry.run_id, shard, self.ticks[shard],
            entry.kind._value_, entry.name, entry.message_id, entry.payload, entry.sender,
            entry.accepted_at, digest.hex(),
        ))
        self.dedupe.setdefault((entry.entity_type, entry.key), {})[entry.message_id] = (
            entry.seq, entry.run_id, digest, entry.sender, entry.accepted_at)

    async def flush(self) -> None:
        """Write every buffered row in one statement (and notify the shards on commit)."""
        dirty = [(k, r) for k, r in self.entities.items() if r is not None and r.dirty]
        if not (self.runs_rows or self.journal_rows or dirty or self.dirty_ticks):
            return
        shards = sorted(self.dirty_ticks)
        loud = [s for s in shards if s not in self.quiet]
        note = f"{self.token} {','.join(map(str, loud))}" if loud else ""
        tables = (_json_chunks(self.runs_rows), _json_chunks(self.journal_rows), _json_chunks(
            [(k[0], k[1], r.shard, r.run_id, r.status._value_, r.next_seq) for k, r in dirty]))
        for i in range(max(map(len, tables))):  # one statement, unless the rows are huge
            first = i == 0
            await self.conn.execute(
                _FLUSH, *(chunks[i] if i < len(chunks) else "[]" for chunks in tables),
                shards if first else [], [self.ticks[s] for s in shards] if first else [],
                NOTIFY_CHANNEL, (note if len(note) < 7900 else f"{self.token} *")
                if first else "",
            )
        self.runs_rows.clear()
        self.journal_rows.clear()
        self.dirty_ticks.clear()
        for _, r in dirty:
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
