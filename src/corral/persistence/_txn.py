"""The transaction every group-committed write op runs in, written once for both engines.

`Txn` holds what a batch shares: the entity rows it read (each written back once, by
`flush`), the dedupe window rows it read or accepted, the buffered journal/dedupe rows
and started runs (written set-based by `flush`), and the lease rows it checked. Each
engine implements only the primitives below (anyio-style: `abc` declares, backends
implement): `execute`/`executemany`/`fetchone`/`fetchall` (SQL written once with `?`
placeholders; PostgreSQL numbers them), `lock` (a batch's locks, before its first op),
`flush`, `clock`, `insert_id`, `trim` (a snapshot's truncation) and a few fragments of
SQL that differ (`ROW_LOCK`, `SHARE_LOCK`, `CARRY_JOURNAL`, `starts_with`).

Write ops (`_ops_*`) are `async def apply(txn)`; SQLite's primitives never suspend,
so its writer drives an op to completion on its own thread (`drive`). An op raises a
`CorralError` *before* writing anything when it refuses (conflict, closed run, lost
lease), so the other ops of its batch still commit.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from corral._common import RunStatus
from corral._errors import CorralError, LeaseLostError

from ._records import JournalEntry

__all__ = ["DEAD_LETTERS", "OPEN_WAITS", "SUSPENDED_RUNS", "EntityRow", "Fence", "Fenced",
           "Lease", "LockPlan", "Seen", "Txn", "WriteOp", "apply_ops", "code_point_range",
           "drive"]

T = TypeVar("T")
Ident = tuple[str, str]
Seen = tuple[int, int, bytes, str | None, float]  # seq, run_id, hash, sender, accepted_at
Lease = tuple[str, int, float]  # owner, epoch, expires_at


def code_point_range(column: str, prefix: str) -> tuple[str, tuple[Any, ...]]:
    """That `column` starts with `prefix`, as a range for a column in code point order
    (SQLite's UTF-8 bytes; PostgreSQL's "C" collation): from `prefix` up to the first
    string past every one that starts with it (trailing U+10FFFF have no successor;
    surrogates are skipped). Any B-tree over the column seeks it, in its own order."""
    stem = prefix.rstrip("\U0010ffff")
    if not stem:
        return f"{column} >= ?", (prefix,)
    after = ord(stem[-1]) + 1
    after = 0xE000 if 0xD800 <= after <= 0xDFFF else after
    return f"{column} >= ? AND {column} < ?", (prefix, stem[:-1] + chr(after))


# What `census_counts` counts besides entities by status (`_census`): each a count of
# rows, kept by the writes that add or remove them.
DEAD_LETTERS = "dead_letters"  # rows of `dead_letters`
OPEN_WAITS = "open_waits"  # rows of `signal_waits` in status open
SUSPENDED_RUNS = "suspended_runs"  # rows of `suspensions` whose run is running


@dataclass(slots=True)
class EntityRow:
    shard: int
    run_id: int
    status: RunStatus
    next_seq: int
    first_seq: int | None = None  # its run's first seq, when set here (a run started)
    dirty: bool = False


@dataclass(frozen=True, slots=True)
class Fence:
    """A host's claim to write for a shard: refused unless `epoch` is still current."""

    shard: int
    owner: str
    epoch: int


@dataclass(slots=True)
class LockPlan:
    """What a batch's ops need locked (or read) before the first of them runs (only
    PostgreSQL locks rows; SQLite's `BEGIN IMMEDIATE` locks the whole file)."""

    registry: bool = False  # serialise with every checked registration of builds
    leases: set[int] = field(default_factory=set)
    lease_update: bool = False  # lock the lease rows FOR UPDATE, not FOR SHARE
    new_leases: bool = False  # create missing lease rows first (an acquisition)
    ticks: set[int] = field(default_factory=set)
    entities: set[Ident] = field(default_factory=set)
    dedupe: set[tuple[str, str, str]] = field(default_factory=set)


class WriteOp(Protocol):
    """A write op: declares its locks, then applies itself inside the transaction.

    `buffered` ops only append rows `flush` writes; any other op runs after a flush.
    """

    buffered: ClassVar[bool]

    def plan(self, plan: LockPlan) -> None: ...
    async def apply(self, txn: Txn) -> Any: ...


class Fenced:
    """A host's fenced write: it locks its shard's lease row (and, with `locks_entity`,
    the entity row) before the batch's first op, and checks its fence before writing."""

    __slots__ = ()
    buffered: ClassVar[bool] = False
    locks_entity: ClassVar[bool] = False
    fence: Fence
    entity_type: str
    key: str

    def plan(self, plan: LockPlan) -> None:
        plan.leases.add(self.fence.shard)
        if self.locks_entity:
            plan.entities.add((self.entity_type, self.key))


async def apply_ops(txn: Txn, ops: Sequence[WriteOp]) -> list[Any]:
    """A batch's ops in order inside `txn`: each op's result, or the `CorralError` that
    refused it (raised before it wrote anything, so the others still commit). Buffered
    rows are flushed before any op that is not `buffered` (it may read or change them),
    and at the end."""
    results: list[Any] = []
    for op in ops:
        if not getattr(op, "buffered", False):
            await txn.flush()
        try:
            result = op.apply(txn)  # a coroutine; an op written for one engine may be plain
            results.append(await result if isinstance(result, Coroutine) else result)
        except CorralError as err:
            results.append(err)
    await txn.flush()
    await txn.count()
    return results


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion here and now: an op on primitives that never suspend."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a write op suspended on an engine whose primitives are synchronous")


@dataclass(slots=True)
class Txn:
    """One open transaction: the shared caches and buffers over an engine's primitives."""

    ROW_LOCK: ClassVar[str] = ""  # appended to a read of the entity row it will write
    SHARE_LOCK: ClassVar[str] = ""  # appended to a read of a lease row it checks
    SKIP_LOCKED: ClassVar[str] = ""  # appended to a read of a row to lock unless busy
    CARRY_JOURNAL: ClassVar[str] = ""  # (etype, key, seq, run_id, shard, kind, ... trace)
    GREATEST: ClassVar[str] = "greatest"  # the largest of its (non-null) arguments
    # A page's cursor over an index as one row value `(a, b) > (?, ?)`, which PostgreSQL
    # seeks and cannot serve from another index; SQLite seeks `a = ? AND b > ?` instead.
    ROW_CURSOR: ClassVar[bool] = True
    # A listing page's progress rows read by one range scan over the page's keys, not a
    # lookup per row (`_progress.progress_from`): on PostgreSQL each lookup descends the
    # B-tree, one level deeper at 1M rows than at 10k; SQLite's cost is flat either way.
    PAGE_RANGE: ClassVar[bool] = True
    # Appended to `entities` in a shard's recovery reads (`_reads.RUNNING_ENTITIES`):
    # SQLite, without statistics, chose `entities_status` (a walk of every running
    # entity of every shard) once the table gained a column (its row-size guess moved).
    RUNNING_INDEX: ClassVar[str] = ""

    entities: dict[Ident, EntityRow | None] = field(default_factory=dict)
    dedupe: dict[Ident, dict[str, Seen | None]] = field(default_factory=dict)
    leases: dict[int, Lease] = field(default_factory=dict)
    runs_rows: list[tuple[Any, ...]] = field(default_factory=list)
    appended: list[tuple[int, JournalEntry, bytes]] = field(default_factory=list)
    floors: dict[Ident, int] = field(default_factory=dict)  # latest snapshot's applied seq
    # The census's counters (`_census`): each entity row this transaction read, as the
    # database holds it (shard, status; None: no row), and the changes to the counts of
    # `census_counts` (etype, what, shard) its writes made, written once by `count`.
    counted: dict[Ident, tuple[int, str] | None] = field(default_factory=dict)
    counts: dict[tuple[str, str, int], int] = field(default_factory=dict)

    # -- the engine's primitives ------------------------------------------------------

    async def execute(self, sql: str, *args: Any) -> int:
        """Run one statement; the rows it changed."""
        raise NotImplementedError

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        raise NotImplementedError

    async def fetchone(self, sql: str, *args: Any) -> Sequence[Any] | None:
        raise NotImplementedError

    async def fetchall(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        raise NotImplementedError

    async def fetchall_replanned(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        """`fetchall`, planned for these arguments each time: for a statement whose best
        plan depends on them (a key prefix: PostgreSQL's cached generic plan walked every
        key of a type for a prefix that matched none, 19 ms against 0.6)."""
        return await self.fetchall(sql, *args)

    async def add_counts(self, rows: Sequence[tuple[str, str, int, int]]) -> None:
        """Add to `census_counts` (etype, what, shard, n) each, in this order."""
        raise NotImplementedError

    async def insert_id(self, sql: str, *args: Any) -> int:
        """Insert one row; its generated `id`."""
        raise NotImplementedError

    async def clock(self) -> float:
        """The clock leases are judged by (the database server's, where there is one)."""
        raise NotImplementedError

    async def clock_sql(self) -> tuple[str, tuple[Any, ...]]:
        """`clock` as an SQL expression (and its arguments), for a statement that needs
        the time and should not cost another statement to read it."""
        return "?", (await self.clock(),)

    async def lock(self, plan: LockPlan) -> None:
        """Take (and read) what the batch's ops declared, before the first op runs."""

    async def flush(self) -> None:
        """Write every buffered row: runs started, journal and dedupe rows, entities."""
        raise NotImplementedError

    async def trim(self, etype: str, key: str, *, keep: int, applied_seq: int,
                   forget_seq: int, forget_before: float, passivate: bool) -> int:
        """After a snapshot: keep the newest `keep` snapshots, delete the journal they
        cover, sweep the dedupe window, mark passivation; returns the journal floor."""
        raise NotImplementedError

    def starts_with(self, column: str, prefix: str) -> tuple[str, tuple[Any, ...]]:
        """A condition (and its arguments) that `column` starts with `prefix`."""
        raise NotImplementedError

    def joined(self, expr: str, separator: str, *, order: str) -> str:
        """An aggregate joining the texts `expr` of a group with `separator` (SQL), in
        `order` (SQLite: the order of the rows fed to it, which the query sorts)."""
        raise NotImplementedError

    def in_pairs(self, first: str, second: str, pairs: Sequence[tuple[int, int]]
                 ) -> tuple[str, tuple[Any, ...]]:
        """A condition (and its arguments) that (`first`, `second`) is one of the integer
        `pairs`, written the same whatever their number (one statement for any count)."""
        raise NotImplementedError

    # -- shared, written once -----------------------------------------------------------

    async def lease(self, shard: int) -> Lease | None:
        """The shard's lease row (locked by the plan, else read and locked now)."""
        if shard not in self.leases:
            row = await self.fetchone("SELECT owner, epoch, expires_at FROM leases "
                                      f"WHERE shard = ?{self.SHARE_LOCK}", shard)
            if row is None:
                return None
            self.leases[shard] = (row[0], row[1], row[2])
        return self.leases[shard]

    async def check(self, fence: Fence) -> None:
        """Refuse (before writing) unless `fence` still holds its shard at its epoch."""
        row = await self.lease(fence.shard)
        if row is None or (row[0], row[1]) != (fence.owner, fence.epoch):
            raise LeaseLostError(
                f"shard {fence.shard}: epoch {fence.epoch} of {fence.owner} is no longer current"
            )

    async def entity(self, etype: str, key: str) -> EntityRow | None:
        ident = (etype, key)
        if ident not in self.entities:
            r = await self.fetchone("SELECT shard, run_id, status, next_seq FROM entities "
                                    f"WHERE etype = ? AND key = ?{self.ROW_LOCK}", etype, key)
            self.read_entity(ident, None if r is None else EntityRow(r[0], r[1],
                                                                     RunStatus(r[2]), r[3]))
        return self.entities[ident]

    def read_entity(self, ident: Ident, row: EntityRow | None) -> None:
        """Keep an entity row as read from the database (None: it has none)."""
        self.entities[ident] = row
        self.counted[ident] = None if row is None else (row.shard, row.status._value_)

    def tally(self, dirty: Sequence[tuple[str, str, EntityRow]]) -> None:
        """Count the entity rows a flush writes: a row created, or whose status changed,
        moves one entity between the counts of `census_counts` (an acceptance into a
        running entity changes none). The upsert keeps an existing row's shard."""
        for etype, key, row in dirty:
            was = self.counted[(etype, key)]  # read before written: `entity`, `lock`
            now = (row.shard if was is None else was[0], row.status._value_)
            if was != now:
                if was is not None:
                    self.add_count(etype, was[1], was[0], -1)
                self.add_count(etype, now[1], now[0], 1)
                self.counted[(etype, key)] = now

    def add_count(self, etype: str, what: str, shard: int, n: int) -> None:
        """`n` more (or fewer) of `what` (an entity status, `DEAD_LETTERS`, `OPEN_WAITS`,
        `SUSPENDED_RUNS`) of `etype` on `shard`, written by `count` at the end."""
        if n:
            self.counts[(etype, what, shard)] = self.counts.get((etype, what, shard), 0) + n

    async def shard_of(self, etype: str, key: str) -> int:
        """The shard of an entity's row (0 when it has none), for the counts of its rows
        in other tables: as this transaction holds it, else read without a lock (a row
        keeps its shard)."""
        row = self.entities.get((etype, key))
        if row is None:
            r = await self.fetchone("SELECT shard FROM entities WHERE etype = ? AND key = ?",
                                    etype, key)
            return 0 if r is None else int(r[0])
        return row.shard

    async def count(self) -> None:
        """Write the transaction's changes to the counts, last and in one order (on
        PostgreSQL two transactions then never wait for each other's counter rows in a
        cycle: each takes them in (etype, what, shard) order, holding nothing else it
        will wait for)."""
        rows = sorted((*k, n) for k, n in self.counts.items() if n)
        self.counts.clear()
        if rows:
            await self.add_counts(rows)

    def put_entity(self, etype: str, key: str, row: EntityRow) -> None:
        row.dirty = True
        self.entities[(etype, key)] = row

    def dirty_entities(self) -> list[tuple[str, str, EntityRow]]:
        return [(k[0], k[1], r) for k, r in self.entities.items() if r is not None and r.dirty]

    async def seen(self, etype: str, key: str, message_id: str) -> Seen | None:
        """The dedupe window's row for the message id (this batch's acceptances included)."""
        window = self.dedupe.setdefault((etype, key), {})
        if message_id not in window:
            r = await self.fetchone(
                "SELECT seq, run_id, payload_hash, sender, accepted_at FROM dedupe "
                "WHERE etype = ? AND key = ? AND message_id = ?", etype, key, message_id)
            window[message_id] = None if r is None else (r[0], r[1], bytes(r[2]), r[3], r[4])
        return window[message_id]

    def forget_all(self, counts: dict[tuple[str, str, int], int]) -> None:
        """Drop every buffered row and cached read: after a rollback to a savepoint
        taken on a flushed transaction (`AcceptAllOp`), the database holds the truth.
        `counts`: the changes to the counts as they were at the savepoint."""
        self.appended.clear()
        self.runs_rows.clear()
        self.entities.clear()
        self.counted.clear()
        self.counts = counts
        self.dedupe.clear()
        self.floors.clear()

    def forget_window(self, etype: str, key: str) -> None:
        """The entity's dedupe rows changed in the database: read them again when asked."""
        self.dedupe.pop((etype, key), None)

    def append(self, shard: int, entry: JournalEntry, digest: bytes) -> None:
        """Buffer an accepted entry (its journal and dedupe rows) for `flush`."""
        self.appended.append((shard, entry, digest))
        self.dedupe.setdefault((entry.entity_type, entry.key), {})[entry.message_id] = (
            entry.seq, entry.run_id, digest, entry.sender, entry.accepted_at)

    def start_run(self, etype: str, key: str, run_id: int, start: str, at: float,
                  first_seq: int) -> None:
        """Buffer a started run's row for `flush`."""
        self.runs_rows.append((etype, key, run_id, start, at, first_seq))
