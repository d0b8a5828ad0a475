"""Group commit, shared by both stores: the queue of ops and the writer's loop.

Callers add ops while the writer commits the previous batch, with no timer: light load
gives one commit per op, heavy load batches by itself. The writer takes the whole queue
as one transaction and answers every op's future with its result, or with the error
that refused it (an exception *object*: each caller raises its own). Each caller awaits
its own future, resolved only after its batch committed: a cancelled caller cancels
only its own future (its op still commits).

An op refuses by raising a `CorralError` before it writes, and only its caller gets
that error. Any other failure (a driver error, a bug, a value the driver cannot bind)
rolls the whole transaction back, and the batch runs again one op per transaction
(nothing of it was committed, so running the ops again is safe): the op that fails
fails alone, its caller with a `StoreError` of its own whose `__cause__` is the
driver's error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import corral.metrics as metrics
from corral._errors import StoreError

from ._housekeeping import housekeeping, in_housekeeping

__all__ = ["Batch", "CommitQueue"]

Item = TypeVar("Item")


class Batch(Generic[Item]):
    __slots__ = ("futures", "housekeeping", "ops")

    def __init__(self) -> None:
        self.ops: list[Item] = []
        self.futures: list[asyncio.Future[Any]] = []  # one per op, same order
        # Every op queued in a host's housekeeping: committed as such (`_housekeeping`).
        self.housekeeping = True

    def add(self, op: Item) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.ops.append(op)
        self.futures.append(future)
        self.housekeeping = self.housekeeping and in_housekeeping()
        return future

    def add_many(self, ops: Sequence[Item]) -> list[asyncio.Future[Any]]:
        self.housekeeping = self.housekeeping and in_housekeeping()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = [loop.create_future() for _ in ops]
        self.ops.extend(ops)
        self.futures.extend(futures)
        return futures

    def settle(self, results: Sequence[Any]) -> None:
        """Answer every op (in order); a cancelled caller's future is left as it is."""
        for future, result in zip(self.futures, results, strict=True):
            if not future.done():
                future.set_result(result)


class CommitQueue(Generic[Item]):
    """The batch a writer commits next: callers `write`, the writer takes `batches()`
    until the queue is closed and its last batch taken.

    Attributes:
        commits: transactions committed (one per batch when all goes well).
        ops_committed: write ops those transactions carried.
    """

    __slots__ = ("_batch", "_engine", "_task", "_wakeup", "closed", "commits", "committing",
                 "ops_committed")

    def __init__(self, engine: str) -> None:
        self._engine = engine  # its name in metrics
        self._batch: Batch[Item] | None = None
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.closed = False
        self.committing = False
        self.commits = 0
        self.ops_committed = 0

    @property
    def idle(self) -> bool:
        """No op is queued or committing."""
        return self._batch is None and not self.committing

    def open(self, commit: Callable[[list[Item]], Awaitable[list[Any]]],
             failed: Callable[[Exception], StoreError], *,
             fails_all: Callable[[Exception], bool] = lambda err: False) -> None:
        """Open the queue: its writer task commits each batch by `commit` (one
        transaction: each op's result or the error refusing it), retried one op per
        transaction if it raises; a caller whose op failed gets `failed(err)`, and every
        caller of the batch at once if `fails_all(err)` (a lost connection: no op would
        fare better)."""
        self._task = asyncio.create_task(self._serve(commit, failed, fails_all),
                                         name=f"corral-{self._engine}-writer")

    async def _serve(self, commit: Callable[[list[Item]], Awaitable[list[Any]]],
                     failed: Callable[[Exception], StoreError],
                     fails_all: Callable[[Exception], bool]) -> None:
        async for batch in self.batches():
            self.committing = True
            try:
                with housekeeping(batch.housekeeping):
                    results = await self._commit(commit, batch.ops, failed, fails_all)
            finally:
                self.committing = False
            batch.settle(results)

    async def _commit(self, commit: Callable[[list[Item]], Awaitable[list[Any]]],
                      ops: list[Item], failed: Callable[[Exception], StoreError],
                      fails_all: Callable[[Exception], bool]) -> list[Any]:
        """One transaction for `ops`; on failure, one per op (see the module doc)."""
        try:
            return await self._counted(commit, ops)
        except Exception as err:
            if len(ops) == 1 or fails_all(err):
                return [failed(err) for _ in ops]
        results: list[Any] = []
        for op in ops:
            try:
                results.extend(await self._counted(commit, [op]))
            except Exception as err:
                results.append(failed(err))
        return results

    async def _counted(self, commit: Callable[[list[Item]], Awaitable[list[Any]]],
                       ops: list[Item]) -> list[Any]:
        results = await commit(ops)
        self.commits += 1
        self.ops_committed += len(ops)
        metrics.batch(self._engine, len(ops))
        return results

    @property
    def empty(self) -> bool:
        """No op is waiting for the writer (one it took may still be committing)."""
        return self._batch is None

    async def write(self, op: Item) -> Any:
        """Apply `op` in the next group-commit transaction; return its result once durable."""
        if self.closed:
            raise StoreError("store is closed")
        result = await self._next().add(op)  # cancelling the caller cancels only its own
        if isinstance(result, BaseException):
            raise result
        return result

    async def write_many(self, ops: Sequence[Item]) -> list[Any]:
        """`write` for each op, in one batch: each op's result, or the error refusing it."""
        if self.closed:
            raise StoreError("store is closed")
        return [await future for future in self._next().add_many(ops)]

    async def close(self) -> None:
        """Refuse new writes; return once the writer committed what was queued."""
        self.closed = True
        self._wakeup.set()
        if self._task is not None:
            await self._task

    async def batches(self) -> AsyncIterator[Batch[Item]]:
        """Each batch, as the writer takes it (a new one starts for the next write)."""
        answered = 0  # ops in the batch the writer committed last
        while not (self.closed and self._batch is None):
            await self._wakeup.wait()
            if answered > 1:
                # The callers that commit just answered are about to queue their next
                # ops: let them first, so one commit takes them all. Otherwise an op
                # queued meanwhile (a snapshot, every `SnapshotPolicy.every` messages)
                # was committed alone, with a sync of its own, while they waited.
                await asyncio.sleep(0)
            self._wakeup.clear()
            batch, self._batch = self._batch, None
            if batch is not None:
                answered = len(batch.ops)
                yield batch

    def _next(self) -> Batch[Item]:
        batch = self._batch
        if batch is None:
            batch = self._batch = Batch()
            self._wakeup.set()
        return batch
