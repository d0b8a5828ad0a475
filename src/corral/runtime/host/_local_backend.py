"""The local backend: a `Runtime`'s requests served from this process.

`EntityRef` and `Runtime` validate at the boundary, then hand their backend one request
record per call (`client._requests`; an `Acceptance` for a send) through
`Backend.handle(request)` (the seam, `client._backend`). `LocalBackend` serves them
from this process, by the method named after the record's kind: the store plus the
shards this process hosts (if any). It is also what a Ray shard actor runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from prometheus_client.core import Metric

import corral.metrics as metrics
from corral._common import RunStatus, WaitStatus
from corral._errors import (
    EntityFailedError,
    EntityNotRunningError,
    EntityTerminatedError,
    StoreUnavailableError,
)
from corral.actors import EntityDefinition
from corral.persistence import (
    Acceptance,
    AcceptResult,
    Census,
    DeadLetter,
    DeliveryRequest,
    DeliveryResult,
    EntityRecord,
    EntryKind,
    Fired,
    Progress,
    RunRecord,
    Store,
    UnreadableRow,
    UpdateOutcome,
    WaitRecord,
)

from .._clock import Clock, SystemClock
from ..client._inspection import EntityHistory, EntityState, read_history, read_state
from ..client._requests import (
    SCHEDULE_METHODS,
    AcceptBatch,
    DeadLetters,
    Describe,
    DiscardDeadLetter,
    Entities,
    History,
    LatestRun,
    Query,
    ReplayDeadLetter,
    ScheduleCall,
    SignalBatch,
    SignalWaits,
    State,
    TakeCensus,
    WaitUpdate,
)
from ..client._results import EntityDescription, EntitySummary, RunSummary, SignalWaitInfo
from ._activation import Activation
from ._apply import ReplicaContext, Unappliable, apply_entry, run_query
from ._events import lifecycle
from ._host import LocalHost
from ._shard import Shard, ShardStopped
from ._snapshot import decode, rebuild

__all__ = ["LocalBackend", "ShardOf"]

ShardOf = Callable[[str, str], int]


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
        # Dispatch by kind: each record to the method named after it, in the order of a
        # message's life (accept, deliver, wait, read, operate).
        self._by_kind: dict[type, Callable[[Any], Awaitable[Any]]] = {
            Acceptance: self.accept, AcceptBatch: self.accept_batch,
            SignalBatch: self.signal_batch,
            DeliveryRequest: self.deliver, WaitUpdate: self.wait_update, Query: self.query,
            Describe: self.describe, History: self.history, State: self.state,
            LatestRun: self.latest_run, Entities: self.entities,
            SignalWaits: self.signal_waits, DeadLetters: self.dead_letters,
            ReplayDeadLetter: self.replay_dead_letter,
            DiscardDeadLetter: self.discard_dead_letter, TakeCensus: self.census,
            ScheduleCall: self.schedule_call,
        }

    def handle(self, request: Any) -> Awaitable[Any]:
        """`request` by the method named after its kind (no frame of its own: every send
        comes through here)."""
        try:
            return self._by_kind[type(request)](request)
        except KeyError:
            raise TypeError(f"not a backend request: {request!r}") from None

    async def host_metrics(self) -> list[Metric]:
        """None: a process that hosts counts into its own `corral.metrics.REGISTRY`."""
        return []

    async def close(self) -> None:
        if self.host is not None:
            await self.host.close()

    def _shard(self, etype: str, key: str) -> Shard | None:
        return self.host.shard(self._shard_of(etype, key)) if self.host else None

    def _with_applied(self, acc: Acceptance) -> Acceptance:
        """`acc` carrying the applied seq of this process's activation of its entity, if
        it hosts one (a bounded type's backlog is counted from it, `Entity.max_backlog`)."""
        shard = self.host.shard(acc.shard) if self.host else None
        applied = shard.applied_seq(acc.entity_type, acc.key) if shard else None
        return acc if applied is None else acc._replace(applied=applied)

    def _with_applied_all(self, accs: Sequence[Acceptance]) -> list[Acceptance]:
        return [self._with_applied(acc) if acc.max_backlog is not None else acc
                for acc in accs]

    async def accept(self, acc: Acceptance) -> AcceptResult:
        began = time.perf_counter()
        if acc.max_backlog is not None:
            acc = self._with_applied(acc)
        result = await self.store.accept(acc)
        self._accepted(acc, result, time.perf_counter() - began)
        return result

    def accept_batch(self, op: AcceptBatch) -> Awaitable[Sequence[AcceptResult | Exception]]:
        return self.accept_all(op.accs) if op.atomic else self.accept_many(op.accs)

    def signal_batch(self, op: SignalBatch) -> Awaitable[list[AcceptResult]]:
        return self.accept_all(op.accs)

    async def accept_all(self, accs: Sequence[Acceptance]) -> list[AcceptResult]:
        """Every acceptance or none, in one transaction (`Store.accept_all`); each one's
        result. Raises `BatchRefusedError` (nothing stored)."""
        began = time.perf_counter()
        results = await self.store.accept_all(self._with_applied_all(accs))
        self._to_shards(accs, results, time.perf_counter() - began)
        return results

    async def accept_many(self, accs: Sequence[Acceptance]) -> list[AcceptResult | Exception]:
        """`accept` for each, in one group commit (no task per acceptance): each one's
        result, or the error refusing it."""
        began = time.perf_counter()
        accs = self._with_applied_all(accs)
        results = await self.store.accept_many(accs)
        self._to_shards(accs, results, time.perf_counter() - began)
        return results

    def _to_shards(self, accs: Sequence[Acceptance],
                   results: Sequence[AcceptResult | Exception], seconds: float) -> None:
        """`_accepted` for a batch's committed acceptances, counted once per kind."""
        counted: dict[tuple[str, str, bool], int] = {}  # one count per kind, not per message
        for acc, result in zip(accs, results, strict=True):
            if isinstance(result, Exception):
                continue
            if result.dead_letter_id is not None:
                metrics.dead_lettered(acc.entity_type)
            else:
                self._to_shard(acc, result)
                # `.value` is a Python-level property: ~0.3 us a read
                group = (acc.entity_type, acc.kind._value_, result.duplicate)
                counted[group] = counted.get(group, 0) + 1
        for (etype, kind, duplicate), count in counted.items():
            if duplicate:
                metrics.duplicate(etype, kind, count)
            else:
                metrics.accepted(etype, kind, seconds, count)

    def _accepted(self, acc: Acceptance, result: AcceptResult, seconds: float) -> None:
        """Count a committed acceptance and give its entry to this process's shard."""
        if result.duplicate:
            metrics.duplicate(acc.entity_type, acc.kind._value_)
        elif result.dead_letter_id is not None:
            metrics.dead_lettered(acc.entity_type)
            return
        else:
            metrics.accepted(acc.entity_type, acc.kind._value_, seconds)
        self._to_shard(acc, result)

    def _to_shard(self, acc: Acceptance, result: AcceptResult) -> None:
        """Give a committed acceptance's entry to this process's shard, if it hosts it."""
        if result.started:
            lifecycle("run started", acc.entity_type, acc.key, result.entry.run_id,
                      by=acc.kind.value)
        shard = self.host.shard(acc.shard) if self.host else None  # routed by the ref
        if shard is not None:
            shard.take_accepted(result, acc.start)  # the fast path; other hosts tail

    async def deliver(self, req: DeliveryRequest) -> DeliveryResult:
        began = time.perf_counter()
        result = await self.store.deliver(req)
        if result.status in ("delivered", "buffered"):
            metrics.accepted(req.entity_type, "deliver", time.perf_counter() - began)
        elif result.status == "duplicate":
            metrics.duplicate(req.entity_type, "deliver")
        shard = self.host.shard(req.shard) if self.host else None
        if shard is not None and result.entry is not None:
            shard.route(result.entry)  # the fast path; other hosts tail the journal
        return result

    async def signal_waits(self, op: SignalWaits) -> list[WaitRecord]:
        return await self.store.signal_waits(op.entity_type, limit=op.limit, after=op.after)

    async def entities(self, op: Entities) -> list[EntitySummary | UnreadableRow]:
        rows = await self.store.entities(op.entity_type, op.status, limit=op.limit,
                                         after=op.after, key_prefix=op.key_prefix)
        return [r if isinstance(r, UnreadableRow) else self._summary(r) for r in rows]

    def _summary(self, r: EntityRecord) -> EntitySummary:
        live = self._live(r.entity_type, r.key, r.run_id)
        passivated = r.status is RunStatus.RUNNING and r.passivated_seq is not None \
            and live is None
        applied, depth, backlog, age = self._progress(r.status, r.accepted_seq, live,
                                                      r.progress)
        return EntitySummary(
            r.entity_type, r.key, r.shard, r.status, r.run_id, r.accepted_seq,
            applied, depth, passivated, r.updated_at, r.suspended, backlog, age)

    def _progress(self, status: RunStatus, accepted: int, live: Activation | None,
                  stored: Progress | None
                  ) -> tuple[int | None, int | None, int | None, float | None]:
        """(applied seq, mailbox depth, backlog, oldest unapplied age): the live
        activation's where this process hosts it, else the store's."""
        applied = live.applied_seq if live else (stored.applied_seq if stored else None)
        depth = live.mailbox_depth if live else (stored.mailbox_depth if stored else None)
        if applied is None:
            return None, depth, None, None
        backlog = max(0, accepted - applied) if status is RunStatus.RUNNING else 0
        oldest = stored.oldest_unapplied_at if stored and backlog else None
        age = None if oldest is None else max(0.0, self._clock.time() - oldest)
        return applied, depth, backlog, age

    def _live(self, etype: str, key: str, run_id: int) -> Activation | None:
        """This process's ready activation of the entity's run `run_id`, if any."""
        shard = self._shard(etype, key)
        act = shard.get(etype, key) if shard else None
        return act if act is not None and act.is_ready and act.run_id == run_id else None

    async def wait_update(self, op: WaitUpdate) -> UpdateOutcome:
        etype, key, message_id = op.entity_type, op.key, op.message_id
        shard = self._shard(etype, key)
        local = shard.wait_update(etype, key, message_id) if shard else None
        delay, polls = 0.002, 0
        try:
            while True:
                try:
                    recorded = await self.store.update_outcome(etype, key, message_id)
                    if recorded is not None:
                        return recorded
                    if polls:  # not on the hot path: a hosting shard fails `local` itself
                        await self._refuse_if_closed(etype, key, message_id)
                except StoreUnavailableError:
                    # The update is accepted (durable); an outage while its outcome is
                    # awaited is not its failure: keep waiting (the caller's timeout
                    # bounds the wait), as the host keeps retrying to record it.
                    pass
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

    async def query(self, op: Query) -> str:
        """Answered by the live activation when this process hosts the entity, once
        everything accepted before the query is applied (read-your-writes); otherwise
        by a read-only replica rebuilt from the store (latest snapshot + journal)."""
        etype, key, name, payload = op.entity_type, op.key, op.name, op.payload
        definition = self._definitions[etype]
        shard = self._shard(etype, key)
        for _ in range(3):  # an activation may finish meanwhile (continue-as-new): its next
            act = shard.get(etype, key) if shard else None
            if act is None and shard is not None:
                act = await shard.activate_for_query(etype, key, wake=op.activate)
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

    async def describe(self, op: Describe) -> EntityDescription:
        etype, key = op.entity_type, op.key
        found = await self.store.latest_run(etype, key)
        if found is None:
            return EntityDescription(etype, key, op.shard,
                                     RunStatus.NEVER_STARTED, 0, 0, None, None, False, ())
        run, next_seq = found
        live = self._live(etype, key, run.run_id)
        runs = tuple(RunSummary.of(r) for r in await self.store.runs(etype, key))
        more = await self.store.entity_details(etype, key, run.run_id)
        applied, depth, backlog, age = self._progress(run.status, next_seq - 1, live,
                                                      more.progress)
        recorded = more.progress.recorded_at if more.progress else None
        return EntityDescription(
            etype, key, op.shard, run.status, run.run_id, next_seq - 1, applied, depth,
            live is not None, runs, snapshot_seq=more.snapshot_seq,
            snapshot_age=None if more.snapshot_at is None
            else max(0.0, self._clock.time() - more.snapshot_at),
            timers=more.timers,
            open_waits=tuple(SignalWaitInfo.of(w) for w in more.waits
                             if w.status is WaitStatus.OPEN),
            dead_letters=more.dead_letters,
            suspension=more.suspension if run.status is RunStatus.RUNNING else None,
            backlog=backlog, oldest_unapplied_age=age,
            progress_age=None if recorded is None else max(0.0, self._clock.time() - recorded),
        )

    async def census(self, op: TakeCensus) -> Census:
        return await self.store.census()
    async def history(self, op: History) -> EntityHistory:
        run = await self._started(op.entity_type, op.key)
        live = self._live(op.entity_type, op.key, run.run_id)
        if live is not None:
            applied: int | None = live.applied_seq
        else:  # another process hosts it: its recorded progress (about a second behind)
            progress = (await self.store.entity_details(op.entity_type, op.key,
                                                        run.run_id)).progress
            applied = None if progress is None else progress.applied_seq
        return await read_history(self.store, run, applied, limit=op.limit, after=op.after)

    async def state(self, op: State) -> EntityState:
        etype, key = op.entity_type, op.key
        run = await self._started(etype, key)
        snap = await self.store.latest_snapshot(etype, key, run.run_id)
        envelope = None if snap is None else decode(self._definitions[etype], key, *snap)
        return await read_state(self.store, run, envelope, None if snap is None else snap[0],
                                limit=op.limit, after=op.after)

    async def _started(self, etype: str, key: str) -> RunRecord:
        found = await self.store.latest_run(etype, key)
        if found is None:
            raise EntityNotRunningError(f"{etype} {key!r} was never started",
                                        entity_type=etype, key=key)
        return found[0]

    async def latest_run(self, op: LatestRun) -> RunRecord | None:
        found = await self.store.latest_run(op.entity_type, op.key)
        return None if found is None else found[0]

    async def dead_letters(self, op: DeadLetters) -> list[DeadLetter]:
        return await self.store.dead_letters(op.entity_type, op.key, limit=op.limit,
                                             after=op.after)

    async def replay_dead_letter(self, op: ReplayDeadLetter) -> AcceptResult:
        result = await self.store.replay_dead_letter(
            op.entity_type, op.key, op.shard, op.dead_letter_id,
            accepted_at=self._clock.time())
        shard = self.host.shard(op.shard) if self.host else None
        if shard is not None and not result.duplicate:
            shard.route(result.entry)  # other hosts tail the journal
        return result

    async def schedule_call(self, op: ScheduleCall) -> Any:
        """A `Runtime.schedules` call on the store; what a trigger or backfill accepted
        is routed to the entity if this process holds its shard (other hosts tail the
        journal)."""
        if op.method not in SCHEDULE_METHODS:
            raise TypeError(f"not a schedule call: {op.method!r}")
        result = await getattr(self.store, op.method)(*op.args)
        if isinstance(result, Fired) and op.shard is not None:
            shard = self.host.shard(op.shard) if self.host else None
            for accepted, start in result.accepted if shard is not None else ():
                shard.take_accepted(accepted, start)  # type: ignore[union-attr]
        return result

    async def discard_dead_letter(self, op: DiscardDeadLetter) -> bool:
        return await self.store.discard_dead_letter(op.entity_type, op.key,
                                                    op.dead_letter_id)
