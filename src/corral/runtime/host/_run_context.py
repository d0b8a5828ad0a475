"""`RunContext`: the `EntityContext` of one activation, as the entity's code sees it.

`run()` and the handlers reach their host through this: waits re-checked after every
applied entry, durable timers, durable signal waits, steps, sends, the clock
(`checkpoint()`, which snapshots, is the host side's). A send made in `run()` is kept
as it is; one made in a handler is kept apart until the call returns (dropped if it
raised) and carries the message id derived from the entry the call applied, which a
recovery that applies the entry again derives again. The run numbers its sends before
their first write (`take_outgoing`). The host side (the inbox, applying entries, loading
and closing the run) is `Activation`, which is a `RunContext`; this module names
neither it nor the shard, only their seam (`Residence`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from corral._common import RetryPolicy
from corral._errors import InvalidArgumentError
from corral._tracing import traceparent_of
from corral.actors import EntityDefinition
from corral.persistence import JournalEntry, Send, handler_send_id
from corral.persistence import timer_id as wait_timer_id

from ._outbox import outgoing
from ._residence import Residence, retrying
from ._signal_waits import RunWaits
from ._steps import RunSteps
from ._suspension import end_suspension
from ._traces import send_trace

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["RunContext"]

T = TypeVar("T")


class RunContext:
    """The waits, timers, steps, sends and progress counters of the run an activation hosts."""

    __slots__ = ("_bytes", "_cause", "_changed", "_first_seq", "_floor", "_handling",
                 "_home", "_inherited", "_outgoing", "_resuming", "_run_id", "_run_task",
                 "_sent", "_steps", "_timers", "_waiting", "_waits", "applied_seq",
                 "definition")

    def __init__(self, home: Residence) -> None:
        self._home = home  # the shard, as this entity sees it: its only way to the host
        self.definition: EntityDefinition = home.definition
        self._run_id = 0
        self.applied_seq = 0
        self._first_seq = 1  # this run's first journal seq
        self._floor = 0  # journal entries up to here are covered by kept snapshots
        self._bytes = 0  # payload bytes applied by this activation
        self._timers = 0
        # The durable timers an earlier activation of the run left (their rows stay, so
        # the pending deadline shows while `run()` restarts): replaced when `run()`
        # waits again, in the write of the timer it sets then (`_timed`), unless this
        # activation set the same id again.
        self._inherited: set[str] = set()
        self._waiting = 0  # coroutines parked in wait_until (run() waiting = idle)
        self._changed: asyncio.Event | None = None
        self._waits: RunWaits | None = None  # this run's signal waits, once it has any
        self._steps: RunSteps | None = None  # this run's durable steps, once it has any
        # Sends made since the last write of this run's progress (see `_outbox`), and
        # the number of the run's last send (None: not read from the store yet).
        self._outgoing: list[Send] = []
        self._sent: int | None = None
        # The handler call applying an entry now: its entry, its task, its sends so far.
        self._handling: _HandlerCall | None = None
        # Retrying a suspended run: the suspension ends when run() gets past the point.
        self._resuming = home.suspended() is not None
        self._run_task: asyncio.Task[None] | None = None
        # The cause of what the run does next (steps, sends: `_traces`): the span that
        # applied the last message (its traceparent formatted when first asked for,
        # most messages cause nothing), or a stored traceparent. None: untraced.
        self._cause: Span | str | None = None

    @property
    def entity_type(self) -> str:
        return self.definition.name

    @property
    def key(self) -> str:
        return self._home.key

    @property
    def run_id(self) -> int:
        return self._run_id

    @property
    def trace(self) -> str | None:
        """The traceparent of what the run does next (the `_cause`), or None."""
        cause = self._cause
        if cause is None or isinstance(cause, str):
            return cause
        self._cause = trace = traceparent_of(cause)
        return trace

    async def wait_for(self, predicate: Callable[[], object], timeout: float | None) -> bool:
        if predicate():
            return True
        if timeout is None:
            return await self.wait_until(predicate, None)
        return await self._timed(predicate, self.now() + timeout)

    async def sleep_until(self, deadline: float) -> None:
        await self._timed(lambda: False, deadline)

    async def _timed(self, predicate: Callable[[], object], deadline: float) -> bool:
        """Wait under a durable timer: if this activation dies (crash, passivation),
        the timer row stays and reactivates the entity when it is due."""
        self._timers += 1
        timer_id = f"{self._run_id}.{self.applied_seq}.{self._timers}"
        store, fence, etype, key, run_id = (self._home.store, self._home.fence,
                                            self.entity_type, self.key, self._run_id)
        self._inherited.discard(timer_id)
        replacing = self._replacing()
        await self._retrying("timer", lambda: store.set_timer(
            fence, etype, key, run_id, timer_id, deadline, replacing=replacing))
        self._inherited.difference_update(replacing)
        result = await self.wait_until(predicate, max(0.0, deadline - self.now()))
        await self._retrying("timer", lambda: store.set_timer(
            fence, etype, key, run_id, timer_id, None))
        return result

    def _replacing(self) -> tuple[str, ...]:
        """The inherited timers a wait of `run()` replaces now (none for a handler's)."""
        if not self._inherited or asyncio.current_task() is not self._run_task:
            return ()
        return tuple(sorted(self._inherited))

    async def _forget_inherited(self) -> None:
        """Clear the timers an earlier activation left: `run()` waits with no timer of
        its own (or the entity has no `run()`), so none of them is pending any more."""
        gone = tuple(sorted(self._inherited))
        if not gone:
            return
        home, run_id = self._home, self._run_id
        await self._retrying("timer", lambda: home.store.set_timer(
            home.fence, home.entity_type, home.key, run_id, gone[0], None,
            replacing=gone[1:]))
        self._inherited.difference_update(gone)

    async def _write_progress(self) -> None:
        """Write the run's progress now (the host's snapshot): its sends with it."""
        raise NotImplementedError

    def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        return retrying(self._home, self._run_id, what, call)

    async def wait_until(self, predicate: Callable[[], object], timeout: float | None) -> bool:
        """Until `predicate()` holds (re-checked after every applied entry) or `timeout`
        seconds pass on the host's clock; while parked, the entity counts as idle."""
        if self._outgoing and not predicate() and asyncio.current_task() is self._run_task:
            await self._write_progress()  # run() waits: its sends go now, not at its end
        if self._replacing() and not predicate():
            await self._forget_inherited()  # run() waits, and under no inherited timer
        clock = self._home.clock
        deadline = None if timeout is None else clock.monotonic() + timeout
        self._waiting += 1
        try:
            while not predicate():
                if self._resuming and asyncio.current_task() is self._run_task:
                    self._resuming = False
                    await end_suspension(self._home, self._run_id)  # run() waits: past the point
                    continue
                if self._changed is None:
                    self._changed = asyncio.Event()
                remaining = None if deadline is None else deadline - clock.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if not await clock.wait(self._changed, remaining):
                    return bool(predicate())
            return True
        finally:
            self._waiting -= 1

    async def wait_signal(self, name: str, timeout: float | None) -> str:
        self._inherited.discard(wait_timer_id(name))  # an open wait's row: kept (re-armed)
        if self._waits is None:
            self._waits = RunWaits(self._home, self)
        return await self._waits.wait(name, timeout)

    async def step(self, fn: Callable[..., Any], args: tuple[Any, ...], *, name: str,
                   retry: RetryPolicy | None, timeout: float | None,
                   ray_options: dict[str, Any] | None) -> Any:
        if self._steps is None:
            self._steps = RunSteps(self._home, self)
        return await self._steps.step(fn, args, name=name, retry=retry, timeout=timeout,
                                      ray_options=ray_options)

    def send(self, entity_type: type, key: str, handler: object, payload: object,
             start: object, with_start: bool) -> None:
        task, call = asyncio.current_task(), self._handling
        if self._run_task is not None and task is self._run_task:
            self._outgoing.append(self._traced(outgoing(entity_type, key, handler, payload,
                                                        start, with_start)))
        elif call is not None and task is call.task:
            message_id = handler_send_id(self.entity_type, self.key, self._run_id,
                                         call.entry_seq, len(call.sends) + 1)
            call.sends.append(self._traced(dataclasses.replace(
                outgoing(entity_type, key, handler, payload, start, with_start),
                message_id=message_id)))
        else:
            raise InvalidArgumentError(
                f"{self.entity_type} {self.key!r}: send() is called from run() or a signal "
                "or update handler")

    def _traced(self, send: Send) -> Send:
        """`send` with its span's traceparent (`_traces.send_trace`), if traced."""
        trace = send_trace(self.trace, send.target_type, send.target_key, send.name,
                           send.message_id)
        return send if trace is None else dataclasses.replace(send, trace=trace)

    def _handler_begins(self, entry: JournalEntry) -> None:
        """A handler is called for `entry` (again, after a failed attempt): what it
        sends is kept apart until it returns, numbered in this call from 1."""
        self._handling = _HandlerCall(entry.seq, asyncio.current_task())

    def _handler_ends(self, *, applied: bool) -> None:
        """The handler call is over: its sends join the run's if it `applied` its entry
        (the next write of progress takes them); a raising call's are dropped."""
        call, self._handling = self._handling, None
        if applied and call is not None:
            self._outgoing.extend(call.sends)

    def _handler_sends_kept(self) -> int:
        """How many sends made by handlers wait for a write of progress."""
        return sum(s.message_id is not None for s in self._outgoing)

    async def ready_to_send(self) -> None:
        """Read the number of the run's last send, once, if sends wait: `take_outgoing`
        numbers them after it, with no await between (see `Activation.snapshot`)."""
        while self._outgoing and self._sent is None:
            home = self._home
            last = await home.store.last_send(home.entity_type, home.key, self._run_id)
            if self._sent is None:
                self._sent = last

    def take_outgoing(self) -> tuple[Send, ...]:
        """The sends a write of this run's progress takes along, numbered (no other
        write takes them: two steps recorded at once must not both write one send).
        `ready_to_send()` came first; a send keeps its number when a refused write
        gives it back, so a write repeated after an unknown outcome writes it once."""
        sends = []
        for send in self._outgoing:
            if not send.seq:
                assert self._sent is not None, "ready_to_send() first"
                self._sent += 1
                send = dataclasses.replace(send, seq=self._sent)
            sends.append(send)
        self._outgoing.clear()
        return tuple(sends)

    def written(self, sends: tuple[Send, ...]) -> None:
        """The write that took `sends` committed: deliver them."""
        if sends:
            self._home.post(self._run_id)

    def unwritten(self, sends: tuple[Send, ...], err: BaseException) -> None:
        """The write that took `sends` failed. A refusal wrote nothing: the next write
        takes them again. A cancelled one may have committed: deliver what it wrote
        (the activation is ending; `run()` makes the rest again when it restarts)."""
        if not sends:
            return
        if isinstance(err, asyncio.CancelledError):
            self._home.post(self._run_id)
        else:
            self._outgoing[:0] = sends

    def forget_outgoing(self) -> None:
        """A step replayed: what `run()` sent before it was written with its progress
        then. A handler's sends stay: they are not `run()`'s to make again."""
        self._outgoing[:] = [s for s in self._outgoing if s.message_id is not None]

    def now(self) -> float:
        return self._home.clock.time()

    @property
    def continue_as_new_suggested(self) -> bool:
        p = self.definition.continue_as_new
        signals = self.applied_seq - self._first_seq + 1
        entries = self.applied_seq - max(self._first_seq - 1, self._floor)
        return any(limit is not None and value >= limit for value, limit in (
            (signals, p.max_signals), (entries, p.max_journal_entries),
            (self._bytes, p.max_journal_bytes),
        ))

    def notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _delivered(self, entry: JournalEntry) -> None:
        """A `DELIVER` entry: wake `run()` if it closed a wait of this run."""
        if self._waits is None:
            self._waits = RunWaits(self._home, self)
        if self._waits.delivered(entry):
            self.notify()


class _HandlerCall:
    """One call of a handler for a journal entry, and the sends it made so far."""

    __slots__ = ("entry_seq", "sends", "task")

    def __init__(self, entry_seq: int, task: asyncio.Task[Any] | None) -> None:
        self.entry_seq = entry_seq
        self.task = task
        self.sends: list[Send] = []
