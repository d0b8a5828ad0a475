"""The queue of one group commit, shared by both stores' writers.

Callers add ops while the writer commits the previous batch; the writer takes the whole
queue as one transaction and answers every op's future with its result, or with the
error that refused it (an exception *object*: each caller raises its own).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

__all__ = ["Batch"]

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
