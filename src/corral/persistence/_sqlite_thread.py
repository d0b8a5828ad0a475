"""`SqliteThread`: one `sqlite3` connection and the one thread every call on it runs in.

A group-commit batch is many statements; running the whole batch as one call in the
connection's thread costs one hop between the event loop and the thread per batch,
not per statement (see SQLITE_NOTES.md: each hop is ~60-100 us here). The store owns
the thread and the connection outright (no private hook of a wrapper library).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from corral._errors import StoreError

__all__ = ["SqliteThread"]

T = TypeVar("T")


class SqliteThread:
    """A `sqlite3` connection (autocommit: transactions are explicit) and its thread."""

    __slots__ = ("_db", "_executor")

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._db: sqlite3.Connection | None = None

    async def open(self, target: str) -> None:
        self._db = await asyncio.get_running_loop().run_in_executor(
            self._executor, lambda: sqlite3.connect(target, isolation_level=None,
                                                    check_same_thread=False))

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`fn(connection, *args)` in the connection's thread: one hop in all. Once the
        connection is closed, the `StoreError` every caller handles."""
        if self._db is None:
            raise StoreError("store is closed")
        try:
            return asyncio.get_running_loop().run_in_executor(self._executor, fn, self._db,
                                                              *args)
        except RuntimeError as err:  # the executor shut down between the check and here
            raise StoreError("store is closed") from err

    async def close(self) -> None:
        """Close the connection in its thread, then end the thread."""
        db, self._db = self._db, None
        if db is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, db.close)
        self._executor.shutdown(wait=False)
