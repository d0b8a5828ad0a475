"""`Vacuum`: a `PostgresStore` reclaims the journal and dedupe rows its snapshots delete.

A snapshot deletes the journal entries it covers and the message ids that left the
dedupe window (`_pg_txn._TRIM`). In PostgreSQL a deleted row stays on its page until a
vacuum removes it, and so do its index entries, which the next trim's index scans walk
again: until then the tables grow with every signal ever accepted, and so does the work
per trim. Autovacuum visits a database once per `autovacuum_naptime` (a server-wide
setting, one minute by default): one hot entity accepts a million signals in that time.
The store therefore vacuums the tables its trims deleted from itself, in the background
on a pooled connection, once they deleted `every` rows since its last vacuum (or
`share` of the tables' rows, whichever is more: a vacuum reads every index page of the
table, so on a large store it runs in proportion to its size, as autovacuum's scale
factor does); the space is reused by the next inserts, and the store's size is bounded
by the snapshot policy, as with SQLite. The tables' own storage parameters (schema 15,
`_tables`) make autovacuum visit them on the same terms whenever it wakes.

A vacuum never holds up a commit: at most one runs per store, `SKIP_LOCKED` skips a
table another session is vacuuming, and a failed one (the store's `timeout` applies, as
to any statement: no session setting is changed, so this holds behind PgBouncer in
transaction mode too) is logged and left to the next. A role that does not own the
tables vacuums nothing (the server only warns); autovacuum then does it on its terms.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ._pg_pool import SharedPool

__all__ = ["Vacuum"]

log = logging.getLogger("corral.store.postgres")

TRIMMED = ("journal", "dedupe", "snapshots")  # the tables a snapshot's trim deletes from
_VACUUM = f"VACUUM (SKIP_LOCKED) {', '.join(TRIMMED)}"
_ROWS = "SELECT sum(greatest(reltuples, 0))::float8 FROM pg_class WHERE oid = ANY($1::regclass[])"


class Vacuum:
    """Vacuums `TRIMMED` on a connection of `pool` once enough rows were deleted."""

    def __init__(self, pool: SharedPool, *, timeout: float, every: int = 10_000,
                 share: float = 0.02) -> None:
        self._pool = pool
        self._timeout = timeout
        self._every = every
        self._share = share
        self._deleted = 0  # rows deleted by this store's trims since its last vacuum
        self._task: asyncio.Task[None] | None = None

    def note(self, deleted: int) -> None:
        """A committed transaction's trims deleted `deleted` rows: vacuum if due."""
        self._deleted += deleted
        if self._deleted >= self._every and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            conn = await self._pool.acquire()
            try:
                rows = await conn.fetchval(_ROWS, list(TRIMMED), timeout=self._timeout) or 0.0
                if self._deleted < self._share * rows:
                    return  # not yet: a share of a large table, as autovacuum would
                self._deleted = 0  # what is deleted from now on waits for the next one
                await conn.execute(_VACUUM, timeout=self._timeout)
            finally:
                with contextlib.suppress(Exception):  # not reusable: `release` ended it
                    await self._pool.release(conn)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the next trims try again
            log.warning("vacuum of %s failed: %s: %s", ", ".join(TRIMMED),
                        type(err).__name__, err)

    async def close(self) -> None:
        """Stop a vacuum in progress (the server rolls it back; nothing is lost)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
