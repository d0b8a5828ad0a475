"""`HostSession`: the one connection of a `PostgresStore` that is not pooled, because
what it does is session state: LISTEN for other processes' commits, and hold a
session-level advisory lock per shard this store leases.

Commits: every accepting transaction sends `NOTIFY corral_journal, '<store token>
<shards>'` before it commits; PostgreSQL delivers it only once that transaction
committed (and is visible), so a host that hears it and then tails the journal finds
the entries. While the session is down, notifications may be missed: `seen()` then
answers True every `_DEGRADED` seconds (the host polls) until it is back. Even while it
is up, `seen()` answers True at least every `fallback` seconds and checks that the
connection is alive: the safety net for a notification lost on a silently dead link.

Shard locks play the part of the SQLite store's OS file locks (`_locks`): the server
drops a session's advisory locks the moment its connection ends, which for a killed
process is at once, so a store that obtains a shard's lock knows no live session holds
it and may take the lease at a new epoch without waiting for it to expire. Epoch
fencing stays the safety net: a session lost to a network fault while its process
lives lets the shard be taken over, and that process is then fenced out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import asyncpg  # type: ignore[import-untyped, import-not-found, unused-ignore]

from corral._deadline import Expired, within

from ._pg_schema import NOTIFY_CHANNEL

__all__ = ["HostSession", "PolledSession"]

log = logging.getLogger("corral.store.postgres")
_DEGRADED = 0.05  # poll this often while the session is reconnecting
_LOCK_SPACE = 0x636F7272  # "corr": the first key of every shard's advisory lock


class HostSession:
    """Tracks foreign commits for the shards in `held`, and holds the shards' locks.

    `held` is the store's live set of shards being acquired or held; while it is empty,
    every foreign commit counts.

    Attributes:
        received: notifications received so far (this store's own included).
    """

    def __init__(self, url: str, token: str, held: set[int], *, timeout: float,
                 fallback: float) -> None:
        self._url = url
        self._token = token
        self._held = held
        self._timeout = timeout
        self._fallback = fallback
        self._conn: Any = None
        self._busy = asyncio.Lock()  # one query at a time on the session
        self._locked: set[int] = set()  # shards whose advisory lock this session holds
        self._hit = False
        self._heard = asyncio.Event()  # set with _hit: a waiting tail wakes at once
        self._last = time.monotonic()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closed = False
        self.received = 0

    async def open(self) -> None:
        """Connect and LISTEN; raises the driver's error if the server cannot be reached."""
        conn = await asyncpg.connect(self._url, timeout=self._timeout,
                                     command_timeout=self._timeout,
                                     server_settings={"application_name": "corral-session"})
        try:
            await conn.add_listener(NOTIFY_CHANNEL, self._on_notify)
        except BaseException:
            conn.terminate()
            raise
        conn.add_termination_listener(self._on_lost)
        self._conn = conn

    # -- commits ------------------------------------------------------------------

    async def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a foreign commit; then answer as `seen`.
        A cancellation is never lost (`within`): a host closing cancels its journal
        tail here, and awaits it."""
        if not self._hit and self._up():
            with contextlib.suppress(Expired):
                await within(self._heard.wait(), timeout)
        elif not self._hit:
            await asyncio.sleep(timeout)  # reconnecting: `seen` polls meanwhile
        self._heard.clear()
        return self.seen()

    def seen(self) -> bool:
        """Whether to tail now: a foreign commit was heard (or may have been missed)."""
        now = time.monotonic()
        if not self._up():
            self._spawn("reconnect", self._reconnect)
            if now - self._last >= _DEGRADED:
                self._last = now
                return True
            return False
        hit, self._hit = self._hit, False
        if now - self._last >= self._fallback:
            hit = True
            self._spawn("probe", self._probe)
        if hit:
            self._last = now
        return hit

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        self.received += 1
        token, _, shards = payload.partition(" ")
        if token == self._token:
            return  # our own commit: this process delivered those entries itself
        if shards == "*" or not self._held:
            self._hit = True
            self._heard.set()
            return
        with contextlib.suppress(ValueError):
            if not self._held.isdisjoint(int(s) for s in shards.split(",") if s):
                self._hit = True
                self._heard.set()

    # -- shard locks ----------------------------------------------------------------

    @property
    def locked(self) -> frozenset[int]:
        """The shards whose advisory lock this session holds."""
        return frozenset(self._locked)

    async def try_lock(self, shards: Iterable[int]) -> frozenset[int]:
        """Take the advisory locks of `shards` that no live session holds (never waits);
        returns those of `shards` whose lock this session holds now (none while the
        session is down: then leases are taken on expiry only)."""
        wanted = sorted(set(shards) - self._locked)
        if wanted and self._up():
            rows = await self._query(
                "SELECT s, pg_try_advisory_lock($1, s) FROM unnest($2::int[]) AS s",
                _LOCK_SPACE, wanted)
            self._locked.update(r[0] for r in rows or () if r[1])
        return frozenset(s for s in shards if s in self._locked)

    async def unlock(self, shards: Iterable[int]) -> None:
        gone = sorted(set(shards) & self._locked)
        self._locked.difference_update(gone)
        if gone and self._up():
            await self._query("SELECT pg_advisory_unlock($1, s) FROM unnest($2::int[]) AS s",
                              _LOCK_SPACE, gone)

    async def _query(self, sql: str, *args: Any) -> list[Any] | None:
        """One statement on the session; None (and the session dropped) if it failed."""
        conn = self._conn
        try:
            async with self._busy:
                return list(await conn.fetch(sql, *args, timeout=self._timeout))
        except Exception as err:
            log.warning("store session failed: %s: %s", type(err).__name__, err)
            if self._conn is conn and conn is not None and not conn.is_closed():
                conn.terminate()
            return None

    # -- the connection -------------------------------------------------------------

    def _up(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    def _on_lost(self, conn: Any) -> None:
        if not self._closed:
            log.warning("store session lost; polling until it is back")

    def _spawn(self, name: str, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        task = self._tasks.get(name)
        if self._closed or (task is not None and not task.done()):
            return
        self._tasks[name] = asyncio.get_running_loop().create_task(fn(), name=f"corral-{name}")

    async def _reconnect(self) -> None:
        old, self._conn = self._conn, None
        if old is not None and not old.is_closed():
            old.terminate()
        relock, self._locked = set(self._locked), set()  # the server dropped them
        try:
            await self.open()
        except Exception as err:  # still down: the next seen() tries again
            log.warning("store session cannot reconnect: %s: %s", type(err).__name__, err)
            return
        self._hit = True  # whatever was notified while it was down
        await self.try_lock(relock)  # a lock taken by another store meanwhile stays theirs

    async def _probe(self) -> None:
        if self._up():
            await self._query("SELECT 1")

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await asyncio.wait_for(conn.close(), self._timeout)
            except Exception:
                conn.terminate()


class PolledSession:
    """`HostSession`'s stand-in behind a pooler in transaction mode (PgBouncer), where
    a session is not the client's: no LISTEN (other processes' commits are seen by
    polling every `fallback` seconds) and no advisory locks (a dead holder's shards are
    taken when its leases expire). Holds no connection."""

    received = 0  # notifications: none ever arrive

    def __init__(self, *, fallback: float) -> None:
        self._fallback = fallback
        self._last = time.monotonic()

    async def open(self) -> None:
        """Nothing to open."""

    @property
    def locked(self) -> frozenset[int]:
        return frozenset()

    async def try_lock(self, shards: Iterable[int]) -> frozenset[int]:
        return frozenset()

    async def unlock(self, shards: Iterable[int]) -> None:
        """Nothing is locked."""

    async def wait(self, timeout: float) -> bool:
        """Sleep until the next poll is due (at most `timeout`); then answer as `seen`."""
        due = self._last + self._fallback - time.monotonic()
        await asyncio.sleep(max(0.0, min(timeout, due)))
        return self.seen()

    def seen(self) -> bool:
        """Whether a poll is due (one every `fallback` seconds)."""
        now = time.monotonic()
        if now - self._last < self._fallback:
            return False
        self._last = now
        return True

    async def close(self) -> None:
        """Nothing to close."""
