"""`PostgresStore`: the `Store` on a shared PostgreSQL database, through asyncpg.

Any number of processes, on any number of machines, share one database. The pieces:

- `_pg_writer`: group commit. Every op queued while the previous batch was committing
  goes into the next transaction on the one writer connection; each caller is
  answered only after commit; an op that fails fails alone; a lost connection gives
  each caller a retryable `StoreUnavailableError`.
- `_pg_txn`: the transaction, its locks (acceptance linearised under READ COMMITTED
  by the shard's tick row and the entity rows; fenced writes hold their lease row) and
  its set-based writes (the rows as JSON, one statement per batch).
- `_pg_ops`, `_pg_lifecycle`: the write ops, each the twin of a SQLite op.
- `_pg_reads`: reads on the pool, and the journal tail: per shard, in commit order.
- `_pg_session`: LISTEN/NOTIFY (a host hears of other processes' acceptances for its
  shards at once; a slow poll is the safety net) and per-shard advisory locks (a dead
  holder's shards are taken over at once, as with the SQLite store's file locks).
- `_pg_schema`: the versioned schema, created or migrated on open.
"""

from __future__ import annotations

import asyncio
import uuid
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped, import-not-found, unused-ignore]

from corral._common import RunStatus
from corral._errors import CorralError, StoreError, StoreUnavailableError

from . import _pg_reads as reads
from ._pg_lifecycle import (
    ActivatedOp,
    CloseRunOp,
    ContinueAsNewOp,
    RecordDeadLetterOp,
    RecordUpdateOp,
    SettleRunOp,
    SnapshotOp,
    TimerOp,
)
from ._pg_ops import (
    AcceptOp,
    AcquireLeasesOp,
    DiscardDeadLetterOp,
    ReleaseLeasesOp,
    RenewLeasesOp,
    ReplayDeadLetterOp,
)
from ._pg_schema import ensure_schema
from ._pg_session import HostSession
from ._pg_suspensions import PgClearSuspensionOp, PgSuspendOp
from ._pg_txn import PgOp, is_connection_error, store_error
from ._pg_waits import DeliverOp, ExpireWaitOp, OpenWaitOp, open_waits
from ._pg_writer import GroupCommit
from ._records import (
    Acceptance,
    AcceptResult,
    DeadLetter,
    DeliveryRequest,
    DeliveryResult,
    EntityDetails,
    EntityRecord,
    JournalEntry,
    RunRecord,
    Suspension,
    UpdateOutcome,
    WaitRecord,
)
from ._txn import Fence
from ._waits import WaitPosition

__all__ = ["PostgresStore", "open_postgres_store"]

T = TypeVar("T")


async def _reset(conn: Any) -> None:
    """What a pooled connection needs before reuse: no open transaction (we keep no
    other session state), instead of asyncpg's default reset query on every release."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


class PostgresStore:
    """The PostgreSQL implementation of `Store`. Open it with `open_postgres_store`.

    Any number of processes, on any machines, may open stores on one database: each
    has one writer connection (group commit), a pool for reads, and one session for
    commit notifications and shard locks (see the module docstring).
    """

    durable = True

    def __init__(self, url: str, *, shards: int, pool_size: int = 10, timeout: float = 30.0,
                 poll_fallback: float = 1.0) -> None:
        self.url = url
        self.shards = shards
        self._pool_size = max(pool_size, 2)  # the writer holds one; reads need another
        self._timeout = timeout
        self._token = uuid.uuid4().hex[:16]  # this store in commit notifications
        self._held: set[int] = set()  # shards being acquired or held through this store
        self._session = HostSession(url, self._token, self._held, timeout=timeout,
                                    fallback=poll_fallback)
        self._pool: Any = None
        self._writer: GroupCommit | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"PostgresStore({_redact(self.url)!r}, shards={self.shards})"

    async def _open(self) -> None:
        where = repr(_redact(self.url))
        try:
            self._pool = await asyncpg.create_pool(
                self.url, min_size=1, max_size=self._pool_size, reset=_reset,
                command_timeout=self._timeout, timeout=self._timeout,
                server_settings={"application_name": "corral",
                                 "idle_in_transaction_session_timeout":
                                     str(int(self._timeout * 2000))})
            async with self._pool.acquire() as conn:
                await ensure_schema(conn, self.shards, where=where)
            await self._session.start()
        except CorralError:
            await self.close()
            raise
        except Exception as err:
            await self.close()
            text = f"cannot open store {where}: {type(err).__name__}: {err}"
            if is_connection_error(err):
                raise StoreUnavailableError(text, committed=False) from err
            raise StoreError(text) from err
        self._writer = GroupCommit(self._pool, self._token, self._held,
                                   timeout=self._timeout)
        self._writer.start()

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- writes -------------------------------------------------------------------

    async def write(self, op: PgOp) -> Any:
        """Apply `op` in the next group-commit transaction; return its result once durable."""
        if self._writer is None:
            raise StoreError("store is closed" if self._closed else "store is not open")
        return await self._writer.write(op)

    @property
    def idle(self) -> bool:
        """No write is queued or committing (`corral.testing` waits for this)."""
        return self._writer is None or self._writer.idle

    @property
    def commits(self) -> int:
        """Transactions the writer committed (one per batch when all goes well)."""
        return 0 if self._writer is None else self._writer.commits

    @property
    def ops_committed(self) -> int:
        """Write ops those transactions carried."""
        return 0 if self._writer is None else self._writer.ops_committed

    # -- the Store protocol's writes ------------------------------------------------

    def accept(self, acc: Acceptance) -> Coroutine[Any, Any, AcceptResult]:
        return self.write(AcceptOp(acc))  # no frame of its own: every send comes here

    async def accept_many(self, accs: Sequence[Acceptance]) -> list[AcceptResult | Exception]:
        if self._writer is None:
            raise StoreError("store is closed" if self._closed else "store is not open")
        return await self._writer.write_many([AcceptOp(acc) for acc in accs])

    async def deliver(self, req: DeliveryRequest) -> DeliveryResult:
        return await self.write(DeliverOp(req))  # type: ignore[no-any-return]

    async def open_wait(self, fence: Fence, etype: str, key: str, run_id: int, name: str, *,
                        deadline: float | None, now: float,
                        aliases: tuple[str, ...] = ()) -> WaitRecord:
        op = OpenWaitOp(fence, etype, key, run_id, name, deadline, now, aliases)
        return await self.write(op)  # type: ignore[no-any-return]

    async def expire_wait(self, fence: Fence, etype: str, key: str, run_id: int, name: str,
                          *, now: float) -> WaitRecord:
        op = ExpireWaitOp(fence, etype, key, run_id, name, now)
        return await self.write(op)  # type: ignore[no-any-return]

    async def signal_waits(self, etype: str | None, *, limit: int,
                           after: WaitPosition | None = None) -> list[WaitRecord]:
        return await self.read(open_waits, etype, limit, after)

    async def entities(self, etype: str | None, status: RunStatus | None, *, limit: int,
                       after: tuple[str, str] | None = None) -> list[EntityRecord]:
        return await self.read(reads.list_entities, etype, status, limit, after)

    async def entity_details(self, etype: str, key: str, run_id: int) -> EntityDetails:
        return await self.read(reads.entity_details, etype, key, run_id)

    async def record_update(self, fence: Fence, etype: str, key: str, message_id: str,
                            outcome: UpdateOutcome) -> None:
        await self.write(RecordUpdateOp(fence, etype, key, message_id, outcome.to_json()))

    async def close_run(self, fence: Fence, etype: str, key: str, run_id: int, *,
                        applied_seq: int, status: RunStatus, result: str | None,
                        error: str | None, force: bool = False,
                        pending: Sequence[JournalEntry] = ()) -> bool:
        op = CloseRunOp(fence, etype, key, run_id, applied_seq, status, result, error, force,
                        tuple(pending))
        return await self.write(op)  # type: ignore[no-any-return]

    async def settle_run(self, fence: Fence, etype: str, key: str, run_id: int, *,
                         applied_seq: int | None, pending: Sequence[JournalEntry] = (),
                         failed_at: float) -> int:
        op = SettleRunOp(fence, etype, key, run_id, applied_seq, tuple(pending), failed_at)
        return await self.write(op)  # type: ignore[no-any-return]

    async def acquire_leases(self, owner: str, shards: Sequence[int], ttl: float, *,
                             force: bool = False) -> dict[int, int]:
        """Take the free or expired `shards`, and at once those whose advisory lock this
        store obtains (their holder's session ended: see `_pg_session`)."""
        asked = set(shards)
        new = asked - self._held
        self._held.update(asked)  # tailing keeps their place from now on (see _pg_reads)
        try:
            orphaned = await self._session.try_lock(asked)
            taken: dict[int, int] = await self.write(
                AcquireLeasesOp(owner, tuple(shards), ttl, force, orphaned))
        except BaseException:
            self._held.difference_update(new)
            await self._session.unlock(new)
            raise
        self._held.difference_update(asked - set(taken))
        await self._session.unlock(asked - set(taken))
        return taken

    async def renew_leases(self, owner: str, held: dict[int, int], ttl: float) -> set[int]:
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

    async def write_snapshot(self, fence: Fence, etype: str, key: str, run_id: int, *,
                             applied_seq: int, state: bytes, keep: int,
                             passivate: bool = False, forget_seq: int = 0,
                             forget_before: float = 0.0) -> int:
        op = SnapshotOp(fence, etype, key, run_id, applied_seq, state, keep, passivate,
                        forget_seq, forget_before)
        return await self.write(op)  # type: ignore[no-any-return]

    async def continue_as_new(self, fence: Fence, etype: str, key: str, run_id: int, *,
                              applied_seq: int, next_input: str,
                              carried: Sequence[JournalEntry]) -> int:
        op = ContinueAsNewOp(fence, etype, key, run_id, applied_seq, next_input,
                             tuple(carried))
        return await self.write(op)  # type: ignore[no-any-return]

    async def mark_activated(self, fence: Fence, etype: str, key: str) -> None:
        await self.write(ActivatedOp(fence, etype, key))

    async def suspend_run(self, fence: Fence, record: Suspension) -> None:
        await self.write(PgSuspendOp(fence, record))

    async def clear_suspension(self, fence: Fence, etype: str, key: str, run_id: int
                               ) -> None:
        await self.write(PgClearSuspensionOp(fence, etype, key, run_id))

    async def suspensions(self, shard: int) -> list[Suspension]:
        return await self.read(reads.shard_suspensions, shard)

    async def set_timer(self, fence: Fence, etype: str, key: str, run_id: int,
                        timer_id: str, due_at: float | None) -> None:
        await self.write(TimerOp(fence, etype, key, run_id, timer_id, due_at))

    async def record_dead_letter(self, fence: Fence, entry: JournalEntry, *, error: str,
                                 traceback: str, attempts: int, failed_at: float) -> int:
        op = RecordDeadLetterOp(fence, entry, error, traceback, attempts, failed_at)
        return await self.write(op)  # type: ignore[no-any-return]

    async def replay_dead_letter(self, etype: str, key: str, shard: int, dead_letter_id: int,
                                 *, accepted_at: float) -> AcceptResult:
        op = ReplayDeadLetterOp(etype, key, shard, dead_letter_id, accepted_at)
        return await self.write(op)  # type: ignore[no-any-return]

    async def discard_dead_letter(self, etype: str, key: str, dead_letter_id: int) -> bool:
        return await self.write(DiscardDeadLetterOp(etype, key, dead_letter_id))  # type: ignore[no-any-return]

    # -- reads --------------------------------------------------------------------

    async def read(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run `fn(connection, *args)` on a pooled connection; driver errors wrapped."""
        if self._closed or self._pool is None:
            raise StoreError("store is closed")
        try:
            async with self._pool.acquire(timeout=self._timeout) as conn:
                return await fn(conn, *args)
        except CorralError:
            raise
        except Exception as err:  # a driver error, a lost connection, a value it cannot bind
            raise store_error("store read failed", err) from err

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
        position (an opaque int: one tick per shard, see `_pg_reads`)."""
        cursor = reads.unpack_position(after_pos, self.shards)
        return await self.read(reads.read_tail, cursor, shards, set(self._held), limit)

    async def journal_end(self) -> int:
        return reads.pack_position(await self.read(reads.current_ticks, self.shards))

    async def due_timers(self, shards: frozenset[int], now: float) -> list[tuple[str, str]]:
        return await self.read(reads.due_timers, shards, now)

    async def next_timer(self, shards: frozenset[int]) -> float | None:
        return await self.read(reads.next_timer, shards)

    async def latest_snapshot(self, etype: str, key: str, run_id: int
                              ) -> tuple[int, bytes] | None:
        return await self.read(reads.latest_snapshot, etype, key, run_id)

    async def journal(self, etype: str, key: str, *, run_id: int, after_seq: int
                      ) -> list[JournalEntry]:
        return await self.read(reads.journal, etype, key, run_id, after_seq)

    async def latest_run(self, etype: str, key: str) -> tuple[RunRecord, int] | None:
        return await self.read(reads.latest_run, etype, key)

    async def runs(self, etype: str, key: str) -> list[RunRecord]:
        return await self.read(reads.runs, etype, key)

    async def running_entities(self, shard: int) -> list[tuple[str, str]]:
        return await self.read(reads.running_entities, shard)

    async def count_running(self, shard: int) -> int:
        return await self.read(reads.count_running, shard)

    async def update_outcome(self, etype: str, key: str, message_id: str
                             ) -> UpdateOutcome | None:
        return await self.read(reads.update_outcome, etype, key, message_id)

    async def dead_letters(self, etype: str | None = None, key: str | None = None, *,
                           limit: int = 100, after: int = 0) -> list[DeadLetter]:
        return await self.read(reads.dead_letters, etype, key, limit, after)

    async def dead_letter_seqs(self, etype: str, key: str, run_id: int) -> frozenset[int]:
        return await self.read(reads.dead_letter_seqs, etype, key, run_id)

    # -- lifecycle ------------------------------------------------------------------

    async def close(self) -> None:
        """Commit what is queued, then close the session and the pool."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            await self._writer.close()  # commits what is queued first
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


def _redact(url: str) -> str:
    """The URL without its password, for messages and reprs."""
    head, sep, tail = url.rpartition("@")
    if not sep or "://" not in head:
        return url
    scheme, _, creds = head.partition("://")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}@{tail}"


async def open_postgres_store(url: str, *, shards: int, pool_size: int = 10,
                              timeout: float = 30.0, poll_fallback: float = 1.0
                              ) -> PostgresStore:
    """Open (creating or migrating its schema if needed) the store in the database at `url`.

    Args:
        url: a `postgresql://user:password@host:port/database` URL (libpq style).
        shards: fixed for the life of a store (checked against it).
        pool_size: connections in the pool (at least 2): one for the writer, the rest
            for reads. Each store also holds one more connection, its session.
        timeout: seconds any one statement, connection attempt or pool wait may take
            before the call fails with `StoreUnavailableError` (never a hang).
        poll_fallback: a host checks for other processes' entries at least this often
            even when no notification arrived (the safety net under LISTEN/NOTIFY).

    Raises:
        StoreUnavailableError: the server cannot be reached (retryable).
        StoreError: the schema is newer than this corral, or the store was created with
            another shard count.

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
