"""`Activation`: one live entity inside its shard.

Lifecycle: wait for the predecessor activation (if any) to finish -> `__init__(start)`
-> replay the run's journal -> start `run()` -> apply each new journal entry in `seq`
order. Entries that arrive before the replay finished wait in the inbox: no handler
ever runs before `__init__` and the replay are done (handler-safe order).

An idle activation holds no task, event or queue: a worker task exists only while
entries wait, and `run()` gets a task only when the class defines one. That keeps a
hundred thousand resident entities cheap.

Where an activation is in its life is one `Phase`, changed only by `Activation._enter`,
which refuses a move `_NEXT` does not list (a bug of the host: `AssertionError`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import corral.metrics as metrics
from corral._common import RunStatus
from corral._errors import (
    CorralError,
    EntityFailedError,
    EntityNotRunningError,
    EntityTerminatedError,
    InvalidPayloadError,
    LeaseLostError,
    StoreError,
)
from corral._tracing import tracer
from corral.actors import ContinueAsNew, Entity
from corral.persistence import EntryKind, JournalEntry, RunRecord, Send, Suspension

from .._payloads import encode_start
from ..client._results import decode_value, encode_value
from . import _traces as traces
from ._apply import instantiate
from ._awaiting import AwaitingBuild, awaiting_suspension, check_awaiting
from ._events import lifecycle
from ._poison import Applied, Poisoned, apply_live, retried_handler
from ._recovery import fail_unbuilt, running_run, settle_terminated
from ._residence import Residence
from ._run_context import RunContext
from ._snapshot import capture, rebuild
from ._suspension import end_suspension, next_suspension, record_suspension

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["Activation", "Phase"]

log = logging.getLogger("corral.activation")
_SENDS_PER_WRITE = 256  # handlers' sends a worker applying a backlog writes at the latest


class Phase(enum.Enum):
    """Where an activation is in its life; what holds in each is said beside it.

    Entries are applied only while `LOADING` (the replay), `READY` and `CLOSING`; in every
    other phase they wait in the inbox (and go to the next activation, or stay in the
    journal). The entity's own state is never called a phase.
    """

    # The load task (the worker) waits for the predecessor, builds the entity and
    # replays its journal. `entity` is None until built; `run_id` is 0 until known.
    # Entries arriving now wait in the inbox; no handler runs but the replay's.
    LOADING = "loading"
    # Loaded and serving: a worker task applies the inbox in seq order (it exists only
    # while entries wait); `run()`, if the class has one, has its task.
    READY = "ready"
    # Writing the passivation snapshot: nothing more is applied; entries wait in the
    # inbox and all go to the next activation. Back to READY if the snapshot fails.
    PASSIVATING = "passivating"
    # `run()` raised ContinueAsNew: `applied_seq` is the watermark its next input was
    # built at, so nothing more is applied; the store carries every later entry, and
    # the inbox's entries of the next run go to its activation.
    CONTINUING = "continuing"
    # `run()` ended (returned or failed): the close waits until every entry accepted
    # before it is applied, so entries are still applied.
    CLOSING = "closing"
    # The run is closed (completed, failed, continued as new), or a terminate entry was
    # applied and is being settled: nothing more is applied; the activation finishes
    # when its worker returns. Update waiters were (or are about to be) failed.
    CLOSED = "closed"
    # `stop()`: evicted without writing anything (lease lost, host closing); its tasks
    # are being cancelled, and its inbox is dropped (the journal keeps every entry).
    STOPPING = "stopping"
    # Out of its shard: no task, no inbox; waits on it return. Nothing follows.
    FINISHED = "finished"


# The moves `Activation._enter` allows; any other is a bug of the host.
_NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.LOADING: frozenset({Phase.READY, Phase.CLOSED, Phase.STOPPING, Phase.FINISHED}),
    Phase.READY: frozenset({Phase.PASSIVATING, Phase.CONTINUING, Phase.CLOSING, Phase.CLOSED,
                            Phase.STOPPING, Phase.FINISHED}),
    # run() may end while the passivation snapshot is written (a durable timer woke it)
    Phase.PASSIVATING: frozenset({Phase.READY, Phase.CONTINUING, Phase.CLOSING,
                                  Phase.STOPPING, Phase.FINISHED}),
    # CLOSING: the next input does not encode, so the run fails; CLOSED: committed, or
    # a terminate the worker was applying when run() raised ContinueAsNew
    Phase.CONTINUING: frozenset({Phase.CLOSING, Phase.CLOSED, Phase.STOPPING,
                                 Phase.FINISHED}),
    Phase.CLOSING: frozenset({Phase.CLOSED, Phase.STOPPING, Phase.FINISHED}),
    Phase.CLOSED: frozenset({Phase.STOPPING, Phase.FINISHED}),
    Phase.STOPPING: frozenset({Phase.FINISHED}),
    Phase.FINISHED: frozenset(),
}
_APPLYING = frozenset({Phase.LOADING, Phase.READY, Phase.CLOSING})  # entries are applied
_LOADED = frozenset({Phase.READY, Phase.PASSIVATING, Phase.CONTINUING, Phase.CLOSING,
                     Phase.CLOSED})  # built and replayed, not yet dropped
_HANDING_ON = frozenset({Phase.PASSIVATING, Phase.CONTINUING})  # the inbox is the next one's


class Activation(RunContext):
    """Hosts one entity: its instance, its ordered inbox of journal entries, its `run()`.

    What the entity's code calls (its `EntityContext`) is the `RunContext` part."""

    __slots__ = ("_applying", "_current", "_inbox", "_last_active", "_phase", "_phase_waiters",
                 "_reading", "_replaying", "_snapshot_seq", "_worker", "entity")

    def __init__(self, home: Residence, previous: Activation | None = None,
                 fresh: JournalEntry | None = None, start_input: str | None = None) -> None:
        super().__init__(home)
        self._snapshot_seq = 0
        self.entity: Entity | None = None  # built in LOADING; None if it never was
        self._phase = Phase.LOADING  # changed only by `_enter`
        self._phase_waiters: list[asyncio.Future[None]] | None = None  # woken by `_enter`
        # The worker is inside `_run_handler` for the entry after `applied_seq` (its
        # handler running, or its dead letter being written): not a phase, a fact about
        # the worker that decides whether continue-as-new cancels it.
        self._applying = False
        self._last_active = home.clock.monotonic()
        # Entries not applied yet, in arrival order; None when there are none (most
        # resident entities). A fresh run's first entry goes first: entries other
        # callers queue while the load task has not run yet would otherwise precede
        # it and open a gap.
        self._inbox: deque[JournalEntry] | None = None if fresh is None else deque([fresh])
        # What else it holds unapplied (`backlog`): the entry being applied, the entries
        # of a replay, and whether a replay is reading them from the store.
        self._current: JournalEntry | None = None
        self._replaying: list[JournalEntry] = []
        self._reading = False
        # The task applying entries (the load task in LOADING); None while none wait.
        self._worker: asyncio.Task[None] | None = asyncio.create_task(
            self._load(previous, fresh, start_input)
        )

    # -- phase -------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def is_ready(self) -> bool:
        """Loaded (`__init__` and the replay are done) and not yet dropped: serving,
        or passivating, continuing, closing or closed."""
        return self._phase in _LOADED

    @property
    def is_finished(self) -> bool:
        return self._phase is Phase.FINISHED

    @property
    def has_progress(self) -> bool:
        """Its watermark and mailbox are its entity's: built (by `__init__` or a
        restore) and not finished, though perhaps still replaying its journal (a
        handler blocked there keeps it loading; what it applied so far is real)."""
        return self.entity is not None and self._phase is not Phase.FINISHED

    @property
    def _applies(self) -> bool:
        """Entries are applied in this phase (loading, serving or closing)."""
        return self._phase in _APPLYING

    async def wait_settled(self) -> None:
        """Wait until the activation is loaded or finished (a run whose activation
        cannot be built is suspended: evicted, so finished here)."""
        while self._phase is Phase.LOADING:
            await self._wait_phase()

    async def wait_finished(self) -> None:
        while self._phase is not Phase.FINISHED:
            await self._wait_phase()

    async def _wait_phase(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._phase_waiters is None:
            self._phase_waiters = []
        self._phase_waiters.append(fut)
        await fut

    def _enter(self, phase: Phase) -> None:
        """Move to `phase`, if `_NEXT` allows it from the current one; wake the waits."""
        was = self._phase
        if phase not in _NEXT[was]:
            allowed = ", ".join(sorted(p.value for p in _NEXT[was])) or "nothing"
            raise AssertionError(
                f"{self.entity_type} {self.key!r} run {self._run_id}: an activation "
                f"{was.value} cannot become {phase.value} (from {was.value}: {allowed})")
        self._phase = phase
        log.debug("%s %r run %d: %s -> %s", self.entity_type, self.key, self._run_id,
                  was.value, phase.value, extra={
                      "entity_type": self.entity_type, "key": self.key, "run_id": self._run_id,
                      "phase_from": was, "phase_to": phase})
        waiters, self._phase_waiters = self._phase_waiters, None
        for fut in waiters or ():
            if not fut.done():
                fut.set_result(None)

    def untaken(self) -> list[JournalEntry]:
        """The entries behind mailbox payloads `run()` has not taken: a run closing
        with them keeps each as a dead letter of the run (`Store.close_run(pending=)`)."""
        if self.entity is None:
            return []
        return [t for t in self.entity.mailbox.pending_tokens() if isinstance(t, JournalEntry)]

    def backlog(self) -> tuple[int, float | None] | None:
        """(messages accepted and not applied, when the oldest of them was accepted) as
        this activation holds them (its inbox, a replay, the entry being applied); None
        while it cannot know: not built, or reading its journal from the store.

        Its journal's entries of its run after its watermark are all here once loaded,
        but for a gap the journal tail has not filled yet (counted: the highest seq
        held minus the watermark)."""
        if not self.has_progress or self._reading:
            return None
        held = [e for e in (*(self._inbox or ()), *self._replaying, self._current)
                if e is not None and e.run_id == self._run_id and e.seq > self.applied_seq]
        if not held:
            return 0, None
        oldest = min(held, key=lambda e: e.seq)
        return max(e.seq for e in held) - self.applied_seq, oldest.accepted_at

    @property
    def mailbox_depth(self) -> int:
        return len(self.entity.mailbox) if self.entity is not None else 0

    # -- feeding -----------------------------------------------------------------------

    def queue(self, entry: JournalEntry) -> None:
        """Put `entry` in the inbox for the worker task, started if none runs: it is
        applied there, in seq order, never in the caller's frame, so whoever hands it
        over (an accept, and its caller's Ack) never waits for a handler.

        Duplicates and stale entries are dropped when applied. An entry a loaded entity
        applied already is dropped here, not by a worker: the journal tail's safety poll
        hands back what this process accepted and delivered itself (on PostgreSQL every
        second: ~40% of a host's CPU at 10,000 entities).
        """
        loaded = self._phase in _LOADED
        if loaded and self._applied_already(entry):
            return
        if self._inbox is None:
            self._inbox = deque()
        self._inbox.append(entry)
        if self._worker is None and loaded:
            self._worker = self._spawn_worker(self._drain)

    async def stop(self) -> None:
        """Evict without writing anything (lease lost, host closing)."""
        if self._phase in (Phase.STOPPING, Phase.FINISHED):
            return
        self._enter(Phase.STOPPING)
        tasks = [t for t in (self._run_task, self._worker) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._finish()

    # -- the work ----------------------------------------------------------------------

    async def _load(self, previous: Activation | None, fresh: JournalEntry | None,
                    start_input: str | None) -> None:
        """Build the entity; suspend the run if it cannot be built.

        `fresh` is the first entry of a run this process just started: nothing else
        can precede it, so the first attempt need not read the store. A failure to
        build (the start input no longer fits its model, `__init__` raising, a snapshot
        that does not restore) suspends the run, visibly, until a fix (see
        `_suspension`): it never applies messages it cannot apply, and never drops
        them. Only `corral.FailRun` or a type in the class's `fail_on` fails the run.
        Store errors are retried without a limit (they say nothing about the entity); a
        lost lease stops at once.
        """
        async def load() -> None:
            if previous is not None:
                await previous.wait_finished()
            failures = 0
            while True:
                try:
                    if fresh is not None and failures == 0:
                        self._start_fresh(fresh, start_input)
                        if fresh.run_id > 1:  # it replaced a closed run
                            await settle_terminated(self._home, fresh.run_id - 1)
                    elif not await self._recover():
                        return  # closed or terminated before we got here
                    break
                except (LeaseLostError, AwaitingBuild, asyncio.CancelledError):
                    raise
                except Exception as err:
                    failures += 1
                    if not isinstance(err, StoreError):
                        await self._cannot_build(err)
                        return
                    delay = self.definition.retry.backoff(failures)
                    log.warning("%s %r run %d: activation attempt %d failed (%s: %s); "
                                "retrying in %.3fs", self.entity_type, self.key, self._run_id,
                                failures, type(err).__name__, err, delay)
                    await asyncio.sleep(delay)
            await self._serve()
        await self._work(load)

    def _start_fresh(self, fresh: JournalEntry, start_input: str | None) -> None:
        self._run_id = fresh.run_id
        self._first_seq = fresh.seq
        self.applied_seq = self._snapshot_seq = fresh.seq - 1
        self.entity = instantiate(self.definition, start_input, self)

    async def _recover(self) -> bool:
        """Rebuild the running run from the store: latest snapshot + the journal after it.

        Returns False if the entity has no running run.
        """
        run = await running_run(self._home)
        if not isinstance(run, RunRecord):
            self._run_id = run
            self._finish()
            return False
        self._run_id, self._first_seq = run.run_id, run.first_seq
        store = self._home.store
        # Its commit and the reads of its state side by side (a round trip, not two);
        # nothing is applied before it committed (fenced: the lease is still ours).
        marking = asyncio.ensure_future(
            store.mark_activated(self._home.fence, self.entity_type, self.key))
        try:
            self.entity, covered = await rebuild(store, self.definition, run, self)
            self.applied_seq = self._snapshot_seq = self._floor = covered
            entries = await store.journal(self.entity_type, self.key, run_id=self._run_id,
                                          after_seq=covered)
        except asyncio.CancelledError:
            marking.cancel()
            raise
        except Exception:  # a build failure suspends the run: marked first, as before
            await asyncio.wait([marking])
            if not marking.cancelled():
                marking.exception()  # retrieved: the build's error is the one raised
            raise
        self._inherited = set(await marking)
        await self._replay(entries)
        # A run opened by continue-as-new starts after its predecessor's watermark; its
        # journal may hold only carried entries below that, or nothing: without this,
        # read-your-writes queries would wait for seqs that belong to the closed run.
        self.applied_seq = max(self.applied_seq, run.first_seq - 1)
        return True

    async def _cannot_build(self, err: Exception) -> None:
        """The activation cannot be built: suspend the run, or fail it if the code says so."""
        record = next_suspension(self._home, self._run_id, err, "activation failed")
        if record is not None:
            await self._evict(suspension=record)
            return
        held = self._home.suspended()
        await fail_unbuilt(self._home, self._run_id, self._snapshot_seq, err,
                           1 if held is None else held.attempts + 1)
        self._closed("failed", EntityFailedError, f": run {self._run_id} failed: its activation "
                     f"could not be built ({type(err).__name__}: {err})",
                     reason="activation failed")
        self._finish()

    async def _serve(self) -> None:
        metrics.activated(self.entity_type)
        if self._phase is Phase.LOADING:  # else a terminate in the replay closed the run
            self._enter(Phase.READY)      # (and `_drain` below finishes the activation)
        if self._resuming and not self.definition.has_run:
            self._resuming = False
            await end_suspension(self._home, self._run_id)  # built: nothing else can fail it
        if self.definition.has_run:
            self._run_task = asyncio.create_task(self._run_main())
        else:  # the replay re-set its handlers' timers: what else was left is not pending
            await self._forget_inherited()
        await self._drain()

    def _spawn_worker(self, job: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """A worker task running `job()`. The job's coroutine is made inside the task: a
        task cancelled before its first step (the activation stopped at once) never
        makes it, so no coroutine is left un-awaited."""
        return asyncio.create_task(self._work(job))

    async def _work(self, job: Callable[[], Awaitable[None]]) -> None:
        """Run a worker job; any failure evicts the activation (the journal keeps all)."""
        try:
            await job()
        except asyncio.CancelledError:
            raise
        except LeaseLostError:
            log.warning("%s %r: shard lease lost; evicting", self.entity_type, self.key)
            self._finish()
        except AwaitingBuild as err:  # a newer build knows the entry: wait, never skip it
            await self._evict(suspension=awaiting_suspension(self._home, self._run_id, err))
        except Exception as err:
            # A store error while applying (recording an update, a snapshot due) or a
            # failure of the host's own: the journal keeps every entry, so evict and come
            # back from the store. Nothing else would: a retried update is a duplicate,
            # which is not delivered again, and the journal tail has moved past it.
            if isinstance(err, StoreError):
                log.warning("%s %r: %s; evicting", self.entity_type, self.key, err)
            else:
                log.exception("%s %r: activation failed; evicting", self.entity_type, self.key)
            await self._evict()
        finally:
            if self._worker is not None and self._worker.done() is False \
                    and self._worker is asyncio.current_task(self._worker.get_loop()):
                self._worker = None

    async def _replay(self, entries: list[JournalEntry] | None = None) -> None:
        """Apply the journal after the applied watermark, in order, from the store (or
        `entries`, read from it already).

        The entries are durable already, so a snapshot between them would only repeat
        work: one is written at the end if the policy is due. (A backlog carried through
        a chain of continue-as-new runs was otherwise snapshotted every `every` entries
        of every run: quadratic in the backlog.)
        """
        if entries is None:
            self._reading = True
            try:
                entries = await self._home.store.journal(
                    self.entity_type, self.key, run_id=self._run_id,
                    after_seq=self.applied_seq)
            finally:
                self._reading = False
        self._replaying = entries
        try:
            for entry in entries:
                if not self._applies:
                    return  # closed, or continue-as-new carries the rest to the next run
                await self._apply(entry, replaying=True)
        finally:
            self._replaying = []
        if self._snapshot_due() or self._sends_due():
            await self.snapshot()

    async def _drain(self) -> None:
        inbox = self._inbox
        while True:
            while inbox and self._applies:
                entry = inbox.popleft()
                if entry.run_id > self._run_id:
                    self._home.route_to_successor(self, entry)
                elif self._applied_already(entry):
                    continue
                elif entry.seq > self.applied_seq + 1:
                    await self._replay()  # fill the gap from the store, in order
                else:
                    await self._apply(entry, replaying=False)
            if not self._sends_due():
                break
            await self.snapshot()  # what this drain's handlers sent, in one write
        if not inbox and self._phase not in _HANDING_ON:
            self._inbox = None  # most entities sit idle: keep nothing for them
        if self._phase is Phase.CLOSED:
            self._finish()

    def _applied_already(self, entry: JournalEntry) -> bool:
        """`entry` is of an earlier run, or of this run and at most its watermark."""
        return entry.run_id < self._run_id or (
            entry.run_id == self._run_id and entry.seq <= self.applied_seq)

    def _applied(self, entry: JournalEntry) -> None:
        self.applied_seq = entry.seq
        metrics.applied(self.entity_type)
        self._bytes += len(entry.payload)
        self._last_active = self._home.clock.monotonic()
        self.notify()

    # -- applying one entry, by its kind ---------------------------------------------------

    async def _apply(self, entry: JournalEntry, *, replaying: bool) -> None:
        """Hand `entry` to the `_apply_<kind>` method of its kind (`_APPLY`, below)."""
        self._current = entry
        try:
            await _APPLY[entry.kind](self, entry, replaying)
        finally:
            self._current = None

    async def _apply_signal(self, entry: JournalEntry, replaying: bool) -> None:
        """A replay passes over a signal dead-lettered before (its snapshot may be gone)."""
        if replaying and retried_handler(self.definition, entry) is not None \
                and entry.seq in await self._home.dead_letter_seqs(entry.run_id):
            log.info("%s %r: seq %d was dead-lettered before; not applied again",
                     self.entity_type, self.key, entry.seq)
            self._applied(entry)
            return
        await self._run_handler(entry, replaying)

    async def _apply_update(self, entry: JournalEntry, replaying: bool) -> None:
        await self._run_handler(entry, replaying)

    async def _run_handler(self, entry: JournalEntry, replaying: bool) -> None:
        """Its handler runs (`_poison` retries a raising signal handler), and the host
        acts on the verdict: a dead letter, or an update's outcome to record. Traced:
        inside the span of applying it (`_traces`), the cause of what follows."""
        t = tracer()
        if t is None:  # no span here; the caller's context still goes on with the sends
            self._cause = entry.trace
            await self._handle(entry, replaying, None)
            return
        with traces.applying(t, entry, replaying=replaying) as span:
            self._cause = span
            await self._handle(entry, replaying, span)

    async def _handle(self, entry: JournalEntry, replaying: bool, span: Span | None) -> None:
        assert self.entity is not None
        self._applying = True
        calls = 0

        def begins() -> None:
            nonlocal calls
            calls += 1
            self._handler_begins(entry)

        try:
            verdict = await apply_live(self.definition, self.entity, entry, attempt=begins)
            self._handler_ends(applied=isinstance(verdict, Applied) and (
                verdict.outcome is None or verdict.outcome.error is None))
            if span is not None:
                traces.outcome(
                    span, attempts=calls,
                    dead_letter=verdict.error if isinstance(verdict, Poisoned) else None,
                    update_error=None if verdict.outcome is None else verdict.outcome.error,
                    suspended=self._home.suspended() is not None)
            if isinstance(verdict, Poisoned):
                if not verdict.attempts:  # no handler here: is a newer build live?
                    await check_awaiting(self._home, entry)
                await self._dead_letter(entry, verdict, replaying=replaying)
        finally:
            self._applying = False
            self._handling = None
        self._applied(entry)
        if verdict.outcome is not None:
            await self._home.record_update(entry, verdict.outcome, replaying=replaying)
        if not replaying and (self._snapshot_due()
                              or self._sends_due(at_least=_SENDS_PER_WRITE)):
            await self.snapshot()

    async def _apply_terminate(self, entry: JournalEntry, replaying: bool) -> None:
        self.applied_seq = entry.seq
        self._enter(Phase.CLOSED)  # run() stops taking from its mailbox, then settle
        if self._run_task is not None and self._run_task is not asyncio.current_task():
            self._run_task.cancel()
        try:
            await self._settle_applied_terminate(entry)
        finally:  # its waiters learn of the terminate once what it left is kept
            self._terminated(entry.payload)

    async def _apply_mark(self, entry: JournalEntry, replaying: bool) -> None:
        """`START` and `RESUME`: marks, applied as nothing; what `run()` does next (its
        steps, its sends) continues the trace of the call that left it."""
        self.applied_seq = entry.seq
        if entry.trace is not None:
            self._cause = entry.trace

    async def _apply_deliver(self, entry: JournalEntry, replaying: bool) -> None:
        """Wakes `run()` waiting on the signal wait the delivery closed."""
        self.applied_seq = entry.seq
        self._delivered(entry)

    async def _dead_letter(self, entry: JournalEntry, verdict: Poisoned, *,
                           replaying: bool) -> None:
        """Move `entry` to the dead letters (once: a replay finds its row), then snapshot
        at it so that recovery starts after it (see `_poison`)."""
        if replaying and entry.seq in await self._home.dead_letter_seqs(entry.run_id):
            return
        await self._home.record_dead_letter(entry, error=verdict.error,
                                            traceback=verdict.traceback,
                                            attempts=verdict.attempts)
        self.applied_seq = entry.seq
        try:
            await self.snapshot()
        except StoreError:  # lease lost or store failing: the activation stops
            raise
        except Exception as err:  # state that does not encode (SnapshotCaptureError)
            log.warning("%s %r: no snapshot after dead-lettering seq %d (%s: %s); recovery "
                        "skips the entry by its dead letter row", self.entity_type, self.key,
                        entry.seq, type(err).__name__, err)

    def _snapshot_due(self) -> bool:
        every = self.definition.snapshots.every
        return (every is not None and self.applied_seq - self._snapshot_seq >= every
                and self._applies)

    def _sends_due(self, *, at_least: int = 1) -> bool:
        """Handlers sent (`at_least` sends wait): a snapshot writes them, covering their
        entries (so a recovery does not apply them again), once the worker applied what
        was queued (or every `_SENDS_PER_WRITE` sends), unless an earlier write of the
        run's progress (a step's record) took them."""
        return self._handler_sends_kept() >= at_least and self._applies

    async def checkpoint(self) -> None:
        """`Entity.checkpoint()`: a snapshot now, retried while the store fails, which
        covers the steps recorded so far (their records go in its transaction)."""
        covered = self._steps.completed() if self._steps is not None else ()
        await self._retrying("checkpoint", lambda: self.snapshot(forget_steps=covered))
        if self._steps is not None:
            self._steps.covered(covered)

    async def _write_progress(self) -> None:
        await self._retrying("send", self.snapshot)

    async def snapshot(self, *, passivate: bool = False,
                       forget_steps: tuple[str, ...] = ()) -> None:
        """Snapshot the state at the applied watermark (fenced; truncates the journal).

        Writes even when no message was applied since the last snapshot: `run()` calls
        this after changing state itself (an answered reply), and that change must
        survive a restart. A snapshot at the same watermark replaces the older one.
        """
        assert self.entity is not None
        await self.ready_to_send()  # no await from here to the capture of the state
        seq = self.applied_seq
        window = self.definition.dedupe_window
        sends = self.take_outgoing()  # the state captured may say they were sent
        try:
            self._floor = await self._home.store.write_snapshot(
                self._home.fence, self.entity_type, self.key, self._run_id, applied_seq=seq,
                state=capture(self.definition, self.entity),
                keep=self.definition.snapshots.keep, passivate=passivate,
                forget_seq=seq - window.max_count if window.max_count is not None else 0,
                forget_before=(self.now() - window.max_age if window.max_age is not None
                               else 0.0),
                forget_steps=forget_steps, sends=sends,
            )
        except BaseException as err:
            self.unwritten(sends, err)
            raise
        self.written(sends)
        self._snapshot_seq = max(self._snapshot_seq, seq)
        metrics.snapshotted(self.entity_type)

    @property
    def idle_for(self) -> float:
        """Seconds since the last applied message or query; 0 while busy.

        Busy means: applying entries, or `run()` doing work rather than waiting.
        """
        if self._phase is not Phase.READY or self.busy:
            return 0.0
        return self._home.clock.monotonic() - self._last_active

    @property
    def busy(self) -> bool:
        """Loading, applying, or `run()` working rather than waiting."""
        return (self._phase is Phase.LOADING or self._worker is not None
                or (self._run_task is not None and not self._run_task.done()
                    and not self._waiting))

    @property
    def idle_deadline(self) -> float | None:
        """When (on the clock's monotonic time) this entity may be passivated."""
        timeout = self.definition.idle_timeout
        return None if timeout is None or self.busy else self._last_active + timeout

    def touch(self) -> None:
        self._last_active = self._home.clock.monotonic()

    async def passivate(self) -> None:
        """Snapshot, mark passivated and evict; the run stays running in the store.

        Entries arriving meanwhile wait in the inbox and go to the next activation.
        Should `run()` end meanwhile (or the activation stop), that decides instead.
        """
        if self._phase is not Phase.READY:
            return  # no longer idle: it moved on since it was found idle
        self._enter(Phase.PASSIVATING)
        try:
            await self.snapshot(passivate=True)
        except Exception:
            if self.phase is not Phase.PASSIVATING:  # run() ended meanwhile, or stopped
                return
            self._enter(Phase.READY)
            log.exception("%s %r: passivation failed; staying resident", self.entity_type,
                          self.key)
            if self._inbox and self._worker is None:
                self._worker = self._spawn_worker(self._drain)
            return
        if self.phase is not Phase.PASSIVATING:  # run() ended meanwhile, or stopped
            return
        if self._run_task is not None:
            self._run_task.cancel()  # its durable timers stay and will bring it back
        metrics.passivated(self.entity_type)
        self._finish(forward_all=True)

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
        except ContinueAsNew as can:
            # No await between the raise and here: `applied_seq` is exactly what the
            # state run() built `next_input` from had seen.
            watermark, in_handler = self.applied_seq, self._applying
            if not self._run_may_end():
                return
            self._enter(Phase.CONTINUING)
            await self._settle(self._continue(can.next_input, watermark,
                                              abort_handler=in_handler))
            return
        except LeaseLostError:
            log.warning("%s %r: lease lost under run(); the next host reruns it",
                        self.entity_type, self.key)
            self._finish()
            return
        except StoreError as err:
            # Not the run's failure: the store's. Evict; run() starts again from the top
            # when the activation comes back (`retrying` spares it most of these).
            log.warning("%s %r run %d: run() met a store error (%s); evicting",
                        self.entity_type, self.key, self._run_id, err)
            await self._evict()
            return
        except Exception as err:
            record = next_suspension(self._home, self._run_id, err, "run() raised")
            if record is not None:  # a bug, not the run's end: keep the run, retry it
                await self._evict(suspension=record)
                return
            status = RunStatus.FAILED
            error = traceback.format_exc()
            log.warning("%s %r run %d: run() failed:\n%s", self.entity_type, self.key,
                        self._run_id, error)
        if not self._run_may_end():
            return
        if self.entity.mailbox:  # the close keeps each as a dead letter of the run
            log.warning("%s %r: run() ended with %d mailbox payloads not taken; they become "
                        "dead letters", self.entity_type, self.key, len(self.entity.mailbox))
        await self._settle(self._close(status, result, error))

    def _run_may_end(self) -> bool:
        """`run()` ended: whether its end is still the run's to close or continue (not if
        the run was terminated under it, or the activation is being dropped, and `run()`
        swallowed the cancellation that meant)."""
        return self._phase in (Phase.READY, Phase.PASSIVATING)

    async def _settle(self, closing: Coroutine[Any, Any, None]) -> None:
        """Close or continue the run; if the store fails meanwhile, evict and let the
        shard activate the entity again, whose `run()` then restarts from the top."""
        try:
            await closing
        except LeaseLostError:
            log.warning("%s %r: lease lost while closing; the next host reruns run()",
                        self.entity_type, self.key)
            self._finish()
        except StoreError as err:
            log.warning("%s %r run %d: closing failed (%s); activating it again",
                        self.entity_type, self.key, self._run_id, err)
            await self._evict()

    async def _evict(self, *, suspension: Suspension | None = None) -> None:
        """Drop this activation and its in-memory state (the run stays running, and
        recovery replays its journal), then bring the entity back: the one eviction path.

        Without `suspension` the failure was not the entity's (the store's, or the
        host's): it comes back after the type's longest backoff, or sooner with the next
        message. With one (a bug: `run()` raised, the activation cannot be built) the
        shard holds it out of memory until the suspension's next attempt (`_suspension`).
        """
        if suspension is None:
            lifecycle("activation suspended", self.entity_type, self.key, self._run_id,
                      retry_in=self.definition.retry.max_backoff)
        worker = self._worker
        if worker is not None and worker is not asyncio.current_task():
            worker.cancel()
        self._finish()
        if suspension is None:
            self._home.activate_later(self.definition.retry.max_backoff)
        else:
            traces.suspended(self.trace, suspension)
            await record_suspension(self._home, suspension)

    async def _close(self, status: RunStatus, result: str | None, error: str | None) -> None:
        """Close the run once every message accepted before the close is applied."""
        self._enter(Phase.CLOSING)
        await self.ready_to_send()
        sends = self.take_outgoing()
        try:
            if not await self._close_when_applied(status, result, error, sends):
                return  # terminated while we waited
        except BaseException as err:
            self.unwritten(sends, err)
            raise
        self.written(sends)
        self._closed(status.value, EntityTerminatedError,
                     f": run {self._run_id} closed as {status.value}")
        if self._worker is None:
            self._finish()

    async def _close_when_applied(self, status: RunStatus, result: str | None,
                                  error: str | None, sends: tuple[Send, ...]) -> bool:
        """Retry the close (with the run's last `sends`) until no message accepted
        before it is left unapplied; False if the run was terminated meanwhile."""
        while not await self._home.store.close_run(
                self._home.fence, self.entity_type, self.key, self._run_id,
                applied_seq=self.applied_seq, status=status, result=result, error=error,
                pending=self.untaken(), sends=sends, state=self._final_state()):
            # Messages were accepted meanwhile: let the worker apply them, then retry.
            late = await self._home.store.journal(
                self.entity_type, self.key, run_id=self._run_id, after_seq=self.applied_seq
            )
            for entry in late:
                self.queue(entry)
            if late:
                await self.wait_applied(late[-1].seq)
            if self._phase is not Phase.CLOSING:  # terminated while we waited
                return False
        return True

    def _final_state(self) -> bytes | None:
        """The state the close keeps (guarantee 16); None if it does not encode (then the
        run's latest snapshot stands for it, and the failure is logged)."""
        assert self.entity is not None
        try:
            return capture(self.definition, self.entity)
        except Exception as err:
            log.warning("%s %r run %d: its final state is not kept (%s: %s); queries read "
                        "its latest snapshot", self.entity_type, self.key, self._run_id,
                        type(err).__name__, err)
            return None

    def _closed(self, status: str, error: type[CorralError], why: str, **fields: Any) -> None:
        """The run is closed: say so, and fail the updates still waiting on it with
        `error` (its message: the entity, then `why`). A terminate whose settling was
        cancelled (the activation stopping) says so too, as before, but moves nothing."""
        if self._phase not in (Phase.CLOSED, Phase.STOPPING, Phase.FINISHED):
            self._enter(Phase.CLOSED)
        lifecycle("run closed", self.entity_type, self.key, self._run_id, status=status,
                  **fields)
        self._home.fail_waiters(self._run_id, error, f"{self.entity_type} {self.key!r}{why}")

    async def _continue(self, next_input: object, watermark: int, *,
                        abort_handler: bool) -> None:
        """Continue-as-new at `watermark`: close this run and open the next in one
        transaction that carries every entry after it; the next run is loaded anew.

        `next_input` was built from state that had seen exactly the entries up to
        `watermark`. A handler still running then (an async handler parked in an
        await) is cancelled: its entry is after the watermark, so it is carried and
        applied, from its start, by the next run; its caller gets that result.
        """
        try:
            text = encode_start(self.definition, next_input)
        except InvalidPayloadError as err:
            await self._close(RunStatus.FAILED, None, f"continue_as_new: {err}")
            return
        worker = self._worker
        if worker is not None and worker is not asyncio.current_task():
            if abort_handler:
                worker.cancel()
            await asyncio.wait([worker])  # otherwise it stops before its next entry
        assert self.entity is not None
        await self.ready_to_send()
        carried, sends = self.untaken(), self.take_outgoing()
        try:
            await self._home.store.continue_as_new(
                self._home.fence, self.entity_type, self.key, self._run_id,
                applied_seq=watermark, next_input=text, carried=carried,
                sends=sends)
        except BaseException as err:
            self.unwritten(sends, err)
            if not isinstance(err, (EntityNotRunningError, LeaseLostError)):
                raise
            log.warning("%s %r: continue-as-new not done: %s", self.entity_type, self.key, err)
            self._finish()
            return
        self._enter(Phase.CLOSED)
        self.written(sends)
        metrics.continued(self.entity_type)
        lifecycle("continue-as-new", self.entity_type, self.key, self._run_id,
                  next_run=self._run_id + 1, carried=len(carried))
        self._finish()
        self._home.activate()

    async def wait_applied(self, seq: int) -> None:
        """Wait until every entry up to `seq` is applied (or the run closed)."""
        await self.wait_for(
            lambda: self.applied_seq >= seq or self._phase in (Phase.CLOSED, Phase.FINISHED),
            None
        )

    async def _settle_applied_terminate(self, entry: JournalEntry) -> None:
        """Everything before the terminate is applied: snapshot at it (so that no later
        activation takes an older snapshot for this run's watermark) and keep the
        mailbox payloads `run()` never took as dead letters of the run."""
        try:
            await self.snapshot()
        except StoreError:
            raise
        except Exception as err:  # state that cannot be captured: the journal decides
            log.warning("%s %r: no snapshot at terminate (%s: %s)", self.entity_type,
                        self.key, type(err).__name__, err)
        await self._home.store.settle_run(
            self._home.fence, self.entity_type, self.key, self._run_id,
            applied_seq=entry.seq, pending=self.untaken(), failed_at=self.now())

    def _terminated(self, reason: str) -> None:
        if self._run_task is not None and self._run_task is not asyncio.current_task():
            self._run_task.cancel()
        self._closed("terminated", EntityTerminatedError,
                     f" terminated: {decode_value(reason, str)}")

    def _finish(self, *, forward_all: bool = False) -> None:
        """Drop the activation (from any phase; again: nothing). Unless it was stopped,
        its inbox's entries of a newer run (`forward_all`: all) go to the shard."""
        was = self._phase
        if was is Phase.FINISHED:
            return
        if self._run_task is not None and self._run_task is not asyncio.current_task():
            self._run_task.cancel()
        if was is Phase.CLOSED and self._resuming:  # the run ended: nothing is suspended
            self._home.release(self._run_id)
        self._enter(Phase.FINISHED)
        self.notify()  # waits that hold for a finished activation (wait_applied) return
        self._home.forget(self)
        if was is not Phase.STOPPING and self._inbox:  # a newer run's go to its activation
            for entry in self._inbox:
                if forward_all or entry.run_id > self._run_id:
                    self._home.route(entry)
        self._inbox = None


# One `_apply_<kind>` per journal entry kind, in the order of `EntryKind`.
_APPLY: dict[EntryKind, Callable[[Activation, JournalEntry, bool], Awaitable[None]]] = {
    EntryKind.SIGNAL: Activation._apply_signal,
    EntryKind.UPDATE: Activation._apply_update,
    EntryKind.TERMINATE: Activation._apply_terminate,
    EntryKind.START: Activation._apply_mark,
    EntryKind.DELIVER: Activation._apply_deliver,
    EntryKind.RESUME: Activation._apply_mark,
}
