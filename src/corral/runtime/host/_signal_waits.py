"""`RunWaits`: the durable signal waits of one run, as its activation sees them.

`run()` reaching a wait opens it in the store the first time this activation gets
there (the store keeps the deadline of the first time ever, so a restart never re-arms
it) and then waits until a `DELIVER` entry arrives or the deadline passes; the store
decides every transition (`persistence._waits`), this only remembers the answers.
A renamed wait is opened with its old names, so the store adopts and redirects what a
process on the old code delivers by them; a `DELIVER` entry journaled under an old name
(by a store before the rename reached it) wakes today's wait.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from corral._common import WaitStatus
from corral._errors import SignalTimeoutError
from corral.persistence import JournalEntry, WaitRecord, delivery_run

from ._residence import Residence, retrying

__all__ = ["RunWaits"]


class WaitingRun(Protocol):
    """The run whose `run()` waits: its id, and its wait re-checked after every entry."""

    @property
    def run_id(self) -> int: ...

    async def wait_until(self, predicate: Callable[[], object], timeout: float | None
                         ) -> bool: ...


class RunWaits:
    """What the store said of each wait of the activation's run, by name."""

    __slots__ = ("_home", "_run", "_seen")

    def __init__(self, home: Residence, run: WaitingRun) -> None:
        self._home = home
        self._run = run
        self._seen: dict[str, WaitRecord] = {}

    async def wait(self, name: str, timeout: float | None) -> str:
        """The delivered payload's JSON; `SignalTimeoutError` once it timed out (or its
        run ended)."""
        home, seen, run_id = self._home, self._seen, self._run.run_id
        store, fence, etype, key, clock = home.store, home.fence, home.entity_type, home.key, \
            home.clock
        if name not in seen:
            now = clock.time()
            declared = home.definition.wait(name)
            aliases = () if declared is None else declared.renamed_from
            self._learn(name, await retrying(home, run_id, "signal wait", lambda: store.open_wait(
                fence, etype, key, run_id, name,
                deadline=None if timeout is None else now + timeout, now=now,
                aliases=aliases)))
        while seen[name].status is WaitStatus.OPEN:
            deadline = seen[name].deadline
            remaining = None if deadline is None else deadline - clock.time()
            if remaining is not None and remaining <= 0:
                self._learn(name, await retrying(home, run_id, "signal wait",
                    lambda: store.expire_wait(fence, etype, key, run_id, name, now=clock.time())))
                break
            await self._run.wait_until(lambda: seen[name].status is not WaitStatus.OPEN,
                                       remaining)
        found = seen[name]
        if found.status.has_delivery and found.payload is not None:
            return found.payload
        why = "timed out" if found.status is WaitStatus.TIMED_OUT else "was closed"
        raise SignalTimeoutError(f"{etype} {key!r} run {run_id}: wait {name!r} {why}",
                                 entity_type=etype, key=key, run_id=run_id)

    def delivered(self, entry: JournalEntry) -> bool:
        """Take a `DELIVER` entry; whether it was for this run (continue-as-new may carry
        one into the next run, whose wait of that name it did not close)."""
        if delivery_run(entry.message_id) != self._run.run_id:
            return False
        declared = self._home.definition.wait(entry.name)  # an old name: today's wait
        name = entry.name if declared is None else declared.name
        self._seen[name] = WaitRecord(
            entry.entity_type, entry.key, entry.run_id, name, WaitStatus.DELIVERED,
            payload=entry.payload, sender=entry.sender, delivered_at=entry.accepted_at)
        return True

    def _learn(self, name: str, record: WaitRecord) -> None:
        """What the store answered, unless a delivery applied meanwhile is newer."""
        known = self._seen.get(name)
        if known is None or not known.status.has_delivery:
            self._seen[name] = record
