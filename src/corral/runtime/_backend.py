"""Backends: where the entity-facing operations of a `Runtime` are carried out.

`EntityRef` validates at the boundary and then talks to a `Backend` in plain records
and JSON text, so the same calls can cross a process boundary (the Ray backend).
`LocalBackend` serves them from this process: the store plus the shards this process
hosts (if any).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import corral.metrics as metrics
from corral._common import RunStatus, WaitStatus
from corral._errors import (
    EntityFailedError,
    EntityNotRunningError,
    EntityTerminatedError,
)
from corral.actors import EntityDefinition
from corral.persistence import (
    Acceptance,
    AcceptResult,
    DeadLetter,
    DeliveryRequest,
    DeliveryResult,
    EntityRecord,
    EntryKind,
    RunRecord,
    Store,
    UpdateOutcome,
    WaitPosition,
    WaitRecord,
)

from ._activation import Activation
from ._apply import ReplicaContext, Unappliable, apply_entry, run_query
from ._clock import Clock, SystemClock
from ._events import lifecycle
from ._host import LocalHost
from ._results import EntityDescription, EntitySummary, RunSummary, SignalWaitInfo
from ._shard import Shard, ShardStopped
from ._snapshot import rebuild

__all__ = ["Backend", "LocalBackend", "ShardOf"]

ShardOf = Callable[[str, str], int]


class Backend(Protocol):
    """The operations behind `EntityRef`, after validation and authorization."""

    calls_once: bool
    """Each call reaches the store at most once (never retried with the same arguments),
    so an id the ref made for its call is new to the store (`Acceptance.fresh_id`)."""

    async def accept(self, acc: Acceptance) -> AcceptResult:
        """Accept durably (start/dedupe/append in one transaction) and hand to the host."""
        ...

    async def wait_update(self, etype: str, key: str, message_id: str) -> UpdateOutcome:
        """Wait until the update `message_id` is applied; its recorded outcome."""
        ...

    async def deliver(self, req: DeliveryRequest) -> DeliveryResult:
        """Decide and record a delivery to a signal wait; wake the waiting run's host."""
        ...

    async def signal_waits(self, etype: str | None, limit: int, after: WaitPosition | None
                           ) -> list[WaitRecord]:
        """Open signal waits, oldest first, after position `after`."""
        ...

    async def entities(self, etype: str | None, status: RunStatus | None, limit: int,
                       after: tuple[str, str] | None) -> list[EntitySummary]:
        """Entities in (type, key) order after `after`, with what the answering process
        knows live of those it hosts."""
        ...

    async def query(self, etype: str, key: str, name: str, payload: str | None, *,
                    activate: bool = False) -> str:
        """Run a query handler; JSON of its result. `activate` brings a passivated
        entity back into memory instead of answering from its latest snapshot."""
        ...

    async def describe(self, etype: str, key: str) -> EntityDescription: ...

    async def latest_run(self, etype: str, key: str) -> RunRecord | None: ...

    async def dead_letters(self, etype: str | None, key: str | None, limit: int, after: int
                           ) -> list[DeadLetter]:
        """Dead letters with an id above `after`, oldest first, optionally of one entity
        type and/or key."""
        ...

    async def replay_dead_letter(self, etype: str, key: str, dead_letter_id: int
                                 ) -> AcceptResult:
        """Accept the dead letter's payload again as a new signal of the running run and
        delete the dead letter (one transaction), then hand the entry to its host."""
        ...

    async def discard_dead_letter(self, etype: str, key: str, dead_letter_id: int) -> bool:
        """Delete a dead letter; whether it existed."""
        ...

    async def close(self) -> None: ...


class LocalBackend:
    """Serves `EntityRef` calls from this process's store and hosted shards."""

    calls_once = True

    def __init__(self, store: Store, definitions: Mapping[str, EntityDefinition],
                 host: LocalHost | None, shard_of: ShardOf, clock: Clock | None = None) -> None:
        self.store = store
        self.host = host
        self._clock: Clock = clock or SystemClock()
        self._definitions = definitions
        self._shard_of = shard_of

    async def close(self) -> None:
        if self.host is not None:
            await self.host.close()

    def _shard(self, etype: str, key: str) -> Shard | None:
        return self.host.shard(self._shard_of(etype, key)) if self.host else None

    async def accept(self, acc: Acceptance) -> AcceptResult:
        began = time.perf_counter()
        result = await self.store.accept(acc)
        self._accepted(acc, result, time.perf_counter() - began)
        return result

    async def accept_many(self, accs: Sequence[Acceptance]) -> list[AcceptResult | Exception]:
        """`accept` for each, in one group commit (no task per acceptance): each one's
        result, or the error refusing it."""
        began = time.perf_counter()
        results = await self.store.accept_many(accs)
        seconds = time.perf_counter() - began
        for acc, result in zip(accs, results, strict=True):
            if not isinstance(result, Exception):
                self._accepted(acc, result, seconds)
        return results

    def _accepted(self, acc: Acceptance, result: AcceptResult, seconds: float) -> None:
        """Count a committed acceptance and hand its entry to this process's shard."""
        kind = acc.kind._value_  # `.value` is a Python-level property: ~0.3 us a read
        if result.duplicate:
            metrics.duplicate(acc.entity_type, kind)
        else:
            metrics.accepted(acc.entity_type, kind, seconds)
        if result.started:
            lifecycle("run started", acc.entity_type, acc.key, result.entry.run_id,
                      by=acc.kind.value)
        shard = self.host.shard(acc.shard) if self.host else None  # routed by the ref
        if shard is not None and result.started:
            shard.enqueue_started(result.entry, acc.start)
        elif shard is not None and not result.duplicate:
            shard.enqueue(result.entry)  # the fast path; other hosts tail the journal

    async def deliver(self, req: DeliveryRequest) -> DeliveryResult:
        began = time.perf_counter()
        result = await self.store.deliver(req)
        if result.status in ("delivered", "buffered"):
            metrics.accepted(req.entity_type, "deliver", time.perf_counter() - began)
        elif result.status == "duplicate":
            metrics.duplicate(req.entity_type, "deliver")
        shard = self.host.shard(req.shard) if self.host else None
        if shard is not None and result.entry is not None:
            shard.enqueue(result.entry)  # the fast path; other hosts tail the journal
        return result

    async def signal_waits(self, etype: str | None, limit: int, after: WaitPosition | None
                           ) -> list[WaitRecord]:
        return await self.store.signal_waits(etype, limit=limit, after=after)

    async def entities(self, etype: str | None, status: RunStatus | None, limit: int,
                       after: tuple[str, str] | None) -> list[EntitySummary]:
        rows = await self.store.entities(etype, status, limit=limit, after=after)
        return [self._summary(r) for r in rows]

    def _summary(self, r: EntityRecord) -> EntitySummary:
        live = self._live(r.entity_type, r.key, r.run_id)
        passivated = r.status is RunStatus.RUNNING and r.passivated_seq is not None \
            and live is None
        return EntitySummary(
            r.entity_type, r.key, r.shard, r.status, r.run_id, r.accepted_seq,
            live.applied_seq if live else (r.passivated_seq if passivated else None),
            live.mailbox_depth if live else None, passivated, r.updated_at, r.suspended)

    def _live(self, etype: str, key: str, run_id: int) -> Activation | None:
        """This process's ready activation of the entity's run `run_id`, if any."""
        shard = self._shard(etype, key)
        act = shard.get(etype, key) if shard else None
        return act if act is not None and act.is_ready and act.run_id == run_id else None

    async def wait_update(self, etype: str, key: str, message_id: str) -> UpdateOutcome:
        shard = self._shard(etype, key)
        local = shard.wait_update(etype, key, message_id) if shard else None
        delay, polls = 0.002, 0
        try:
            while True:
                recorded = await self.store.update_outcome(etype, key, message_id)
                if recorded is not None:
                    return recorded
                if polls:  # not on the hot path: a hosting shard fails `local` itself
                    await self._refuse_if_closed(etype, key, message_id)
                polls += 1
                if local is not None:
                    try:
                        return await asyncio.wait_for(asyncio.shield(local), 0.5)
                    except asyncio.TimeoutError:
                        pass
                    except ShardStopped:
                        # Lease lost or host closing: the next owner applies the update
                        # and records it; poll the store for it. (Never a cancellation
                        # swallowed: a cancelled caller stays cancelled.)
                        local = None
                else:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.1)
        finally:
            if local is not None:
                if local.done() and not local.cancelled():
                    local.exception()  # retrieved: no "never retrieved" log
                local.cancel()

    async def _refuse_if_closed(self, etype: str, key: str, message_id: str) -> None:
        """An update whose run closed before applying it (terminated, or failed because
        it could not activate) will never have an outcome: say so instead of waiting."""
        found = await self.store.latest_run(etype, key)
        if found is None or found[0].status is RunStatus.RUNNING:
            return
        if await self.store.update_outcome(etype, key, message_id) is not None:
            return  # recorded just before the close: the next poll returns it
        run = found[0]
        closed = f"{etype} {key!r}: run {run.run_id} is {run.status.value}"
        fields: dict[str, Any] = {"entity_type": etype, "key": key, "run_id": run.run_id,
                                  "message_id": message_id}
        if run.status is RunStatus.FAILED:
            raise EntityFailedError(f"{closed}; update {message_id!r} was not applied:\n"
                                    f"{run.error}", **fields)
        raise EntityTerminatedError(f"{closed}; update {message_id!r} was not applied",
                                    **fields)

    async def query(self, etype: str, key: str, name: str, payload: str | None, *,
                    activate: bool = False) -> str:
        """Answered by the live activation when this process hosts the entity, once
        everything accepted before the query is applied (read-your-writes); otherwise
        by a read-only replica rebuilt from the store (latest snapshot + journal)."""
        definition = self._definitions[etype]
        shard = self._shard(etype, key)
        for _ in range(3):  # an activation may finish meanwhile (continue-as-new): its next
            act = shard.get(etype, key) if shard else None
            if act is None and activate and shard is not None:
                act = shard.activate(etype, key)
            if act is None:
                break
            act.touch()
            found = await self.store.latest_run(etype, key)
            await act.wait_settled()
            if found is not None and act.is_ready:
                await act.wait_applied(found[1] - 1)
            if act.is_ready and act.entity is not None:
                return run_query(definition, act.entity, name, payload)
        return await self._replica_query(definition, key, name, payload)

    async def _replica_query(self, definition: EntityDefinition, key: str, name: str,
                             payload: str | None) -> str:
        etype = definition.name
        found = await self.store.latest_run(etype, key)
        if found is None:
            raise EntityNotRunningError(f"{etype} {key!r} was never started",
                                        entity_type=etype, key=key)
        run = found[0]
        context = ReplicaContext(etype, key, run.run_id)
        entity, after = await rebuild(self.store, definition, run, context)
        for entry in await self.store.journal(etype, key, run_id=run.run_id, after_seq=after):
            if entry.kind in (EntryKind.SIGNAL, EntryKind.UPDATE):
                try:
                    await apply_entry(definition, entity, entry)
                except Unappliable:  # the live host dead-letters it; a replica only reads
                    continue
        return run_query(definition, entity, name, payload)

    async def describe(self, etype: str, key: str) -> EntityDescription:
        found = await self.store.latest_run(etype, key)
        if found is None:
            return EntityDescription(etype, key, self._shard_of(etype, key),
                                     RunStatus.NEVER_STARTED, 0, 0, None, None, False, ())
        run, next_seq = found
        live = self._live(etype, key, run.run_id)
        runs = tuple(RunSummary(r.run_id, r.status, r.started_at, r.closed_at, r.error,
                                r.continued_from)
                     for r in await self.store.runs(etype, key))
        more = await self.store.entity_details(etype, key, run.run_id)
        return EntityDescription(
            etype, key, self._shard_of(etype, key), run.status, run.run_id, next_seq - 1,
            live.applied_seq if live else None, live.mailbox_depth if live else None,
            live is not None, runs, snapshot_seq=more.snapshot_seq,
            snapshot_age=None if more.snapshot_at is None
            else max(0.0, self._clock.time() - more.snapshot_at),
            timers=more.timers,
            open_waits=tuple(SignalWaitInfo.of(w) for w in more.waits
                             if w.status is WaitStatus.OPEN),
            dead_letters=more.dead_letters,
            suspension=more.suspension if run.status is RunStatus.RUNNING else None,
        )

    async def latest_run(self, etype: str, key: str) -> RunRecord | None:
        found = await self.store.latest_run(etype, key)
        return None if found is None else found[0]

    async def dead_letters(self, etype: str | None, key: str | None, limit: int, after: int
                           ) -> list[DeadLetter]:
        return await self.store.dead_letters(etype, key, limit=limit, after=after)

    async def replay_dead_letter(self, etype: str, key: str, dead_letter_id: int
                                 ) -> AcceptResult:
        result = await self.store.replay_dead_letter(
            etype, key, self._shard_of(etype, key), dead_letter_id, accepted_at=self._clock.time()
        )
        shard = self._shard(etype, key)
        if shard is not None and not result.duplicate:
            shard.enqueue(result.entry)  # other hosts tail the journal
        return result

    async def discard_dead_letter(self, etype: str, key: str, dead_letter_id: int) -> bool:
        return await self.store.discard_dead_letter(etype, key, dead_letter_id)
