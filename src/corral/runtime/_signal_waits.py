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

from typing import TYPE_CHECKING

from corral._common import WaitStatus
from corral._errors import SignalTimeoutError
from corral.persistence import JournalEntry, WaitRecord, delivery_run

if TYPE_CHECKING:
    from ._activation import Activation

__all__ = ["RunWaits"]


class RunWaits:
    """What the store said of each wait of the activation's run, by name."""

    __slots__ = ("_act", "_seen")

    def __init__(self, act: Activation) -> None:
        self._act = act
        self._seen: dict[str, WaitRecord] = {}

    async def wait(self, name: str, timeout: float | None) -> str:
        """The delivered payload's JSON; `SignalTimeoutError` once it timed out (or its
        run ended)."""
        act, seen = self._act, self._seen
        store, fence = act.shard.store, act.shard.fence
        if name not in seen:
            now = act.now()
            declared = act.definition.wait(name)
            aliases = () if declared is None else declared.renamed_from
            self._learn(name, await act.retrying("signal wait", lambda: store.open_wait(
                fence, act.entity_type, act.key, act.run_id, name,
                deadline=None if timeout is None else now + timeout, now=now,
                aliases=aliases)))
        while seen[name].status is WaitStatus.OPEN:
            deadline = seen[name].deadline
            remaining = None if deadline is None else deadline - act.now()
            if remaining is not None and remaining <= 0:
                self._learn(name, await act.retrying("signal wait", lambda: store.expire_wait(
                    fence, act.entity_type, act.key, act.run_id, name, now=act.now())))
                break
            await act.wait_until(lambda: seen[name].status is not WaitStatus.OPEN, remaining)
        found = seen[name]
        if found.status.has_delivery and found.payload is not None:
            return found.payload
        why = "timed out" if found.status is WaitStatus.TIMED_OUT else "was closed"
        raise SignalTimeoutError(
            f"{act.entity_type} {act.key!r} run {act.run_id}: wait {name!r} {why}",
            entity_type=act.entity_type, key=act.key, run_id=act.run_id)

    def delivered(self, entry: JournalEntry) -> bool:
        """Take a `DELIVER` entry; whether it was for this run (continue-as-new may carry
        one into the next run, whose wait of that name it did not close)."""
        if delivery_run(entry.message_id) != self._act.run_id:
            return False
        declared = self._act.definition.wait(entry.name)  # an old name: today's wait
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
