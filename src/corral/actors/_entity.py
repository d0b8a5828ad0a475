"""The `Entity` base class: the programming model users subclass."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, NoReturn, TypeVar, overload

from pydantic import BaseModel
from typing_extensions import TypeVarTuple, Unpack

from corral._common import (
    DEFAULT_RUN_RETRY,
    ContinueAsNewPolicy,
    DedupeWindow,
    IdReusePolicy,
    Retention,
    RetryPolicy,
    SnapshotPolicy,
)
from corral._errors import InvalidArgumentError

from ._context import EntityContext, Mailbox
from ._control import ContinueAsNew
from ._definition import EntityDefinition, define_entity
from ._waits import SignalWait, WaitHandle, check_wait_timeout

__all__ = ["Entity"]

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")
E = TypeVar("E", bound="Entity")
Ts = TypeVarTuple("Ts")
_NO_START: Any = object()  # `send` without `start`: a plain signal


class Entity:
    """A long-lived, addressable object identified by a business key.

    Subclass it, declare handlers with `@corral.signal`, `@corral.update` and
    `@corral.query`, and optionally an `async def run(self)` main loop. The host calls
    `__init__(start_input)` (taking one pydantic model, or nothing) before any handler,
    then replays the entity's journal, then starts `run()`.

    `run()` is restartable: after a crash it is called again from the top with the
    rebuilt state, so loop over state (`self.inbox`), never over local variables.

    Example:
        class Cart(corral.Entity):
            def __init__(self, init: CartInput) -> None:
                self.items: list[Item] = []

            @corral.signal
            def add(self, item: Item) -> None:
                self.items.append(item)

            @corral.query
            def total(self) -> Total:
                return Total(count=len(self.items))
    """

    id_reuse: ClassVar[IdReusePolicy] = IdReusePolicy.ALLOW_DUPLICATE
    """What `*_with_start` does once a run closed (see `IdReusePolicy`)."""

    snapshots: ClassVar[SnapshotPolicy] = SnapshotPolicy()
    """When state is snapshotted and how many snapshots are kept (see `SnapshotPolicy`)."""

    continue_as_new_policy: ClassVar[ContinueAsNewPolicy] = ContinueAsNewPolicy()
    """Thresholds for `continue_as_new_suggested` (see `ContinueAsNewPolicy`)."""

    retry: ClassVar[RetryPolicy] = RetryPolicy()
    """How often a raising signal handler is retried before its message is dead-lettered
    (see `RetryPolicy`). Update handlers are never retried: the caller gets the error."""

    run_retry: ClassVar[RetryPolicy] = DEFAULT_RUN_RETRY
    """How a suspended run is retried. An exception escaping `run()` (or the building of
    an activation: the start input, `__init__`, the snapshot) does not fail the run: it
    is suspended (still running, messages still accepted and journaled, not applied
    until the next attempt), and retried from its latest snapshot after this policy's
    backoff, until it gets past the point. Each attempt applies the kept signals and
    updates (an update is answered then) before calling `run()` again. Default:
    forever, 1 s doubling up to 60 s. `ref.resume()` or a host started with fixed code
    retries at once."""

    fail_on: ClassVar[tuple[type[Exception], ...]] = ()
    """Exception types that fail the run (closed as failed, for good) instead of
    suspending it, as `raise corral.FailRun("reason")` does."""

    dedupe_window: ClassVar[DedupeWindow] = DedupeWindow()
    """How many and how old message ids are remembered for deduplication."""

    idle_timeout: ClassVar[float | None] = None
    """Seconds idle before the entity is snapshotted and evicted from memory (None: never).

    Its run stays running; the next message, update, query or due timer brings it back.
    """

    max_backlog: ClassVar[int | None] = None
    """Backpressure: at most this many signals accepted but not yet applied (None: no
    bound, the default). A signal over it is refused before anything is stored with
    `corral.EntityOverloadedError` (retryable, with a suggested `retry_after`), or kept
    as a dead letter with `overflow = "dead_letter"`.

    Checked inside the accepting transaction, against the entity's accepted seq minus
    the applied watermark the accepting process knows: exact where it hosts the entity
    (always on Ray), else the latest snapshot's (at most `snapshots.every` applied
    messages behind), so a pure client may be refused early, never admitted past it.
    Updates, terminations and deliveries are never refused by it. The bound is the
    sending process's definition of the type.
    """

    retention: ClassVar[Retention | None] = None
    """Purge closed runs older than `Retention.closed_for` with all their rows (None:
    keep them forever, the default). See `corral.Retention`."""

    overflow: ClassVar[str] = "refuse"
    """What a signal over `max_backlog` does: `"refuse"` (raise `EntityOverloadedError`,
    nothing stored) or `"dead_letter"` (kept as a dead letter with the reason, answered
    `Ack(status="dead_lettered")`, for senders that cannot retry; an operator may replay it)."""

    early_signals: ClassVar[str] = "buffer"
    """A `deliver` made before `run()` reaches its wait: `"buffer"` keeps it (answered
    `buffered`; it wins when `run()` gets there) or `"reject"` refuses it (answered
    `not_waiting`; nothing is kept)."""

    placement: ClassVar[str] = "shared"
    """Ray backend only: `"shared"` hosts the entity with many others in its key's shard
    actor; `"dedicated"` gives each entity of the type its own Ray actor (for entities
    holding something heavy, such as a model on a GPU). Same guarantees either way."""

    ray_options: ClassVar[dict[str, Any]] = {}
    """Ray resources of each dedicated actor: `num_cpus`, `num_gpus`, `memory`,
    `resources`, `accelerator_type`, `runtime_env` (with `placement = "dedicated"`)."""

    state_version: ClassVar[int] = 1
    """The version of this class's state; raise it when a change needs an
    `@corral.upgrade(from_version=...)` hook (a rename, a type change, a split).
    Adding or removing an attribute, or an optional model field, needs neither."""

    _corral_definition: ClassVar[EntityDefinition]
    _corral_context: EntityContext
    _corral_init_attrs: frozenset[str]
    """The attributes `__init__` set (unannotated ones may be snapshotted as JSON)."""
    mailbox: Mailbox
    """Payloads of mailbox signals (declared as `name = corral.signal(Model)`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The frame defining the class, so annotations may name models local to it.
        localns = sys._getframe(1).f_locals
        custom = (cls.__getstate__ is not Entity.__getstate__
                  or cls.__setstate__ is not Entity.__setstate__)
        cls._corral_definition = define_entity(cls, localns, has_run=cls.run is not Entity.run,
                                               custom_state=custom)

    async def run(self) -> Any:
        """The main loop. The default keeps the entity alive until it is terminated."""
        await self.wait_for(lambda: False)

    async def wait_for(
        self, predicate: Callable[[], object], *, timeout: float | None = None
    ) -> bool:
        """Wait until `predicate()` is truthy; re-checked after every applied message.

        Returns True when the predicate holds, False when `timeout` seconds passed first.
        """
        return await self._corral_context.wait_for(predicate, timeout)

    async def sleep(self, seconds: float) -> None:
        """Sleep under a durable timer: a due timer reactivates a passivated or crashed entity.

        After a crash or passivation, `run()` restarts from the top, so a sleep is not
        resumed mid-way: keep deadlines in state and sleep until them.

        Example:
            async def run(self) -> None:
                if self.reminder_at is None:
                    self.reminder_at = self.now() + 3600
                    await self.checkpoint()
                await self.sleep_until(self.reminder_at)  # the remainder after a restart
                ...
        """
        await self._corral_context.sleep_until(self.now() + seconds)

    async def wait_for_signal(self, wait: WaitHandle[Any, M], *,
                              timeout: float | None = None) -> M:
        """Wait for the delivery that closes the durable signal wait `wait` of this run.

        `wait` is declared on the class (`approval = corral.wait(Decision)`); a caller
        closes it with `ref.deliver(Order.approval, payload, key=...)`, once. Durable:
        it survives passivation, crashes and restarts; the timeout is a durable timer
        whose deadline is fixed when `run()` first reaches the wait. Because `run()`
        restarts from the top, waiting again on a wait already delivered in this run
        returns the same payload at once. A wait belongs to its run: the run's end
        (including continue-as-new) closes it.

        Raises:
            SignalTimeoutError: `timeout` seconds passed first; the wait is closed for
                good in this run (waiting on it again raises again).
            InvalidArgumentError: `wait` is not declared on this type, or `timeout` is
                not None nor between 1 ms and the wait's `max_timeout` (7 days).

        Example:
            async def run(self) -> Outcome:
                decision = await self.wait_for_signal(Order.approval, timeout=86400)
                return Outcome(approved=decision.approved)
        """
        if not isinstance(wait, SignalWait) or not wait.belongs_to(type(self)):
            raise InvalidArgumentError(
                f"{wait!r} is not a wait of {type(self).__name__} (its waits: "
                f"{sorted(self._corral_definition.waits)}); declare it on the class with "
                "corral.wait(Model)")
        seconds = check_wait_timeout(wait.definition, timeout)
        text = await self._corral_context.wait_signal(wait.name, seconds)
        model: type[M] = wait.model
        return model.model_validate_json(text)

    def now(self) -> float:
        """The current wall-clock time, in seconds since the epoch, as the host sees it.

        Use it rather than `time.time()` for deadlines kept in state: under
        `corral.testing` it is the virtual clock that `advance()` moves.
        """
        return self._corral_context.now()

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until the wall-clock time `deadline` (seconds since the epoch), durably."""
        await self._corral_context.sleep_until(deadline)

    def continue_as_new(self, next_input: Any = None) -> NoReturn:
        """Close this run and start the next one with `next_input`, in one transaction.

        Call it from `run()`. The next run starts from `__init__(next_input)`; every
        message accepted but not yet consumed (including mailbox payloads `run()` has
        not taken) is carried over in order, and the dedupe window carries over.
        """
        raise ContinueAsNew(next_input)

    @property
    def continue_as_new_suggested(self) -> bool:
        """True once this run crossed a threshold of its `continue_as_new_policy`."""
        return self._corral_context.continue_as_new_suggested

    async def checkpoint(self) -> None:
        """Snapshot the state now (e.g. before an effect `run()` must not repeat).

        After a crash, `run()` restarts from the top with the state of the latest
        snapshot plus the messages applied after it. A checkpoint covers the steps
        completed before it: their records are deleted (keep what you need of their
        results in state first), and their names may be used again.
        """
        await self._corral_context.checkpoint()

    @overload
    async def step(self, fn: Callable[[Unpack[Ts]], Awaitable[R]], *args: Unpack[Ts],
                   name: str, retry: RetryPolicy | None = None, timeout: float | None = None,
                   ray_options: dict[str, Any] | None = None) -> R: ...
    @overload
    async def step(self, fn: Callable[[Unpack[Ts]], R], *args: Unpack[Ts], name: str,
                   retry: RetryPolicy | None = None, timeout: float | None = None,
                   ray_options: dict[str, Any] | None = None) -> R: ...
    async def step(self, fn: Callable[[Unpack[Ts]], Any], *args: Unpack[Ts], name: str,
                   retry: RetryPolicy | None = None, timeout: float | None = None,
                   ray_options: dict[str, Any] | None = None) -> Any:
        """Run an effect once: `fn(*args)` (sync or async), its result recorded in the
        store before `run()` goes on.

        A step is identified by its `name` within the run: give each effect its own
        (`name=f"reply:{reply.id}"`). When `run()` starts again (crash, passivation,
        takeover, suspension), a step that completed returns its recorded result (a
        step that failed for good raises its `StepFailedError` again) without calling
        `fn`. A step that was running when its host died runs again: at least once per
        attempt, so hand `corral.step_key()` to the outside system as an idempotency key.

        The result is stored as JSON and returned as `fn`'s return annotation
        rebuilds it (pydantic), on the first call as on a replay. A sync `fn` runs in a
        worker thread, so it blocks no other entity.

        Args:
            fn: the effect; called with `args` (positional only: bind keywords with
                `functools.partial`).
            name: the step's name, unique within the run until a `checkpoint()` covers
                it (reusing it before raises `DuplicateStepError`).
            retry: attempts and backoff (default `RetryPolicy()`: 3 attempts). Every
                exception `fn` raises is retried (`FailRun` too; it fails the run only
                if it escapes `run()`).
            timeout: seconds per attempt; an attempt over it counts as failed (a sync
                `fn`'s thread cannot be stopped: it finishes, its result unused).
            ray_options: run `fn` as a Ray task with these options (`num_gpus`,
                `resources`, ...), awaited without blocking the host: needs Ray
                initialised (the Ray backend, or `ray.init()`).

        Raises:
            StepFailedError: every attempt failed; the failure is recorded.
            DuplicateStepError: `name` was used already in this activation.
            InvalidArgumentError: a bad `name`, `timeout`, `retry` or `ray_options`, or
                a result that is not JSON data.

        Example:
            async def run(self) -> None:
                while self.inbox:
                    reply = self.inbox[0]
                    answer = await self.step(call_model, reply.text,
                                             name=f"model:{reply.id}", timeout=30)
                    self.answers.append(answer)
                    self.inbox.pop(0)
                    await self.checkpoint()
        """
        return await self._corral_context.step(fn, args, name=name, retry=retry,
                                               timeout=timeout, ray_options=ray_options)

    def send(self, entity_type: type[E], key: str, handler: Any, payload: Any = None, *,
             start: Any = _NO_START) -> None:
        """Message another entity exactly once, with this entity's progress.

        A signal to `entity_type` `key` (with `start`: a signal-with-start, which starts
        it if it is not running). Call it from `run()` or a signal or update handler.
        The message is checked here, as a client's `signal` would check it, and kept
        until this run's next progress is written: its next step's record, its next
        snapshot (`checkpoint()` or any other, one is taken when `run()` waits with
        sends kept, and once the host applied the queued messages after a handler
        that sent), or its end (return, continue-as-new), in that same transaction.
        After that commit this host delivers it with a message id derived from where
        it was made:
        `send:<type>/<key>/<run>/<n>` for `run()`'s n-th send,
        `send:<type>/<key>/<run>/<seq>.<i>` for the i-th send of the handler call that
        applied journal entry `seq`; so a delivery repeated after a crash, or a handler
        applied again from the journal, is a duplicate at the target; sends reach each
        target in the order they were made. A handler call that raises sends nothing.
        After a restart, a step that returns its recorded result drops the sends `run()`
        made (again) before it: `run()` must send the same messages before the same
        step, as it must make the same steps. To ask another entity for an answer, call
        its update inside a step.

        Raises:
            InvalidArgumentError: not an entity class, or not called from `run()` or a
                signal or update handler.
            InvalidKeyError, UnknownHandlerError, InvalidPayloadError: as `signal` does.

        Example:
            async def run(self) -> None:
                ...
                if answer.needs_human:
                    self.send(Escalation, self.key, Escalation.open,
                              Reason(text=answer.text), start=EscalationInput(team="l2"))
                    await self.checkpoint()
        """
        self._corral_context.send(entity_type, key, handler, payload,
                                  None if start is _NO_START else start,
                                  start is not _NO_START)

    def __getstate__(self) -> dict[str, Any]:
        """The instance's attributes minus the host's context and the mailbox.

        Snapshots do not call this unless a class overrides `__getstate__` or
        `__setstate__`: then it is the escape hatch, and its state is whatever
        `__getstate__` returns, which must be JSON data (dicts, lists, str, numbers,
        bool, None). On restore the host calls `__init__(start_input)` and then
        `__setstate__` with that data, upgraded by the class's `@corral.upgrade` hooks.
        The mailbox is kept by the host either way.

        Example:
            def __getstate__(self) -> dict[str, Any]:
                return {"total": self.total}

            def __setstate__(self, state: dict[str, Any]) -> None:
                self.total = state["total"]
        """
        return {name: value for name, value in vars(self).items()
                if name != "mailbox" and not name.startswith("_corral")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def key(self) -> str:
        """This entity's business key, e.g. `"ticket-9104"`."""
        return self._corral_context.key

    @property
    def run_id(self) -> int:
        """The number of the current run (1 for the first, +1 for each new run)."""
        return self._corral_context.run_id
