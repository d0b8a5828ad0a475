"""`SqliteStore`: the embedded store on one SQLite file (WAL), each connection in a
thread of its own (`SqliteThread`).

Writes are group-committed (`_batch`). A whole batch runs as one call in the writer's
thread (one thread hop per batch, not per statement), each op driven to completion on
`SqliteTxn`'s synchronous primitives. Each caller's future is resolved directly, with
no `asyncio.shield` per call (measured: a shield per waiter cost more than the shared
future saved, ~30% of acks/s with 1,000 concurrent senders). The ops and reads are
`StoreCore`'s.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

from corral._errors import CorralError, StoreError

from ._batch import CommitQueue
from ._locks import LeaseLocks
from ._ops_handoff import HandOffLeaseOp
from ._ops_leases import AcquireLeasesOp, ReleaseLeasesOp, RenewLeasesOp, check_lease_shards
from ._own_commits import OwnCommits
from ._reads import ENTRY_COLUMNS, tail_entries
from ._records import JournalEntry
from ._schema import (
    MIGRATIONS,
    PRAGMAS,
    SCHEMA_VERSION,
    parse_schema_version,
    shard_count_error,
)
from ._sightings import LeaseSightings, lease_rows
from ._sqlite_thread import SqliteThread
from ._sqlite_txn import SqliteTxn
from ._store_core import StoreCore
from ._tables import create_all
from ._txn import Fence, WriteOp, apply_ops, drive
from ._wal_header import WalHeader

__all__ = ["SqliteStore", "open_sqlite_store"]

T = TypeVar("T")
MEMORY = (":memory:", "sqlite://:memory:", "sqlite:///:memory:")


def _busy_retry(db: sqlite3.Connection, statement: str, *, wait: float = 30.0) -> None:
    """Execute `statement`, retrying while the file is locked. Switching a new file to
    WAL answers "database is locked" at once, without the busy timeout, when several
    processes open it at the same moment."""
    deadline = time.monotonic() + wait
    delay = 0.005
    while True:
        try:
            db.execute(statement)
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _store_error(what: str, cause: Exception) -> StoreError:
    """A `StoreError` of its own for one caller, with the driver's error as its cause."""
    err = StoreError(f"{what}: {type(cause).__name__}: {cause}")
    err.__cause__ = cause
    return err


class SqliteStore(StoreCore):
    """The SQLite implementation of `Store`. Open it with `open_sqlite_store`.

    Several processes may open the same file: SQLite's write lock serialises their
    transactions (`BEGIN IMMEDIATE`, 30 s busy timeout). `clock` is the store's sense
    of wall time, which judges a signal wait's deadline when a delivery arrives: the
    machine's (every process sharing the file reads it alike), never a caller's.
    """

    shards: int  # set when opened

    def __init__(self, path: str, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self.delivery_clock = clock
        self.durable = path not in MEMORY
        self._writer: SqliteThread | None = None
        self._reader: SqliteThread | None = None
        self._queue: CommitQueue[WriteOp] = CommitQueue("sqlite")
        self._data_version: int | None = None
        self._foreign_commit = False
        self._shared = False  # another process committed to the file since it was opened
        self._versions_read = self._versions_asked = 0  # data_version reads; as of last ask
        self._own = OwnCommits()  # positions of this store's commits, once _shared
        self._locks = LeaseLocks(path) if self.durable else None
        self._sightings = LeaseSightings()  # the lease rows acquisitions saw, and when
        self._wal = WalHeader(path) if self.durable else None

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r}, shards={getattr(self, 'shards', None)})"

    async def _open(self, *, shards: int) -> None:
        self.shards = shards  # pinned: `_prepare` refuses a store of another count
        target = self.path if self.durable else ":memory:"
        try:
            self._writer = SqliteThread("corral-sqlite-writer")
            await self._writer.open(target)
            await self._writer.call(self._prepare, shards)
            if self.durable:
                self._reader = SqliteThread("corral-sqlite-reader")
                await self._reader.open(target)
                await self._reader.call(_busy_retry, "PRAGMA busy_timeout=30000")
            else:
                self._reader = self._writer
        except sqlite3.Error as err:
            await self.close()
            raise StoreError(f"cannot open store {self.path!r}: {err}") from err
        except BaseException:  # refused (newer schema, other shard count): close, re-raise
            await self.close()
            raise
        self._queue.open(partial(self._writer.call, self._commit),
                          partial(_store_error, "store write failed, nothing committed"))

    def _prepare(self, db: sqlite3.Connection, shards: int) -> None:
        """In the writer's thread: pragmas, then, in one transaction, the schema and the
        pinned shard count. A new store is created at `SCHEMA_VERSION`; an older one
        gets the migrations it lacks; a store of a newer corral, or of another shard
        count, is refused (naming both values) and left untouched."""
        for pragma in PRAGMAS:
            _busy_retry(db, pragma)
        db.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone():
                meta = dict(db.execute("SELECT k, v FROM meta").fetchall())
                found = parse_schema_version(meta.get("schema_version", "1"), repr(self.path))
            else:
                meta, found = {}, SCHEMA_VERSION
                for statement in create_all("sqlite"):
                    db.execute(statement)
            if found > SCHEMA_VERSION:
                raise StoreError(
                    f"store {self.path!r} has schema version {found}, written by a newer "
                    f"corral; this corral knows versions up to {SCHEMA_VERSION}: upgrade "
                    "corral to open it")
            if meta.get("shards", str(shards)) != str(shards):
                raise shard_count_error(f"store {self.path!r}", meta["shards"], shards)
            for version in range(found + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version]:
                    _migrate(db, statement)
            db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES ('schema_version', ?), "
                       "('shards', ?)", (str(SCHEMA_VERSION), str(shards)))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    # -- writes -------------------------------------------------------------------

    def _commit(self, db: sqlite3.Connection, ops: list[WriteOp]) -> list[Any]:
        """In the writer thread: `ops` in one transaction, one sync; on any failure roll
        back and raise (`CommitQueue` then runs the ops one per transaction)."""
        self._note_data_version(db)
        try:
            db.execute("BEGIN IMMEDIATE")
            first = self._own.last_position(db) if self._shared else None
            results = drive(apply_ops(SqliteTxn(db=db), ops))
            last = self._own.last_position(db) if first is not None else None
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        if first is not None and last is not None:
            self._own.committed(first, last)
        return results

    def _note_data_version(self, db: sqlite3.Connection) -> None:
        # data_version changes only when *another* connection committed: that is how a
        # host learns that other processes accepted messages for shards it owns.
        version = db.execute("PRAGMA data_version").fetchone()[0]
        if self._data_version is not None and version != self._data_version:
            self._foreign_commit = self._shared = True
        self._data_version = version
        self._versions_read += 1

    async def wait_foreign_commit(self, timeout: float) -> bool:
        """Sleep `timeout` seconds, then say whether another process committed (SQLite
        has no notification: this is the poll)."""
        await asyncio.sleep(timeout)
        return await self.foreign_commit_seen()

    async def foreign_commit_seen(self) -> bool:
        """Whether another process committed since the last call (cheap; no transaction).

        Asks the writer's thread only when no batch read the file's version since the
        last call (a busy writer reads it at every batch: a commit after that read is
        seen at the next call). Closed, it refuses like every other method, even when
        it would not have asked the writer's thread."""
        if self._queue.closed:
            raise StoreError("store is closed")
        if self._queue.empty and self._versions_read == self._versions_asked \
                and (self._wal is None or self._wal.changed()):
            await self._on(self._writer, self._note_data_version)
        self._versions_asked = self._versions_read
        seen, self._foreign_commit = self._foreign_commit, False
        return seen

    # -- leases: the rows, and an OS lock per shard held (see `_locks`) ---------------

    async def acquire_leases(self, owner: str, shards: Sequence[int], ttl: float, *,
                             force: bool = False) -> dict[int, int]:
        """Take the free or expired `shards`, and at once those whose OS lock this
        store obtains (their holder died: see `_locks`). A lease is expired when this
        store has seen its row unchanged for `ttl` (`_sightings`), never by comparing
        wall clocks: a process whose clock is off takes no live holder's shard."""
        check_lease_shards(shards, self.shards)
        rows = await self.query(lease_rows, shards)
        stale = self._sightings.stale(rows, ttl)
        locks = self._locks
        orphaned = frozenset(s for s in shards if locks is not None and locks.try_lock(s))
        op = AcquireLeasesOp(owner, tuple(shards), ttl, self.shards, force, orphaned,
                             frozenset(stale.items())).narrowed(rows, 0.0)
        try:  # nothing to take (a standby's usual round): no write transaction at all
            taken: dict[int, int] = await self.write(op) if op.shards else {}
        except BaseException:
            for shard in orphaned:
                self._unlock(shard)
            raise
        for shard in orphaned - set(taken):
            self._unlock(shard)
        return taken

    async def renew_leases(self, owner: str, held: dict[int, int], ttl: float) -> set[int]:
        kept: set[int] = await self.write(RenewLeasesOp(owner, tuple(held.items()), ttl))
        for shard in held:
            if shard not in kept:
                self._unlock(shard)
            elif self._locks is not None:  # a lease taken on expiry: lock it once we can
                self._locks.try_lock(shard)
        return kept

    async def release_leases(self, owner: str) -> None:
        try:
            await self.write(ReleaseLeasesOp(owner))
        finally:
            if self._locks is not None:
                self._locks.unlock_all()

    async def hand_off_leases(self, heirs: Mapping[Fence, str], ttl: float) -> set[int]:
        handed = await self.write_many([HandOffLeaseOp(f, h, ttl) for f, h in heirs.items()])
        for fence in heirs:
            self._unlock(fence.shard)  # the heir takes the lock with the lease
        return {f.shard for f, ok in zip(heirs, handed, strict=True) if ok is True}

    def _unlock(self, shard: int) -> None:
        if self._locks is not None:
            self._locks.unlock(shard)

    # -- reads --------------------------------------------------------------------

    async def _on(self, conn: SqliteThread | None, fn: Callable[..., T], *args: Any) -> T:
        """`fn(connection, *args)` in `conn`'s thread. Once `close` has begun, the
        `StoreError` every caller handles (a host's task may be past its last await
        when the store closes under it)."""
        if conn is None or self._queue.closed:
            raise StoreError("store is closed")
        try:
            return await conn.call(fn, *args)
        except (ValueError, sqlite3.ProgrammingError) as err:
            if not self._queue.closed:
                raise
            raise StoreError("store is closed") from err

    async def query(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`fn(q, *args)` on the reader connection, inside one read transaction."""
        return await self._on(self._reader, self._read_txn, fn, args)

    @staticmethod
    def _read_txn(db: sqlite3.Connection, fn: Callable[..., Coroutine[Any, Any, T]],
                  args: tuple[Any, ...]) -> T:
        try:
            own_txn = not db.in_transaction
            if own_txn:
                db.execute("BEGIN")
            try:
                return drive(fn(SqliteTxn(db=db), *args))
            finally:
                if own_txn:
                    db.execute("COMMIT")
        except CorralError:
            raise
        except Exception as err:  # a driver error, or a value it cannot bind
            raise _store_error("store read failed", err) from err

    async def journal_tail(self, after_pos: int, shards: frozenset[int], limit: int = 2000
                           ) -> tuple[int, list[JournalEntry]]:
        """Entries committed after position `after_pos` for `shards`, but for those this
        store committed itself (see `_own_commits`); returns the new position."""
        pos, own = self._own.ahead(after_pos)
        return await self.query(_tail, pos, shards, limit, own)

    async def journal_end(self) -> int:
        return await self.query(_end)

    # -- lifecycle ------------------------------------------------------------------

    async def close(self) -> None:
        """Commit what is queued, then close both connections."""
        if self._queue.closed:
            return
        await self._queue.close()  # the writer commits what is queued first
        for conn in {id(c): c for c in (self._reader, self._writer) if c is not None}.values():
            await conn.close()
        if self._locks is not None:
            self._locks.unlock_all()
        if self._wal is not None:
            self._wal.close()
        self._reader = self._writer = None

    def __del__(self) -> None:
        if not self._queue.closed and self._writer is not None:
            warnings.warn(f"SqliteStore {self.path!r} was never closed", ResourceWarning,
                          stacklevel=1)


async def _tail(q: SqliteTxn, after_pos: int, shards: frozenset[int], limit: int,
                own: list[tuple[int, int]]) -> tuple[int, list[JournalEntry]]:
    """The journal by its global position (`pos`, a rowid growing in commit order: one
    writer at a time holds the file), up to `limit` positions on; only the rows of
    `shards` are read (a host of one shard of many reads no one else's payloads), and
    none in the `own` ranges (first, last] (this store's commits)."""
    row = await q.fetchone("SELECT max(pos) FROM (SELECT pos FROM journal WHERE pos > ? "
                           "ORDER BY pos LIMIT ?)", after_pos, limit)
    assert row is not None
    if row[0] is None:
        return after_pos, []
    end = int(row[0])
    own = [r for r in own if r[0] < end]
    wanted = ",".join(str(int(s)) for s in sorted(shards))  # ints only: safe inline
    skipped = " AND NOT (pos > ? AND pos <= ?)" * len(own)
    rows = await q.fetchall(f"SELECT {ENTRY_COLUMNS} FROM journal WHERE pos > ? AND pos <= ? "
                            f"AND shard IN ({wanted}){skipped} ORDER BY pos", after_pos, end,
                            *(p for r in own for p in r))
    return end, tail_entries(rows)


def _migrate(db: sqlite3.Connection, statement: str) -> None:
    """Run one migration statement; an `ADD COLUMN` of a column the table has already
    is skipped (SQLite has no `IF NOT EXISTS` for columns): a table a migration created
    in today's form has it (PostgreSQL's migrations say `ADD COLUMN IF NOT EXISTS`)."""
    try:
        db.execute(statement)
    except sqlite3.OperationalError as err:
        if " ADD COLUMN " not in statement or "duplicate column name" not in str(err):
            raise


async def _end(q: SqliteTxn) -> int:
    row = await q.fetchone("SELECT coalesce(max(pos), 0) FROM journal")
    assert row is not None
    return int(row[0])


async def open_sqlite_store(path: str, *, shards: int,
                            clock: Callable[[], float] = time.time) -> SqliteStore:
    """Open (creating if needed) the store at `path`; `":memory:"` for a non-durable store.

    `clock` is the store's wall clock (see `SqliteStore`); `corral.testing` passes its
    virtual one."""
    if path.startswith("sqlite:///") and path not in MEMORY:
        path = path[len("sqlite:///"):]
    store = SqliteStore(path, clock=clock)
    await store._open(shards=shards)
    return store
