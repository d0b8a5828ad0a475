"""`Activation`: one live entity inside its shard.

Lifecycle: wait for the predecessor activation (if any) to finish -> `__init__(start)`
-> replay the run's journal -> start `run()` -> apply each new journal entry in `seq`
order. Entries that arrive before the replay finished wait in the queue: no handler
ever runs before `__init__` and the replay are done (handler-safe order).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from corral.actors import Entity, EntityDefinition, EntityTerminatedError, LeaseLostError, RunStatus
from corral.persistence import EntryKind, JournalEntry, RunRecord

from ._apply import apply_entry, instantiate
from ._results import decode_value, encode_value

if TYPE_CHECKING:
    from ._shard import Shard

__all__ = ["Activation"]

log = logging.getLogger("corral.activation")


class Activation:
    """Hosts one entity: its instance, its ordered inbox of journal entries, its `run()`."""

    def __init__(self, shard: Shard, definition: EntityDefinition, key: str,
                 previous: Activation | None = None) -> None:
        self._shard = shard
        self.definition = definition
        self._key = key
        self._previous = previous
        self._run_id = 0
        self.applied_seq = 0
        self.entity: Entity | None = None
        self.ready = asyncio.Event()       # __init__ and replay done
        self.finished = asyncio.Event()    # evicted, closed or stale
        self.closed = False
        self._evicted = False
        self._inbox: deque[JournalEntry] = deque()
        self._inbox_ready = asyncio.Event()
        self._changed = asyncio.Event()
        self._main: asyncio.Task[None] = asyncio.create_task(
            self._live(), name=f"corral:{definition.name}:{key}"
        )
        self._run_task: asyncio.Task[None] | None = None

    # -- EntityContext ---------------------------------------------------------------

    @property
    def entity_type(self) -> str:
        return self.definition.name

    @property
    def key(self) -> str:
        return self._key

    @property
    def run_id(self) -> int:
        return self._run_id

    async def wait_for(self, predicate: Callable[[], object], timeout: float | None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not predicate():
            changed = self._changed
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return bool(predicate())
        return True

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- feeding -----------------------------------------------------------------------

    def deliver(self, entry: JournalEntry) -> None:
        """Queue an entry; duplicates and stale entries are dropped when applied."""
        self._inbox.append(entry)
        self._inbox_ready.set()

    @property
    def mailbox_depth(self) -> int:
        return len(self.entity.mailbox) if self.entity is not None else 0

    async def stop(self) -> None:
        """Evict without writing anything (lease lost, host closing)."""
        self._evicted = True
        for task in (self._run_task, self._main):
            if task is not None:
                task.cancel()
        await asyncio.gather(self._main, return_exceptions=True)

    # -- the loop ------------------------------------------------------------------------

    async def _live(self) -> None:
        try:
            if self._previous is not None:
                await self._previous.finished.wait()
                self._previous = None
            run = await self._shard.store.latest_run(self.entity_type, self.key)
            if run is None or run[0].status is not RunStatus.RUNNING:
                self._run_id = run[0].run_id if run else 0
                return  # closed or terminated before we got here: nothing to host
            await self._build(run[0])
            await self._replay()
            self.ready.set()
            self._run_task = asyncio.create_task(
                self._run_main(), name=f"{self._main.get_name()}:run"
            )
            await self._apply_forever()
        except asyncio.CancelledError:
            raise
        except LeaseLostError:
            log.warning("%s %r: shard lease lost; evicting", self.entity_type, self.key)
        except Exception:
            log.exception("%s %r: activation failed; evicting", self.entity_type, self.key)
        finally:
            if self._run_task is not None and not self._run_task.done():
                self._run_task.cancel()
            self.finished.set()
            self._shard.forget(self)
            if not self._evicted:  # entries of a newer run go to that run's activation
                for entry in self._inbox:
                    if entry.run_id > self._run_id:
                        self._shard.deliver(entry)

    async def _build(self, run: RunRecord) -> None:
        self._run_id = run.run_id
        self.entity = instantiate(self.definition, run.start_input, self)

    async def _replay(self) -> None:
        entries = await self._shard.store.journal(
            self.entity_type, self.key, run_id=self._run_id, after_seq=self.applied_seq
        )
        for entry in entries:
            await self._apply(entry, replaying=True)

    async def _apply_forever(self) -> None:
        while True:
            await self._inbox_ready.wait()
            self._inbox_ready.clear()
            while self._inbox:
                entry = self._inbox.popleft()
                if entry.run_id > self._run_id:
                    self._shard.deliver_to_successor(self, entry)
                    continue
                if entry.run_id < self._run_id or entry.seq <= self.applied_seq:
                    continue
                if entry.seq > self.applied_seq + 1:
                    await self._replay()  # fill the gap from the store, in order
                    continue
                await self._apply(entry, replaying=False)
                if self.closed:
                    return

    async def _apply(self, entry: JournalEntry, *, replaying: bool) -> None:
        if entry.kind is EntryKind.TERMINATE:
            self.applied_seq = entry.seq
            await self._terminated(entry.payload)
            return
        assert self.entity is not None
        outcome = await apply_entry(self.definition, self.entity, entry)
        self.applied_seq = entry.seq
        self.notify()
        if outcome is not None:
            await self._shard.record_update(self, entry, outcome, replaying=replaying)

    async def _run_main(self) -> None:
        assert self.entity is not None
        result: str | None = None
        error: str | None = None
        try:
            value = await self.entity.run()
            status = RunStatus.COMPLETED
            result = encode_value(value)
        except asyncio.CancelledError:
            raise
        except Exception:
            status = RunStatus.FAILED
            error = traceback.format_exc()
            log.warning("%s %r: run() failed:\n%s", self.entity_type, self.key, error)
        await self._close(status, result, error)

    async def _close(self, status: RunStatus, result: str | None, error: str | None) -> None:
        """Close the run once every message accepted before the close is applied."""
        while not await self._shard.close_run(self, status, result, error):
            # Messages were accepted meanwhile: let the apply loop take them, then retry.
            late = await self._shard.store.journal(
                self.entity_type, self.key, run_id=self._run_id, after_seq=self.applied_seq
            )
            for entry in late:
                self.deliver(entry)
            if late:
                await self._wait_applied(late[-1].seq)
            if self.closed:  # terminated while we waited
                return
        self.closed = True
        self._shard.fail_waiters(self, EntityTerminatedError(
            f"{self.entity_type} {self.key!r}: run {self._run_id} closed as {status.value}"))
        self._main.cancel()

    async def _wait_applied(self, seq: int) -> None:
        await self.wait_for(lambda: self.applied_seq >= seq or self.closed, None)

    async def _terminated(self, reason: str) -> None:
        self.closed = True
        if self._run_task is not None:
            self._run_task.cancel()
        self._shard.fail_waiters(self, EntityTerminatedError(
            f"{self.entity_type} {self.key!r} terminated: {decode_value(reason, str)}"))
