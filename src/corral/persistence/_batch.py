"""The queue of group commits, shared by both stores' writers.

Callers add ops while the writer commits the previous batch; the writer takes the whole
queue as one transaction and answers every op's future with its result, or with the
error that refused it (an exception *object*: each caller raises its own).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from corral._errors import StoreError

__all__ = ["Batch", "CommitQueue"]

Op = TypeVar("Op")


class Batch(Generic[Op]):
    __slots__ = ("futures", "ops")

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.futures: list[asyncio.Future[Any]] = []  # one per op, same order

    def add(self, op: Op) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.ops.append(op)
        self.futures.append(future)
        return future

    def add_many(self, ops: Sequence[Op]) -> list[asyncio.Future[Any]]:
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


class CommitQueue(Generic[Op]):
    """The batch a writer commits next: callers `write`, the writer takes `batches()`
    until the queue is closed and its last batch taken."""

    __slots__ = ("_batch", "_wakeup", "closed", "committing")

    def __init__(self) -> None:
        self._batch: Batch[Op] | None = None
        self._wakeup = asyncio.Event()
        self.closed = False
        self.committing = False

    @property
    def idle(self) -> bool:
        """No op is queued or committing."""
        return self._batch is None and not self.committing

    async def serve(self, commit: Callable[[list[Op]], Awaitable[list[Any]]],
                    failed: Callable[[Exception], StoreError]) -> None:
        """The writer's loop: commit each batch, answer its ops; until closed and done.
        `commit` answers each op (a result or the error refusing it); if `commit`
        itself fails, every op of the batch gets its own `failed(err)`."""
        async for batch in self.batches():
            self.committing = True
            try:
                results = await commit(batch.ops)
            except Exception as err:  # a bug here must not leave callers waiting
                results = [failed(err) for _ in batch.ops]
            finally:
                self.committing = False
            batch.settle(results)

    @property
    def empty(self) -> bool:
        """No op is waiting for the writer (one it took may still be committing)."""
        return self._batch is None

    async def write(self, op: Op) -> Any:
        """Apply `op` in the next group-commit transaction; return its result once durable."""
        if self.closed:
            raise StoreError("store is closed")
        result = await self._next().add(op)  # cancelling the caller cancels only its own
        if isinstance(result, BaseException):
            raise result
        return result

    async def write_many(self, ops: Sequence[Op]) -> list[Any]:
        """`write` for each op, in one batch: each op's result, or the error refusing it."""
        if self.closed:
            raise StoreError("store is closed")
        return [await future for future in self._next().add_many(ops)]

    def close(self) -> None:
        """Refuse new writes; the writer takes what is queued, then `batches()` ends."""
        self.closed = True
        self._wakeup.set()

    async def batches(self) -> AsyncIterator[Batch[Op]]:
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

    def _next(self) -> Batch[Op]:
        batch = self._batch
        if batch is None:
            batch = self._batch = Batch()
            self._wakeup.set()
        return batch
