"""`GroupCommit`: the one writer connection of a `PostgresStore`, committing the
batches of its `CommitQueue` (`_batch`: group commit, and an op that fails fails alone).

A lost or timed-out connection fails every op of its batch with a
`StoreUnavailableError` (retryable) and is dropped; the next batch takes a new one from
the pool. Every path leaves the connection outside a transaction, or drops it.

A connection the server closed while it sat idle between batches (an idle timeout, a
`pg_terminate_backend`, a server restart) is replaced without failing anyone: asyncpg
hands it back to the pool the moment it reads the server's goodbye (from then on every
method of the writer's proxy raises), and one whose end was not read yet fails on its
first statement, `BEGIN`, before anything of the batch was sent, so the batch runs
once more on a fresh connection.
"""

from __future__ import annotations

import contextlib
from typing import Any

import asyncpg  # type: ignore[import-untyped, import-not-found, unused-ignore]

from corral._errors import StoreError

from ._pg_txn import PgTxn, is_connection_error, store_error
from ._pg_vacuum import Vacuum
from ._txn import LockPlan, WriteOp, apply_ops

__all__ = ["GroupCommit", "txn_limits"]


class GroupCommit:
    """Commits batches of write ops on one connection of `pool`.

    `held` is the store's live set of shards it holds or is acquiring: acceptances for
    them send no commit notification (this process hosts them and delivers its own).
    `vacuum` hears of the rows each committed transaction's trims deleted.
    """

    def __init__(self, pool: Any, token: str, held: set[int], *, timeout: float,
                 vacuum: Vacuum | None = None) -> None:
        self._pool = pool
        self._vacuum = vacuum
        self._token = token  # the store's identity in commit notifications
        self._held = held  # the store's shards: accepted for them, nobody is notified
        self._timeout = timeout
        self._conn: Any = None  # held across batches
        self._begin = "BEGIN"  # with the lease term's limits once known (`hold_locks_within`)

    def hold_locks_within(self, lease_term: float) -> None:
        """Bound what a transaction of this writer may hold by `lease_term`: cut off
        inside one (its process paused, its link down), the server ends the session
        and frees its locks (lease rows, shard ticks) within the lease term, so a
        takeover and sends into its shards are not held up longer (`txn_limits`)."""
        self._begin = "BEGIN; " + "; ".join(
            f"SET LOCAL {name} = {ms}" for name, ms in txn_limits(lease_term).items())

    @property
    def conn(self) -> Any:
        """The connection the writer holds now (None between connections)."""
        return self._conn

    async def close(self) -> None:
        """Give the connection back to the pool (the queue is closed and drained)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await self._pool.release(conn, timeout=self._timeout)

    @staticmethod
    def failed(err: Exception) -> StoreError:
        """The error one caller of a failed commit gets (each caller its own)."""
        if isinstance(err, _CommitFailed):
            return err.error_for()
        return store_error("store write failed", err)

    @staticmethod
    def fails_all(err: Exception) -> bool:
        """A lost connection fails every op of its batch: none would fare better alone."""
        return isinstance(err, _CommitFailed) and err.connection_lost

    async def commit(self, ops: list[WriteOp]) -> list[Any]:
        """`_commit`, run once more on a fresh connection if the held one turned out
        dead before the transaction began (closed while idle, its end not read yet)."""
        try:
            return await self._commit(ops)
        except _CommitFailed as failed:
            if not failed.stale:
                raise
        return await self._commit(ops)

    async def _commit(self, ops: list[WriteOp]) -> list[Any]:
        """Apply `ops` in one transaction and commit; on any failure roll back (or drop
        the connection) and raise `_CommitFailed`."""
        held = began = sent_commit = False
        try:
            held = self._conn is not None and _usable(self._conn)
            conn = await self._connection()
            txn = PgTxn(conn=conn, token=self._token, quiet=frozenset(self._held))
            plan = LockPlan()
            for op in ops:
                op.plan(plan)
            await conn.execute(self._begin)
            began = True
            await txn.lock(plan)
            results = await apply_ops(txn, ops)
            sent_commit = True
            await conn.execute("COMMIT")
            if txn.deleted and self._vacuum is not None:
                self._vacuum.note(txn.deleted)
        except Exception as err:
            lost = is_connection_error(err) or self._conn is None or not _usable(self._conn)
            await (self._drop() if lost else self._rollback())
            raise _CommitFailed(err, lost, committed=None if sent_commit else False,
                                stale=lost and held and not began) from err
        except BaseException:  # cancelled mid-transaction (the loop is closing)
            await self._drop()
            raise
        return results

    async def _connection(self) -> Any:
        if self._conn is None or not _usable(self._conn):
            await self._drop()
            self._conn = await self._pool.acquire(timeout=self._timeout)
        return self._conn

    async def _rollback(self) -> None:
        conn = self._conn
        if conn is None or not _usable(conn) or not conn.is_in_transaction():
            return
        try:
            await conn.execute("ROLLBACK", timeout=self._timeout)
        except Exception:  # a connection that cannot even roll back is not reused
            await self._drop()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if _usable(conn):
            conn.terminate()
        with contextlib.suppress(Exception):  # a connection already handed back: a no-op
            await self._pool.release(conn)


def txn_limits(lease_term: float) -> dict[str, int]:
    """PostgreSQL's limits (ms) for a transaction of a store whose leases last
    `lease_term` seconds: a session idle inside a transaction is ended after a third of
    it, and a lock is waited for at most half of it (the holder, if cut off, is gone
    first; if not, the caller retries a `StoreUnavailableError`). At least 1 s each: a
    busy client may pause that long between the statements of a batch."""
    return {"idle_in_transaction_session_timeout": max(1000, int(lease_term * 1000 / 3)),
            "lock_timeout": max(1000, int(lease_term * 1000 / 2))}


def _usable(conn: Any) -> bool:
    """Whether the pooled connection `conn` is still the writer's and open. asyncpg
    hands a connection the server closed back to the pool at once, and from then on
    every method of its proxy (`is_closed` too) raises `InterfaceError`."""
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:
        return False


class _CommitFailed(Exception):
    """A batch's transaction failed (rolled back, or its connection dropped)."""

    def __init__(self, cause: Exception, connection_lost: bool, *,
                 committed: bool | None, stale: bool = False) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.connection_lost = connection_lost
        self.committed = committed
        self.stale = stale  # a held connection was dead before BEGIN: nothing was sent

    def error_for(self) -> StoreError:
        """A fresh error for one caller (each caller gets its own object)."""
        what = "store write failed" if self.connection_lost else \
            "store write failed, nothing committed"
        return store_error(what, self.cause, committed=self.committed)
