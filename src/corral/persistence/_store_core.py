"""`StoreCore`: the `Store` methods both engines share, written once.

Each is an op handed to the engine's group commit (`write`) or a read handed to one of
its read connections (`read`); `SqliteStore` and `PostgresStore` add only what is truly
their own: opening and closing, the writer, the journal tail, shard locks and
commit notifications.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import corral.persistence._build_registry as registry
import corral.persistence._entity_history as history
import corral.persistence._reads as reads
from corral._common import PURGE_ROWS, RunStatus

from ._backlog import ShardBacklog, summary_rows
from ._batch import CommitQueue
from ._build_registry import BuildCheck, BuildRecord
from ._census import Census, census
from ._hosting import ClaimHostingOp, HostingClaim, ReleaseHostingOp, hosting_claims
from ._ops_accept import AcceptAllOp, AcceptOp
from ._ops_builds import ForgetProcessOp, RegisterBuildsOp
from ._ops_dead_letters import DiscardDeadLetterOp, RecordDeadLetterOp, ReplayDeadLetterOp
from ._ops_handoff import (
    RequestLeasesOp,
    held_by,
    live_hosts,
    offered_to,
    requests_for,
)
from ._ops_outbox import OutboxRow, Send, SentOp, last_send, pending_senders, pending_sends
from ._ops_retention import PurgeClosedOp, Purged, purgeable
from ._ops_runs import (
    ActivatedOp,
    CloseRunOp,
    ContinueAsNewOp,
    RecordUpdateOp,
    SnapshotOp,
    TimerOp,
)
from ._ops_steps import (
    RecordStepAttemptOp,
    RecordStepOp,
    StepAttempts,
    StepRecord,
    run_steps,
    step_history,
)
from ._ops_waits import DeliverOp, ExpireWaitOp, OpenWaitOp
from ._progress import RecordProgressOp
from ._records import (
    Acceptance,
    AcceptResult,
    DeadLetter,
    DeliveryRequest,
    DeliveryResult,
    EntityDetails,
    EntityRecord,
    JournalEntry,
    MessageRecord,
    RunRecord,
    Suspension,
    TimerRecord,
    UnreadableRow,
    UpdateOutcome,
    WaitRecord,
)
from ._releases import (
    DeclareReleaseOp,
    ReleaseRecord,
    check_declaration,
    check_limit,
    check_namespace,
    releases,
)
from ._schedule_store import ScheduleOps
from ._suspensions import ClearSuspensionOp, SuspendOp
from ._txn import Fence, WriteOp
from ._unapplied import SettleRunOp
from ._waits import WaitPosition

__all__ = ["StoreCore"]

T = TypeVar("T")


class StoreCore(ScheduleOps):
    """What both stores do alike, on the two primitives each store provides."""

    __slots__ = ()
    # The clock a delivery's deadline is judged by; None: the transaction's (`Txn.clock`).
    delivery_clock: Callable[[], float] | None = None
    _queue: CommitQueue[WriteOp]  # the engine's group commit, started when it opens

    def write(self, op: WriteOp) -> Coroutine[Any, Any, Any]:
        """Apply `op` in the next group-commit transaction; return its result once durable."""
        return self._queue.write(op)  # no frame of its own: every send comes here

    def write_many(self, ops: Sequence[WriteOp]) -> Coroutine[Any, Any, list[Any]]:
        """`write` for each op, in one batch: each op's result, or the error refusing it."""
        return self._queue.write_many(ops)

    @property
    def idle(self) -> bool:
        return self._queue.idle

    @property
    def commits(self) -> int:
        return self._queue.commits

    @property
    def ops_committed(self) -> int:
        return self._queue.ops_committed

    async def query(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`fn(q, *args)` on a read-only `Txn` `q` over a read connection, in one read
        transaction where the engine needs one; driver errors wrapped."""
        raise NotImplementedError

    # -- writes -------------------------------------------------------------------

    def accept(self, acc: Acceptance) -> Coroutine[Any, Any, AcceptResult]:
        return self.write(AcceptOp(acc))  # no frame of its own: every send comes here

    async def accept_many(self, accs: Sequence[Acceptance]) -> list[AcceptResult | Exception]:
        return await self.write_many([AcceptOp(acc) for acc in accs])

    async def accept_all(self, accs: Sequence[Acceptance]) -> list[AcceptResult]:
        return await self.write(AcceptAllOp(accs))  # type: ignore[no-any-return]

    async def deliver(self, req: DeliveryRequest) -> DeliveryResult:
        return await self.write(DeliverOp(req, self.delivery_clock))  # type: ignore[no-any-return]

    async def open_wait(self, fence: Fence, etype: str, key: str, run_id: int, name: str, *,
                        deadline: float | None, now: float,
                        aliases: tuple[str, ...] = ()) -> WaitRecord:
        op = OpenWaitOp(fence, etype, key, run_id, name, deadline, now, aliases)
        return await self.write(op)  # type: ignore[no-any-return]

    async def expire_wait(self, fence: Fence, etype: str, key: str, run_id: int, name: str,
                          *, now: float) -> WaitRecord:
        op = ExpireWaitOp(fence, etype, key, run_id, name, now)
        return await self.write(op)  # type: ignore[no-any-return]

    async def record_update(self, fence: Fence, etype: str, key: str, message_id: str,
                            outcome: UpdateOutcome) -> None:
        await self.write(RecordUpdateOp(fence, etype, key, message_id, outcome.to_json()))

    async def close_run(self, fence: Fence, etype: str, key: str, run_id: int, *,
                        applied_seq: int, status: RunStatus, result: str | None,
                        error: str | None, force: bool = False,
                        pending: Sequence[JournalEntry] = (), sends: Sequence[Send] = (),
                        state: bytes | None = None) -> bool:
        op = CloseRunOp(fence, etype, key, run_id, applied_seq, status, result, error, force,
                        tuple(pending), tuple(sends), state)
        return await self.write(op)  # type: ignore[no-any-return]

    async def settle_run(self, fence: Fence, etype: str, key: str, run_id: int, *,
                         applied_seq: int | None, pending: Sequence[JournalEntry] = (),
                         failed_at: float) -> int:
        op = SettleRunOp(fence, etype, key, run_id, applied_seq, tuple(pending), failed_at)
        return await self.write(op)  # type: ignore[no-any-return]

    async def write_snapshot(self, fence: Fence, etype: str, key: str, run_id: int, *,
                             applied_seq: int, state: bytes, keep: int,
                             passivate: bool = False, forget_seq: int = 0,
                             forget_before: float = 0.0,
                             forget_steps: Sequence[str] = (),
                             sends: Sequence[Send] = ()) -> int:
        op = SnapshotOp(fence, etype, key, run_id, applied_seq, state, keep, passivate,
                        forget_seq, forget_before, tuple(forget_steps), tuple(sends))
        return await self.write(op)  # type: ignore[no-any-return]

    async def continue_as_new(self, fence: Fence, etype: str, key: str, run_id: int, *,
                              applied_seq: int, next_input: str,
                              carried: Sequence[JournalEntry],
                              sends: Sequence[Send] = ()) -> int:
        op = ContinueAsNewOp(fence, etype, key, run_id, applied_seq, next_input,
                             tuple(carried), tuple(sends))
        return await self.write(op)  # type: ignore[no-any-return]

    async def record_step(self, fence: Fence, etype: str, key: str, run_id: int,
                          record: StepRecord, *, sends: Sequence[Send] = (),
                          history: StepAttempts | None = None) -> None:
        await self.write(RecordStepOp(fence, etype, key, run_id, record, tuple(sends),
                                      history))

    async def record_step_attempt(self, fence: Fence, etype: str, key: str,
                                  history: StepAttempts) -> None:
        await self.write(RecordStepAttemptOp(fence, etype, key, history))

    async def mark_sent(self, fence: Fence, etype: str, key: str, run_id: int, *,
                        upto: int, errors: Sequence[tuple[int, str]] = ()) -> None:
        await self.write(SentOp(fence, etype, key, run_id, upto, tuple(errors)))

    async def pending_sends(self, etype: str, key: str, run_id: int, *,
                            limit: int) -> list[OutboxRow]:
        return await self.query(pending_sends, etype, key, run_id, limit)

    async def pending_senders(self, shard: int) -> list[tuple[str, str, int]]:
        return await self.query(pending_senders, shard)

    async def last_send(self, etype: str, key: str, run_id: int) -> int:
        return await self.query(last_send, etype, key, run_id)

    async def steps(self, etype: str, key: str, run_id: int) -> dict[str, StepRecord]:
        return await self.query(run_steps, etype, key, run_id)
    # -- retention (`_ops_retention`) ------------------------------------------------

    async def purge_closed(self, etype: str, closed_before: float, *, limit: int,
                           fences: Sequence[Fence] = (), rows: int = PURGE_ROWS) -> Purged:
        op = PurgeClosedOp(etype, closed_before, limit, tuple(fences), rows)
        return await self.write(op)  # type: ignore[no-any-return]

    async def purgeable(self, etype: str, closed_before: float) -> Purged:
        return await self.query(purgeable, etype, closed_before)

    # -- graceful shard hand-off (`_ops_handoff`) -----------------------------------

    async def request_leases(self, requester: str, shards: Sequence[int], ttl: float
                             ) -> None:
        await self.write(RequestLeasesOp(requester, tuple(shards), ttl))

    async def lease_requests(self, owner: str) -> dict[int, str]:
        return await self.query(requests_for, owner)

    async def live_hosts(self, owner: str) -> list[str]:
        return await self.query(live_hosts, owner)

    async def lease_offers(self, heir: str) -> set[int]:
        return await self.query(offered_to, heir)

    async def lease_holders(self) -> dict[int, str]:
        return await self.query(held_by)

    async def mark_activated(self, fence: Fence, etype: str, key: str) -> list[str]:
        return await self.write(ActivatedOp(fence, etype, key))  # type: ignore[no-any-return]

    async def record_progress(self, fence: Fence,
                              rows: Sequence[tuple[str, str, int, int]], *, at: float,
                              backlog: ShardBacklog | None = None) -> None:
        summary = () if backlog is None else tuple(summary_rows(fence, backlog, at))
        await self.write(RecordProgressOp(fence, tuple(rows), at, summary))

    async def suspend_run(self, fence: Fence, record: Suspension) -> None:
        await self.write(SuspendOp(fence, record))

    async def clear_suspension(self, fence: Fence, etype: str, key: str, run_id: int
                               ) -> None:
        await self.write(ClearSuspensionOp(fence, etype, key, run_id))

    async def set_timer(self, fence: Fence, etype: str, key: str, run_id: int,
                        timer_id: str, due_at: float | None, *,
                        replacing: Sequence[str] = ()) -> None:
        await self.write(TimerOp(fence, etype, key, run_id, timer_id, due_at,
                                 tuple(replacing)))

    async def record_dead_letter(self, fence: Fence, entry: JournalEntry, *, error: str,
                                 traceback: str, attempts: int, failed_at: float) -> int:
        op = RecordDeadLetterOp(fence, entry, error, traceback, attempts, failed_at)
        return await self.write(op)  # type: ignore[no-any-return]

    async def replay_dead_letter(self, etype: str, key: str, shard: int, dead_letter_id: int,
                                 *, accepted_at: float) -> AcceptResult:
        op = ReplayDeadLetterOp(etype, key, shard, dead_letter_id, accepted_at)
        return await self.write(op)  # type: ignore[no-any-return]

    async def discard_dead_letter(self, etype: str, key: str, dead_letter_id: int) -> bool:
        op = DiscardDeadLetterOp(etype, key, dead_letter_id)
        return await self.write(op)  # type: ignore[no-any-return]

    # -- reads --------------------------------------------------------------------

    async def signal_waits(self, etype: str | None, *, limit: int,
                           after: WaitPosition | None = None) -> list[WaitRecord]:
        return await self.query(reads.open_waits, etype, limit, after)

    async def entities(self, etype: str | None, status: RunStatus | None, *, limit: int,
                       after: tuple[str, str] | None = None, key_prefix: str | None = None
                       ) -> list[EntityRecord | UnreadableRow]:
        return await self.query(reads.list_entities, etype, status, limit, after, key_prefix)

    async def entity_details(self, etype: str, key: str, run_id: int) -> EntityDetails:
        return await self.query(reads.entity_details, etype, key, run_id)

    async def suspensions(self, shards: Sequence[int]) -> dict[int, list[Suspension]]:
        return await self.query(reads.shard_suspensions, shards)

    async def census(self) -> Census:
        return await self.query(census)

    async def due_timers(self, shards: frozenset[int], now: float) -> list[tuple[str, str]]:
        return await self.query(reads.due_timers, shards, now)

    async def next_timer(self, shards: frozenset[int]) -> float | None:
        return await self.query(reads.next_timer, shards)

    async def latest_snapshot(self, etype: str, key: str, run_id: int
                              ) -> tuple[int, bytes] | None:
        return await self.query(reads.latest_snapshot, etype, key, run_id)

    async def journal(self, etype: str, key: str, *, run_id: int, after_seq: int,
                      limit: int | None = None) -> list[JournalEntry]:
        return await self.query(reads.journal, etype, key, run_id, after_seq, limit)

    async def messages(self, etype: str, key: str, *, after_seq: int = 0, limit: int = 100
                       ) -> list[MessageRecord]:
        return await self.query(history.messages, etype, key, after_seq, limit)

    async def step_history(self, etype: str, key: str, *, limit: int
                           ) -> list[StepAttempts]:
        return await self.query(step_history, etype, key, limit)

    async def timers(self, etype: str, key: str) -> list[TimerRecord]:
        return await self.query(history.entity_timers, etype, key)

    async def waits(self, etype: str, key: str) -> list[WaitRecord]:
        return await self.query(history.entity_waits, etype, key)

    async def replayed_to(self, dead_letter_id: int) -> tuple[str, str] | None:
        return await self.query(history.replayed_to, dead_letter_id)

    async def latest_run(self, etype: str, key: str) -> tuple[RunRecord, int] | None:
        return await self.query(reads.latest_run, etype, key)

    async def runs(self, etype: str, key: str) -> list[RunRecord]:
        return await self.query(reads.runs, etype, key)

    async def running_entities(self, shards: Sequence[int]
                               ) -> dict[int, list[tuple[str, str]]]:
        return await self.query(reads.running_entities, shards)

    async def urgent_entities(self, shards: Sequence[int], now: float
                              ) -> dict[int, list[tuple[str, str]]]:
        return await self.query(reads.urgent_entities, shards, now)

    async def count_running(self, shard: int) -> int:
        return await self.query(reads.count_running, shard)

    async def update_outcome(self, etype: str, key: str, message_id: str
                             ) -> UpdateOutcome | None:
        return await self.query(reads.update_outcome, etype, key, message_id)

    async def dead_letters(self, etype: str | None = None, key: str | None = None, *,
                           limit: int = 100, after: int = 0) -> list[DeadLetter]:
        return await self.query(reads.dead_letters, etype, key, limit, after)

    async def dead_letter_seqs(self, etype: str, key: str, run_id: int) -> frozenset[int]:
        return await self.query(reads.dead_letter_seqs, etype, key, run_id)

    # -- the registry of builds (`_build_registry`) -----------------------------------

    async def register_builds(self, process: str, role: str,
                              builds: Sequence[tuple[str, str, str]], *, ttl: float,
                              older: frozenset[str] = frozenset(),
                              check: BuildCheck | None = None) -> float:
        op = RegisterBuildsOp(process, role, tuple(builds), ttl, older, check)
        return await self.write(op)  # type: ignore[no-any-return]

    async def forget_process(self, process: str) -> None:
        await self.write(ForgetProcessOp(process))

    async def builds(self, etype: str | None = None) -> list[BuildRecord]:
        return await self.query(registry.builds, etype)

    async def host_builds(self, exclude: str) -> tuple[list[BuildRecord], list[dict[str, str]]]:
        return await self.query(registry.host_builds, exclude)

    # -- which cluster hosts the store (`_hosting`) ------------------------------------

    async def claim_hosting(self, process: str, cluster: str, holder: str, *,
                            ttl: float) -> HostingClaim | None:
        op = ClaimHostingOp(process, cluster, holder, ttl)
        return await self.write(op)  # type: ignore[no-any-return]

    async def release_hosting(self, process: str) -> None:
        await self.write(ReleaseHostingOp(process))

    async def hosting_claims(self) -> list[HostingClaim]:
        return await self.query(hosting_claims)

    async def names_in_use(self, etype: str, names: Sequence[str]) -> dict[str, str]:
        return await self.query(registry.names_in_use, etype, tuple(names))

    # -- declared releases (`_releases`) ----------------------------------------------

    async def declare_release(self, namespace: str, release_id: str, body: str, *,
                              declared_by: str) -> ReleaseRecord:
        check_declaration(namespace, release_id, body, declared_by)
        op = DeclareReleaseOp(namespace, release_id, body, declared_by)
        return await self.write(op)  # type: ignore[no-any-return]

    async def releases(self, namespace: str, *, limit: int = 10) -> list[ReleaseRecord]:
        return await self.query(releases, check_namespace(namespace), check_limit(limit))
