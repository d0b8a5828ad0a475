"""`GroupCommit`: the one writer of a `PostgresStore`, group-committing queued ops.

Every op queued while the previous batch was committing goes into the next
transaction, on one connection held across batches, with no timer: light load gives
one commit per op, heavy load batches by itself. Each caller awaits its own future,
resolved only after its batch committed; a cancelled caller cancels only its own
future (its op still commits).

An op refuses by raising a `CorralError` before it writes, and only its caller gets
that error. Any other failure (a driver error, a bug, a value the driver cannot bind)
rolls the whole transaction back, and the batch runs again one op per transaction, so
the op that fails fails alone, each caller with its own `StoreError` whose `__cause__`
is the driver's error. A lost or timed-out connection fails every op of its batch with
a `StoreUnavailableError` (retryable) and is dropped; the next batch takes a new one
from the pool. Every path leaves the connection outside a transaction, or drops it.

A connection the server closed while it sat idle between batches (an idle timeout, a
`pg_terminate_backend`, a server restart) is replaced without failing anyone: asyncpg
hands it back to the pool the moment it reads the server's goodbye (from then on every
method of the writer's proxy raises), and one whose end was not read yet fails on its
first statement, `BEGIN`, before anything of the batch was sent, so the batch runs
once more on a fresh connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Sequence
from functools import partial
from typing import Any

import asyncpg  # type: ignore[import-untyped, import-not-found, unused-ignore]

import corral.metrics as metrics
from corral._errors import StoreError

from ._batch import CommitQueue
from ._pg_txn import PgTxn, is_connection_error, store_error
from ._txn import LockPlan, WriteOp, apply_ops

__all__ = ["GroupCommit"]


class GroupCommit:
    """Commits queued write ops in batches on one connection of `pool`.

    `held` is the store's live set of shards it holds or is acquiring: acceptances for
    them send no commit notification (this process hosts them and delivers its own).

    Attributes:
        commits: transactions committed (one per batch when all goes well).
        ops_committed: write ops those transactions carried.
    """

    def __init__(self, pool: Any, token: str, held: set[int], *, timeout: float) -> None:
        self._pool = pool
        self._token = token  # the store's identity in commit notifications
        self._held = held  # the store's shards: accepted for them, nobody is notified
        self._timeout = timeout
        self._conn: Any = None  # held across batches
        self._queue: CommitQueue[WriteOp] = CommitQueue()
        self._task: asyncio.Task[None] | None = None
        self.commits = 0
        self.ops_committed = 0

    @property
    def conn(self) -> Any:
        """The connection the writer holds now (None between connections)."""
        return self._conn

    @property
    def idle(self) -> bool:
        """No write is queued or committing."""
        return self._queue.idle

    def start(self) -> None:
        self._task = asyncio.create_task(
            self._queue.serve(self._apply_batch, partial(store_error, "store write failed")),
            name="corral-pg-writer")

    def write(self, op: WriteOp) -> Coroutine[Any, Any, Any]:
        """Apply `op` in the next group-commit transaction; return its result once durable."""
        return self._queue.write(op)

    def write_many(self, ops: Sequence[WriteOp]) -> Coroutine[Any, Any, list[Any]]:
        """`write` for each op, in one batch: each op's result, or the error refusing it."""
        return self._queue.write_many(ops)

    async def close(self) -> None:
        """Commit what is queued, then give the connection back to the pool."""
        self._queue.close()  # the loop commits what is queued, then returns
        if self._task is not None:
            await self._task
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await self._pool.release(conn, timeout=self._timeout)

    async def _apply_batch(self, ops: list[WriteOp]) -> list[Any]:
        """One transaction for the batch; on failure, one per op (see the module doc)."""
        try:
            return await self._attempt(ops)
        except _CommitFailed as failed:
            if failed.connection_lost or len(ops) == 1:
                return [failed.error_for(len(ops) > 1) for _ in ops]
        results: list[Any] = []
        for op in ops:  # isolate the failing op: nothing of the batch was committed
            try:
                results.extend(await self._attempt([op]))
            except _CommitFailed as one:
                results.append(one.error_for(False))
        return results

    async def _attempt(self, ops: list[WriteOp]) -> list[Any]:
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
            await conn.execute("BEGIN")
            began = True
            await txn.lock(plan)
            results = await apply_ops(txn, ops)
            sent_commit = True
            await conn.execute("COMMIT")
        except Exception as err:
            lost = is_connection_error(err) or self._conn is None or not _usable(self._conn)
            await (self._drop() if lost else self._rollback())
            raise _CommitFailed(err, lost, committed=None if sent_commit else False,
                                stale=lost and held and not began) from err
        except BaseException:  # cancelled mid-transaction (the loop is closing)
            await self._drop()
            raise
        self.commits += 1
        metrics.batch("postgresql", len(ops))
        self.ops_committed += len(ops)
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

    def error_for(self, in_batch: bool) -> StoreError:
        """A fresh error for one caller (each caller gets its own object)."""
        what = "store write failed" if self.connection_lost or in_batch else \
            "store write failed, nothing committed"
        return store_error(what, self.cause, committed=self.committed)
