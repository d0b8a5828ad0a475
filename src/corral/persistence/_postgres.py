"""`PostgresStore`: the `Store` on a shared PostgreSQL database, through asyncpg.

Any number of processes, on any number of machines, share one database. The pieces:

- `_pg_writer`: the writer under the group commit (`_batch`), each batch on a pooled
  connection; a lost connection gives each caller of its batch a retryable
  `StoreUnavailableError`.
- `_pg_txn`: PostgreSQL's primitives under the shared `Txn`: its locks (acceptance
  linearised under READ COMMITTED by the shard's tick row and the entity rows; fenced
  writes hold their lease row) and its set-based writes (the rows as JSON, one
  statement per batch). The write ops (`_ops_*`) and reads (`_reads`) are shared
  with SQLite, through `StoreCore`.
- `_pg_tail`: the journal tail: per shard, in commit order.
- `_pg_session`: LISTEN/NOTIFY (a host hears of other processes' acceptances for its
  shards at once; a slow poll is the safety net) and per-shard advisory locks (a dead
  holder's shards are taken over at once, as with the SQLite store's file locks).
- `_pg_schema`: the versioned schema, created or migrated on open.
- `_pg_vacuum`: the rows a snapshot deletes are vacuumed by the store itself, so a hot
  entity's storage is bounded by its snapshot policy, not by autovacuum's schedule.

Behind a pooler in transaction mode (PgBouncer: the URL's `?pool=transaction`) a
server session is shared by turns with other clients, so the store keeps nothing in
one: no session (`PolledSession`: other processes' commits are polled for, a dead
holder's shards taken when its leases expire), no prepared statements, no NOTIFY, and
its limits set per transaction (`SET LOCAL`) instead of at connect.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped, import-not-found, unused-ignore]

import corral.persistence._pg_tail as tail
from corral._errors import CorralError, StoreError

from ._batch import CommitQueue
from ._ops_handoff import HandOffLeaseOp
from ._ops_leases import (
    AcquireLeasesOp,
    ReleaseLeasesOp,
    RenewLeasesOp,
    check_lease_shards,
    lease_view,
)
from ._pg_pool import IDLE_LIFETIME, SharedPool
from ._pg_schema import ensure_schema, keys_in_code_points
from ._pg_session import HostSession, PolledSession
from ._pg_txn import PgTxn, is_connection_error, store_error
from ._pg_vacuum import Vacuum
from ._pg_writer import GroupCommit, txn_limits
from ._records import JournalEntry
from ._store_core import StoreCore
from ._txn import Fence, WriteOp
from ._urls import redacted, transaction_pooled, url_refused

__all__ = ["PostgresStore", "open_postgres_store"]

T = TypeVar("T")
log = logging.getLogger("corral.store.postgres")


async def _reset(conn: Any) -> None:
    """What a pooled connection needs before reuse: no open transaction (we keep no
    other session state), instead of asyncpg's default reset query on every release."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


_DEFAULT_LEASE_TERM = 10.0  # the runtime's default `lease_ttl`: until a lease is taken here


def _session_settings(timeout: float, *, pooled: bool) -> dict[str, str]:
    """The pooled sessions' server settings: no statement runs past `timeout` (the
    client gave up on it by then), and the transaction limits of the default lease term
    until this store takes a lease (its writer then sets its own term's, per
    transaction: `GroupCommit.hold_locks_within`). Without them a session cut off
    inside a transaction held its locks for minutes, and a takeover with them.

    JIT compilation off: corral's statements are short index reads and writes, and a
    listing page's plan, costed on its estimates (a range per type of the page), crossed
    `jit_above_cost` at 1M entities and spent 35 ms compiling a 0.1 ms read.

    Behind a pooler in transaction mode only the name: PgBouncer refuses other startup
    settings, and the writer sets them per transaction (`SET LOCAL`) instead (the
    operating guide's PgBouncer section turns JIT off for the database)."""
    if pooled:
        return {"application_name": "corral"}
    limits = {name: str(ms) for name, ms in _limits(timeout).items()}
    return {"application_name": "corral", "jit": "off", **limits}


def _limits(timeout: float) -> dict[str, int]:
    return {"statement_timeout": int(timeout * 1000), **txn_limits(_DEFAULT_LEASE_TERM)}


def _was_dead(err: Exception) -> bool:
    """Whether a read failed because its connection was dead before it ran (not a
    timeout nor a statement the server cancelled: running those again doubles a wait)."""
    return is_connection_error(err) and not isinstance(
        err, asyncio.TimeoutError | asyncpg.QueryCanceledError)


class PostgresStore(StoreCore):
    """The PostgreSQL implementation of `Store`. Open it with `open_postgres_store`.

    Any number of processes, on any machines, may open stores on one database: each
    has a pool of connections shared by its writer (group commit, one batch at a time)
    and its reads, and one session for commit notifications and shard locks (see the
    module docstring). Idle, it holds two connections: one pooled, and the session.
    """

    durable = True

    def __init__(self, url: str, *, shards: int, pool_size: int = 10, timeout: float = 30.0,
                 poll_fallback: float = 1.0) -> None:
        self._pool: Any = None
        self._closed = False
        self.url = url
        self._dsn, self._pooled = transaction_pooled(url)  # the URL for the driver
        self.shards = shards
        self._pool_size = max(pool_size, 2)  # the writer needs one; reads another
        # Reads never take the pool's last connection: a batch never waits behind them.
        self._readers = asyncio.Semaphore(self._pool_size - 1)
        self._timeout = timeout
        self._token = uuid.uuid4().hex[:16]  # this store in commit notifications
        self._held: set[int] = set()  # shards being acquired or held through this store
        self._session: HostSession | PolledSession = (
            PolledSession(fallback=poll_fallback) if self._pooled else
            HostSession(self._dsn, self._token, self._held, timeout=timeout,
                        fallback=poll_fallback))
        self._shared: SharedPool  # over `_pool`, once open
        self._writer: GroupCommit | None = None
        self._vacuum: Vacuum | None = None
        self._code_points = False  # `PgTxn.code_points`, once open
        self._queue: CommitQueue[WriteOp] = CommitQueue("postgresql")

    def __repr__(self) -> str:
        return f"PostgresStore({redacted(self.url)!r}, shards={self.shards})"

    async def _open(self) -> None:
        where = repr(redacted(self.url))
        try:
            self._pool = await asyncpg.create_pool(
                self._dsn, min_size=1, max_size=self._pool_size, reset=_reset,
                max_inactive_connection_lifetime=IDLE_LIFETIME,
                command_timeout=self._timeout, timeout=self._timeout,
                statement_cache_size=0 if self._pooled else 100,
                server_settings=_session_settings(self._timeout, pooled=self._pooled))
            async with self._pool.acquire() as conn:
                await ensure_schema(conn, self.shards, where=where)
                self._code_points = await keys_in_code_points(conn)
            await self._session.open()
        except CorralError:
            await self.close()
            raise
        except ValueError as err:  # a malformed URL (asyncpg's message quotes its secrets)
            await self.close()
            raise url_refused(self.url, err) from None
        except Exception as err:
            await self.close()
            raise store_error(f"cannot open store {where}", err) from err
        self._shared = SharedPool(self._pool, timeout=self._timeout)
        self._vacuum = Vacuum(self._shared, timeout=self._timeout)
        self._writer = GroupCommit(self._shared, self._token, self._held,
                                   timeout=self._timeout, attempts=self._pool_size + 1,
                                   pooled=self._pooled, vacuum=self._vacuum)
        if self._pooled:  # nothing set at connect: every transaction sets its limits
            self._writer.set_per_transaction(_limits(self._timeout))
        self._queue.open(self._writer.commit, self._writer.failed,
                          fails_all=self._writer.fails_all)

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- leases: the rows, and an advisory lock per shard held (see `_pg_session`) ----

    async def acquire_leases(self, owner: str, shards: Sequence[int], ttl: float, *,
                             force: bool = False) -> dict[int, int]:
        """Take the free or expired `shards`, and at once those whose advisory lock this
        store obtains (their holder's session ended: see `_pg_session`)."""
        self._lease_term(ttl)
        check_lease_shards(shards, self.shards)
        asked = set(shards)
        new = asked - self._held
        self._held.update(asked)  # tailing keeps their place from now on (see _pg_tail)
        try:
            orphaned = await self._session.try_lock(asked)
            op = AcquireLeasesOp(owner, tuple(shards), ttl, self.shards, force, orphaned)
            if not force:  # lock only the rows it may take (a standby: none, usually)
                op = op.narrowed(*await self.query(lease_view, shards))
            taken: dict[int, int] = await self.write(op) if op.shards else {}
        except BaseException:
            self._held.difference_update(new)
            await self._session.unlock(new)
            raise
        self._held.difference_update(asked - set(taken))
        await self._session.unlock(asked - set(taken))
        return taken

    async def renew_leases(self, owner: str, held: dict[int, int], ttl: float) -> set[int]:
        self._lease_term(ttl)
        kept: set[int] = await self.write(RenewLeasesOp(owner, tuple(held.items()), ttl))
        self._held.difference_update(set(held) - kept)
        await self._session.unlock(set(held) - kept)
        await self._session.try_lock(kept)  # a lease taken on expiry: lock it once we can
        return kept

    async def release_leases(self, owner: str) -> None:
        try:
            await self.write(ReleaseLeasesOp(owner))
        finally:
            self._held.clear()
            await self._session.unlock(self._session.locked)

    async def hand_off_leases(self, heirs: Mapping[Fence, str], ttl: float) -> set[int]:
        handed = await self.write_many([HandOffLeaseOp(f, h, ttl) for f, h in heirs.items()])
        shards = {fence.shard for fence in heirs}
        self._held.difference_update(shards)
        await self._session.unlock(shards)  # the heir takes the lock with the lease
        return {f.shard for f, ok in zip(heirs, handed, strict=True) if ok is True}

    def _lease_term(self, ttl: float) -> None:
        if self._writer is not None:
            self._writer.hold_locks_within(ttl)

    # -- reads --------------------------------------------------------------------

    async def query(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`fn(q, *args)` on a `PgTxn` over a pooled connection (single statements: no
        transaction needed); driver errors wrapped."""
        pooled, code_points = self._pooled, self._code_points
        return await self.read(lambda conn: fn(
            PgTxn(conn=conn, token="", pooled=pooled, code_points=code_points), *args))

    async def read(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run `fn(connection, *args)` on a pooled connection; driver errors wrapped.

        A read changes nothing, so one that met a dead connection (the server ended it
        while it sat in the pool, its goodbye not read yet: asyncpg then refuses the
        statement, "cannot switch to state 11; another operation (2) is in progress")
        runs again on another. Each dead one is terminated as it is found, so that
        happens at most once per pooled connection. Every path gives the connection back
        (`_give_back`) without ever raising over the read's own outcome.
        """
        if self._closed or self._pool is None:
            raise StoreError("store is closed")
        async with self._readers:
            return await self._read(fn, *args)

    async def _read(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        attempts = self._pool_size + 1
        for attempt in range(1, attempts + 1):
            conn = await self._acquire()
            failed: Exception | None = None
            try:
                return await fn(conn, *args)
            except CorralError:
                raise
            except Exception as err:  # a driver error, a lost connection, an unbindable value
                failed = err
                if attempt < attempts and _was_dead(err):
                    continue
                raise store_error("store read failed", err) from err
            finally:
                await self._give_back(conn, failed)
        raise AssertionError("unreachable")

    async def _acquire(self) -> Any:
        try:
            return await self._shared.acquire()
        except Exception as err:  # refused at connect ("not accepting connections"...)
            raise store_error("store read failed: no connection", err, unavailable=True
                              ) from err

    async def _give_back(self, conn: Any, failed: Exception | None) -> None:
        """Return a read's connection to the pool, or terminate it; never raises.

        One whose read failed on the connection (timed out, lost) is terminated at once:
        asyncpg would otherwise send a cancel request on a new connection and wait for
        it, which across a partition never comes (and its wait raised a bare
        `TimeoutError` over the read's error). One that cannot be reset within
        `timeout` is terminated too."""
        if failed is None or not is_connection_error(failed):
            try:
                await self._shared.release(conn)
            except Exception as err:  # terminated by `release`
                log.info("store read connection not reusable (%s: %s); terminated",
                         type(err).__name__, err)
            return
        self._shared.terminate(conn)

    async def wait_foreign_commit(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for another process's commit for a shard held
        here; woken at once by its NOTIFY."""
        self._refuse_if_closed()
        return await self._session.wait(timeout)

    async def foreign_commit_seen(self) -> bool:
        """Whether another process accepted entries (for a shard held here) since the
        last call: at once through LISTEN/NOTIFY, else at least every `poll_fallback`."""
        self._refuse_if_closed()
        return self._session.seen()

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise StoreError("store is closed")

    async def journal_tail(self, after_pos: int, shards: frozenset[int], limit: int = 2000
                           ) -> tuple[int, list[JournalEntry]]:
        """Entries committed after position `after_pos` for `shards`; returns the new
        position (an opaque int: one tick per shard, see `_pg_tail`)."""
        cursor = tail.unpack_position(after_pos, self.shards)
        return await self.read(tail.read_tail, cursor, shards, set(self._held), limit)

    async def journal_end(self) -> int:
        return tail.pack_position(await self.read(tail.current_ticks, self.shards))

    # -- lifecycle ------------------------------------------------------------------

    async def close(self) -> None:
        """Commit what is queued, then close the session and the pool."""
        if self._closed:
            return
        self._closed = True
        await self._queue.close()  # commits what is queued first
        if self._vacuum is not None:
            await self._vacuum.close()
        if self._writer is not None:
            await self._writer.close()
        await self._session.close()
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), self._timeout)
            except (asyncio.TimeoutError, OSError, asyncpg.PostgresError,
                    asyncpg.InterfaceError):
                self._pool.terminate()

    def __del__(self) -> None:
        if not self._closed and self._pool is not None:
            warnings.warn(f"{self!r} was never closed", ResourceWarning, stacklevel=1)


async def open_postgres_store(url: str, *, shards: int, pool_size: int = 10,
                              timeout: float = 30.0, poll_fallback: float = 1.0
                              ) -> PostgresStore:
    """Open (creating or migrating its schema if needed) the store in the database at `url`.

    Args:
        url: a `postgresql://user:password@host:port/database` URL (libpq style).
            `?pool=transaction` names a database behind a pooler in transaction mode
            (PgBouncer): the store then keeps nothing in a server session (see the
            module docstring; "PostgreSQL behind PgBouncer" in the operating guide).
        shards: fixed for the life of a store (checked against it).
        pool_size: most connections in the pool (at least 2), shared by the writer
            and the reads; reads never take the last one. Unused connections close
            after 10 s: an idle store holds one, and one more, its session.
        timeout: seconds any one statement, connection attempt or pool wait may take
            before the call fails with `StoreUnavailableError` (never a hang).
        poll_fallback: a host checks for other processes' entries at least this often
            even when no notification arrived (the safety net under LISTEN/NOTIFY).

    Raises:
        StoreUnavailableError: the server cannot be reached (retryable).
        StoreError: the schema is newer than this corral, or the store was created with
            another shard count.
        InvalidArgumentError: `url` is malformed (asyncpg cannot parse it), or its
            `pool` option is not `transaction`.

    Example:
        store = await open_postgres_store("postgresql://corral@db/corral", shards=16)
        async with corral.open_runtime(store, entities=[TicketAgent]) as rt:
            ...
        await store.close()
    """
    store = PostgresStore(url, shards=shards, pool_size=pool_size, timeout=timeout,
                          poll_fallback=poll_fallback)
    await store._open()
    return store
