"""`GroupCommit`: the writer of a `PostgresStore`, committing the batches of its
`CommitQueue` (`_batch`: group commit, and an op that fails fails alone).

Each batch takes a connection from the store's pool and gives it back once committed,
so an idle host holds one pooled connection for its reads and writes together
(`_pg_pool`). The store never lets its reads take the pool's last connection, so a
batch never waits behind them.

A lost or timed-out connection fails every op of its batch with a
`StoreUnavailableError` (retryable) and is dropped. Every path gives the connection
back outside a transaction, or drops it.

A connection the server closed while it sat idle in the pool (an idle timeout, a
`pg_terminate_backend`, a server restart) is replaced without failing anyone: one whose
end was read is reconnected by the pool, and one whose end was not read yet fails on
its first statement, `BEGIN`, before anything of the batch was sent, so the batch runs
once more on another connection (at most once per pooled connection: each dead one is
terminated as it is found).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg  # type: ignore[import-untyped, import-not-found, unused-ignore]

from corral._errors import StoreError

from ._pg_pool import SharedPool
from ._pg_txn import PgTxn, is_connection_error, store_error
from ._pg_vacuum import Vacuum
from ._txn import LockPlan, WriteOp, apply_ops

__all__ = ["GroupCommit", "txn_limits"]


class GroupCommit:
    """Commits batches of write ops, each on a connection taken from `pool` for it.

    `held` is the store's live set of shards it holds or is acquiring: acceptances for
    them send no commit notification (this process hosts them and delivers its own).
    `vacuum` hears of the rows each committed transaction's trims deleted.
    """

    def __init__(self, pool: SharedPool, token: str, held: set[int], *, timeout: float,
                 attempts: int, pooled: bool = False, vacuum: Vacuum | None = None
                 ) -> None:
        self._pool = pool
        self._vacuum = vacuum
        self._token = token  # the store's identity in commit notifications
        self._held = held  # the store's shards: accepted for them, nobody is notified
        self._timeout = timeout
        self._attempts = attempts  # the pool's size and one: each dead connection once
        self._pooled = pooled  # behind a pooler in transaction mode (see `_postgres`)
        self._conn: Any = None  # during a batch only
        self._begin = "BEGIN"  # with the lease term's limits once known (`hold_locks_within`)
        self._settings: dict[str, int] = {}

    def hold_locks_within(self, lease_term: float) -> None:
        """Bound what a transaction of this writer may hold by `lease_term`: cut off
        inside one (its process paused, its link down), the server ends the session
        and frees its locks (lease rows, shard ticks) within the lease term, so a
        takeover and sends into its shards are not held up longer (`txn_limits`)."""
        self.set_per_transaction(txn_limits(lease_term))

    def set_per_transaction(self, settings: dict[str, int]) -> None:
        """Set `settings` (ms) at the start of each transaction (`SET LOCAL`), over
        those set before."""
        self._settings.update(settings)
        self._begin = "BEGIN; " + "; ".join(
            f"SET LOCAL {name} = {ms}" for name, ms in self._settings.items())

    async def close(self) -> None:
        """Nothing to give back: a connection is held during a batch only, and the queue
        is closed and drained."""
        await self._give_back()

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
        """`_commit`, run once more on another connection while the one taken turned
        out dead before the transaction began (closed while idle, its end not read)."""
        for _ in range(self._attempts - 1):
            try:
                return await self._commit(ops)
            except _CommitFailed as failed:
                if not failed.stale:
                    raise
        return await self._commit(ops)

    async def _commit(self, ops: list[WriteOp]) -> list[Any]:
        """Apply `ops` in one transaction, commit, and give the connection back; on any
        failure roll back (or drop the connection) and raise `_CommitFailed`."""
        acquired = began = sent_commit = False
        try:
            conn = self._conn = await self._pool.acquire()
            acquired = True
            txn = PgTxn(conn=conn, token=self._token, quiet=frozenset(self._held),
                        pooled=self._pooled)
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
            await self._give_back()
            # Dead before anything of the batch was sent (not a statement that timed
            # out or was cancelled: that connection was alive, and waiting again for
            # another doubles the caller's wait).
            stale = lost and acquired and not began and not isinstance(
                err, asyncio.TimeoutError | asyncpg.QueryCanceledError)
            raise _CommitFailed(err, lost, committed=None if sent_commit else False,
                                stale=stale) from err
        except BaseException:  # cancelled mid-transaction (the loop is closing)
            await self._drop()
            raise
        await self._give_back()
        return results

    async def _give_back(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # cannot be reset: terminated, not reused
                await self._pool.release(conn)

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
        if conn is not None:
            self._pool.terminate(conn)


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
