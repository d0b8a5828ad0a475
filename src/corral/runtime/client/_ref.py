"""`EntityRef`: the typed address of one entity, and every call a caller makes on it.

Each call validates at the boundary, then goes to the `Backend` as one request record
(`_requests`; an `Acceptance` for a send) with JSON payloads: `backend.handle(request)`. The
overloads follow temporalio's `WorkflowHandle.signal` / `execute_update` /
`query`: a handler is matched as a method of the ref's entity type taking no payload or
one model, sync or async, so a handler of another type, a payload of the wrong model or
a start input of the wrong type is a type error at the call site.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar, overload

from pydantic import BaseModel, ValidationError

import corral.metrics as metrics
from corral._common import RunStatus
from corral._deadline import Expired, within
from corral._errors import (
    CorralError,
    EntityFailedError,
    EntityNotRunningError,
    EntityTerminatedError,
    InvalidArgumentError,
    QueryResultError,
    QueryTimeoutError,
    StoreUnavailableError,
    UpdateFailedError,
    WaitTimeoutError,
)
from corral._tracing import tracer
from corral.actors import EntityDefinition, HandlerDefinition, HandlerKind
from corral.actors._definition import MailboxHandler
from corral.actors._waits import WaitHandle
from corral.persistence import (
    Acceptance,
    AcceptResult,
    DeadLetter,
    DeliveryRequest,
    EntryKind,
    canonical_json,
    payload_hash,
)

from .._clock import Clock
from ._backend import Backend
from ._boundary import (
    Boundary,
    check_after_id,
    check_dead_letter_id,
    check_limit,
    check_run_id,
    check_timeout,
    new_message_id,
)
from ._inspection import EntityHistory, EntityState
from ._requests import (
    DeadLetters,
    Describe,
    DiscardDeadLetter,
    History,
    LatestRun,
    Query,
    ReplayDeadLetter,
    State,
    WaitUpdate,
)
from ._results import Ack, Delivery, EntityDescription, decode_value
from ._traces import accept_traced

__all__ = ["QUERY_TIMEOUT", "EntityRef"]

_SIGNAL = (HandlerKind.SIGNAL,)
_UPDATE = (HandlerKind.UPDATE,)

QUERY_TIMEOUT = 30.0
"""Seconds `EntityRef.query` waits for its answer by default (`timeout=`): a query
reads the caller's own writes, so it waits for them to be applied, and a blocked
handler must not hang every query of the process (`QueryTimeoutError`)."""

E_co = TypeVar("E_co", covariant=True)
"""The entity class a ref addresses."""
S = TypeVar("S")
"""Its start input model (None for an `__init__` without one)."""
P = TypeVar("P", bound=BaseModel)
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class _Runs(Protocol[R_co]):
    """An entity whose `run()` returns `R_co` (what `result()` returns)."""

    def run(self) -> Awaitable[R_co]: ...


class EntityRef(Generic[E_co, S]):
    """The address of one entity. Every send is durable when it returns.

    Typed by the entity class `E_co` and its start input `S` (`rt.ref(Ticket, key)` is
    an `EntityRef[Ticket, TicketInput]`): the type checker accepts only `E_co`'s own
    handlers, each with its own payload model (or a dict of its fields), a start input
    of `S`, and types `update`, `query` and `result` by what the handler or `run()`
    returns.

    Example:
        ref = rt.ref(TicketAgent, "ticket-9104")
        ack = await ref.signal_with_start(TicketAgent.customer_reply, reply,
                                          start=TicketInput(tenant="acme"), message_id="m-1")
    """

    __slots__ = ("_backend", "_boundary", "_clock", "definition", "key", "shard")
    _boundary: Boundary
    _backend: Backend
    _clock: Clock
    definition: EntityDefinition
    key: str
    shard: int

    def __init__(self, boundary: Boundary, backend: Backend, clock: Clock,
                 definition: EntityDefinition, key: str, shard: int) -> None:
        for name, value in (("_boundary", boundary), ("_backend", backend), ("_clock", clock),
                            ("definition", definition), ("key", key), ("shard", shard)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"an EntityRef is immutable ({name!r}): `Runtime.ref` hands "
                             "the same one to every caller of the same entity")

    def __repr__(self) -> str:
        return f"EntityRef({self.definition.name}, {self.key!r})"

    # -- starting ------------------------------------------------------------------------

    async def start(self, *, start: S | dict[str, Any], start_id: str | None = None,
                    sender: str | None = None) -> Ack:
        """Start a run if none is running, without delivering any message.

        For entities driven by `run()` alone (a reminder, a scheduled job). Idempotent by
        `start_id` like a message id (a retried start is answered `duplicate`; the same
        id with another start input raises `IdempotencyConflictError`), and it
        follows the type's `IdReusePolicy` like every start. `Ack.started` says whether
        this call started a run; a running entity is left as it is (the start input is
        ignored). The `authorize` hook sees it as kind "start".

        Example:
            ack = await rt.ref(Reminder, "invoice-77").start(
                start=ReminderInput(text="pay", delay=86400), start_id="invoice-77-created")
        """
        with self._about(start_id):
            b = self._boundary
            start_text = b.start_input(self.definition, start)
            mid = b.check_message_id(start_id, "start id")
            who = await b.sender(sender, self.definition, self.key, "start", "start")
            return ack(await self._accept(EntryKind.START, "", start_text, mid, who, start_text))

    # -- signals -------------------------------------------------------------------------

    @overload
    async def signal_with_start(self, handler: Callable[[E_co], object], payload: None = None, *,
                                start: S | dict[str, Any], message_id: str | None = None,
                                sender: str | None = None) -> Ack: ...
    @overload
    async def signal_with_start(self, handler: Callable[[E_co, P], object],
                                payload: P | dict[str, Any], *, start: S | dict[str, Any],
                                message_id: str | None = None,
                                sender: str | None = None) -> Ack: ...
    @overload
    async def signal_with_start(self, handler: MailboxHandler[E_co, P], payload: P | dict[str, Any],
                                *, start: S | dict[str, Any], message_id: str | None = None,
                                sender: str | None = None) -> Ack: ...
    async def signal_with_start(self, handler: Any, payload: Any = None, *, start: Any,
                                message_id: str | None = None, sender: str | None = None) -> Ack:
        """Deliver a signal, starting the entity first if it is not running (atomically).

        `start` is validated and sent every time; it is used only when a run starts.
        """
        return await self._signal(handler, payload, start, True, message_id, sender)

    @overload
    async def signal(self, handler: Callable[[E_co], object], payload: None = None, *,
                     message_id: str | None = None, sender: str | None = None) -> Ack: ...
    @overload
    async def signal(self, handler: Callable[[E_co, P], object], payload: P | dict[str, Any], *,
                     message_id: str | None = None, sender: str | None = None) -> Ack: ...
    @overload
    async def signal(self, handler: MailboxHandler[E_co, P], payload: P | dict[str, Any], *,
                     message_id: str | None = None, sender: str | None = None) -> Ack: ...
    async def signal(self, handler: Any, payload: Any = None, *,
                     message_id: str | None = None, sender: str | None = None) -> Ack:
        """Deliver a signal to the running entity; `EntityNotRunningError` if it is not."""
        return await self._signal(handler, payload, None, False, message_id, sender)

    async def _signal(self, handler: Any, payload: Any, start: Any, with_start: bool,
                      message_id: str | None, sender: str | None) -> Ack:
        """`signal` and `signal_with_start`: the hot path (`_send` with its context
        manager and `_accept` cost ~2 us more a call; updates use them)."""
        try:
            acc = await self.signal_acceptance(handler, payload, start, with_start,
                                               message_id, sender)
            traced = tracer()
            res = await (self._backend.handle(acc) if traced is None
                         else accept_traced(traced, self._backend, acc))
        except CorralError as err:
            _annotate(err, self, message_id, send=True)
            raise
        return ack(res)

    async def signal_acceptance(self, handler: Any, payload: Any, start: Any,
                                with_start: bool, message_id: str | None,
                                sender: str | None) -> Acceptance:
        """A signal checked at the boundary (handler, payload, start input, id, sender
        through the `authorize` hook), as the `Acceptance` the backend takes; nothing
        is sent. `signal`, `signal_with_start` and `Runtime.signal_many` build theirs here."""
        b, d = self._boundary, self.definition
        h = b.handler(d, handler, _SIGNAL)
        text = b.payload(h, payload)
        start_text = b.start_input(d, start) if with_start else None
        if message_id is None:  # made here, so no earlier acceptance can hold it
            mid, fresh = new_message_id(), self._backend.calls_once
        else:
            mid, fresh = b.check_message_id(message_id), False
        who = await b.sender(sender, d, self.key, "signal", h.name) \
            if sender is not None or b.authorizes else None
        return Acceptance(
            d.name, self.key, self.shard, EntryKind.SIGNAL, h.name, mid, text,
            payload_hash(h.name, text), who, start_text, d.id_reuse, self._clock.time(),
            fresh, d.max_backlog, d.overflow)

    # -- updates -------------------------------------------------------------------------

    @overload
    async def update(self, handler: Callable[[E_co], Awaitable[R]], payload: None = None, *,
                     update_id: str | None = None, sender: str | None = None,
                     timeout: float | None = None) -> R: ...
    @overload
    async def update(self, handler: Callable[[E_co], R], payload: None = None, *,
                     update_id: str | None = None, sender: str | None = None,
                     timeout: float | None = None) -> R: ...
    @overload
    async def update(self, handler: Callable[[E_co, P], Awaitable[R]], payload: P | dict[str, Any],
                     *, update_id: str | None = None, sender: str | None = None,
                     timeout: float | None = None) -> R: ...
    @overload
    async def update(self, handler: Callable[[E_co, P], R], payload: P | dict[str, Any], *,
                     update_id: str | None = None, sender: str | None = None,
                     timeout: float | None = None) -> R: ...
    async def update(self, handler: Any, payload: Any = None, *, update_id: str | None = None,
                     sender: str | None = None, timeout: float | None = None) -> Any:
        """Deliver an update and return the handler's result (deduplicated by `update_id`).

        Raises:
            UpdateFailedError: the handler raised. Updates are not retried and never
                dead-lettered (unlike signals, see `RetryPolicy`); the error is recorded,
                so retrying the same `update_id` raises it again.
        """
        return await self._update(handler, payload, None, False, update_id, sender, timeout)

    @overload
    async def update_with_start(self, handler: Callable[[E_co], Awaitable[R]], payload: None = None,
                                *, start: S | dict[str, Any], update_id: str | None = None,
                                sender: str | None = None, timeout: float | None = None) -> R: ...
    @overload
    async def update_with_start(self, handler: Callable[[E_co], R], payload: None = None, *,
                                start: S | dict[str, Any], update_id: str | None = None,
                                sender: str | None = None, timeout: float | None = None) -> R: ...
    @overload
    async def update_with_start(self, handler: Callable[[E_co, P], Awaitable[R]],
                                payload: P | dict[str, Any], *, start: S | dict[str, Any],
                                update_id: str | None = None, sender: str | None = None,
                                timeout: float | None = None) -> R: ...
    @overload
    async def update_with_start(self, handler: Callable[[E_co, P], R], payload: P | dict[str, Any],
                                *, start: S | dict[str, Any], update_id: str | None = None,
                                sender: str | None = None, timeout: float | None = None) -> R: ...
    async def update_with_start(self, handler: Any, payload: Any = None, *, start: Any,
                                update_id: str | None = None, sender: str | None = None,
                                timeout: float | None = None) -> Any:
        """`update`, starting the entity first if it is not running (atomically)."""
        return await self._update(handler, payload, start, True, update_id, sender, timeout)

    async def _update(self, handler: Any, payload: Any, start: Any, with_start: bool,
                      update_id: str | None, sender: str | None, timeout: float | None) -> Any:
        timeout = check_timeout(timeout)
        ack, h, mid = await self._send_update(handler, payload, start, with_start, update_id,
                                              sender)
        fields: dict[str, Any] = {"entity_type": self.definition.name, "key": self.key,
                                  "run_id": ack.run_id, "message_id": mid}
        try:
            outcome = await within(
                self._backend.handle(WaitUpdate(self.definition.name, self.key, self.shard, mid)),
                timeout)
        except Expired:
            raise WaitTimeoutError(
                f"update {h.name!r} {mid!r} of {self!r} was accepted but not applied within "
                f"{timeout:g} s; it stays accepted: ask again with the same update id",
                **fields) from None
        except TimeoutError as err:  # inside the wait (a driver's), not the caller's deadline
            if isinstance(err, CorralError):
                raise
            raise StoreUnavailableError(
                f"update {h.name!r} {mid!r} of {self!r} was accepted, but waiting for its "
                f"outcome failed ({type(err).__name__}: {err}); it stays accepted: ask "
                "again with the same update id", committed=True, **fields) from err
        if outcome.error is not None:
            raise UpdateFailedError(f"update {h.name!r} of {self!r} failed: {outcome.error}",
                                    entity_type=self.definition.name, key=self.key,
                                    run_id=ack.run_id, message_id=mid)
        return decode_value(outcome.result, h.output_type)

    async def _send_update(self, handler: Any, payload: Any, start: Any, with_start: bool,
                           update_id: str | None, sender: str | None
                           ) -> tuple[Ack, HandlerDefinition, str]:
        """Accept an update (its handler, payload, start input and id checked first)."""
        b = self._boundary
        with self._about(update_id):
            h = b.handler(self.definition, handler, _UPDATE)
            text = b.payload(h, payload)
            start_text = b.start_input(self.definition, start) if with_start else None
            mid = b.check_message_id(update_id, "update id")
            who = await b.sender(sender, self.definition, self.key, "update", h.name)
            res = await self._accept(EntryKind.UPDATE, h.name, text, mid, who, start_text)
            return ack(res), h, mid

    def _about(self, message_id: object = None, *, send: bool = True) -> _About:
        """Fill in what a `CorralError` raised inside leaves out: this entity and id; a
        refused send (`send`) is counted by its error's type."""
        return _About(self, message_id, send)

    async def _accept(self, kind: EntryKind, name: str, payload: str, message_id: str,
                      sender: str | None, start: str | None) -> AcceptResult:
        d = self.definition
        acc = Acceptance(d.name, self.key, self.shard, kind, name, message_id, payload,
                         payload_hash(name, payload), sender, start, d.id_reuse,
                         self._clock.time())
        traced = tracer()
        if traced is None:
            return await self._backend.handle(acc)
        return await accept_traced(traced, self._backend, acc)

    # -- durable signal waits ------------------------------------------------------------

    async def deliver(self, wait: WaitHandle[E_co, P], payload: P | dict[str, Any], *, key: str,
                      sender: str | None = None, run_id: int | None = None) -> Delivery[P]:
        """Close the durable signal wait `wait` of the entity's current run, once.

        `key` is the delivery's idempotency key (1-512 UTF-8 bytes): a retry with the same
        key, payload and sender is answered `duplicate` with the retained delivery, also
        after the entity moved on to its next run. Exactly one delivery wins a wait,
        across every process and node; see `Delivery.status` for every answer. The
        payload is validated against the wait's model before anything is stored. Pass
        `run_id` to address one run (a delivery meant for a run that continued as new
        is then `stale`, rather than buffered for the next run). The `authorize` hook
        sees it as kind "deliver"; the recorded sender is the one it returns.

        A `buffered` delivery (made before `run()` reached the wait) whose run continues
        as new first is carried into the next run, like a signal accepted but not yet
        consumed: that run's wait of the same name receives it, and a retry is
        `duplicate` with the next run's id. If its run ends any other way (completed,
        failed, terminated) it was never used, and a retry is answered `stale`.

        The wait's deadline is judged on the store's clock (PostgreSQL: the database
        server's; SQLite: the machine's), never on this process's: a caller whose clock
        is off neither times a wait out early nor beats a deadline that passed.
        `Delivery.delivered_at` is on the store's clock too.

        Raises:
            IdempotencyConflictError: `key` was delivered with another payload or sender.
            EntityNotRunningError: the entity is not running (and its last run never
                reached or buffered this wait).

        Example:
            outcome = await rt.ref(Order, "order-17").deliver(
                Order.approval, Decision(approved=True), key="click-8f2", sender="ana")
            if outcome.status == "already_delivered":
                print("decided already by", outcome.sender)
        """
        with self._about(key):
            b, d = self._boundary, self.definition
            w = b.wait(d, wait)
            text = b.wait_payload(w, payload)
            delivery_key = b.check_delivery_key(key)
            if run_id is not None:
                run_id = check_run_id(run_id)
            who = await b.sender(sender, d, self.key, "deliver", w.name)
            res = await self._backend.handle(DeliveryRequest(
                d.name, self.key, self.shard, w.name, delivery_key, text, who,
                d.early_signals, run_id, w.renamed_from))
            kept = res.wait
            if kept is None:
                return Delivery(res.status, None, None, None, None)  # type: ignore[arg-type]
            model: type[P] = w.model  # type: ignore[assignment]
            value = None if kept.payload is None else model.model_validate_json(kept.payload)
            return Delivery(res.status, value, kept.sender, kept.delivered_at,  # type: ignore[arg-type]
                            kept.run_id)

    # -- reads ---------------------------------------------------------------------------

    @overload
    async def query(self, handler: Callable[[E_co], R], payload: None = None, *,
                    sender: str | None = None, activate: bool = False,
                    timeout: float | None = QUERY_TIMEOUT) -> R: ...
    @overload
    async def query(self, handler: Callable[[E_co, P], R], payload: P | dict[str, Any], *,
                    sender: str | None = None, activate: bool = False,
                    timeout: float | None = QUERY_TIMEOUT) -> R: ...
    async def query(self, handler: Any, payload: Any = None, *, sender: str | None = None,
                    activate: bool = False, timeout: float | None = QUERY_TIMEOUT) -> Any:
        """Read state through a query handler.

        Answered by the live activation once everything accepted before the query is
        applied (read-your-writes). Where no activation is in memory (passivated,
        hosted by another process, or closed) a read-only replica is rebuilt from the
        latest snapshot and the journal after it, without activating the entity; state
        that only `run()` changed since that snapshot is not visible there (a finished
        entity's latest snapshot is its state as of the close: nothing is missing). Pass
        `activate=True` to bring a passivated entity back and answer from live state.

        Raises:
            QueryTimeoutError: no answer within `timeout` seconds (`QUERY_TIMEOUT`, 30,
                by default; None: no bound): a handler still applying what was
                accepted before the query is blocked, or the host is slow. Nothing
                changed; retryable.
        """
        waited = check_timeout(timeout)
        with self._about(send=False):
            b = self._boundary
            h = b.handler(self.definition, handler, (HandlerKind.QUERY,))
            # A query without a model answers to no payload; one given is refused.
            text = None if h.input_type is None and payload is None else b.payload(h, payload)
            await b.sender(sender, self.definition, self.key, "query", h.name)
            op = Query(self.definition.name, self.key, self.shard, h.name, text, activate)
            try:
                text = await within(self._backend.handle(op), waited)
            except Expired:
                raise QueryTimeoutError(
                    f"query {h.name!r} of {self!r} got no answer within {waited:g} s: what "
                    "was accepted for it before the query is not applied yet (a handler "
                    "blocked, the entity suspended, or its host slow); ask again later",
                    waited=waited or 0.0, entity_type=self.definition.name,
                    key=self.key) from None
            try:
                return decode_value(text, h.output_type)
            except ValidationError as err:
                raise QueryResultError(
                    f"{self!r}: query {h.name!r} answered a value that does not match its "
                    f"return annotation ({err.error_count()} error(s), the first: "
                    f"{err.errors()[0]['msg']} at {err.errors()[0]['loc']}); annotate the "
                    "state attribute it reads on the class, or return what the annotation "
                    "says", entity_type=self.definition.name, key=self.key) from None

    async def describe(self, *, sender: str | None = None) -> EntityDescription:
        """Status, current run, accepted and applied sequence, mailbox depth, run chain.

        The `authorize` hook sees it (as every read of this entity) as kind "read",
        with the read's name ("describe"); `sender` is the caller's claim.
        """
        await self._read(sender, "describe")
        return await self._backend.handle(Describe(self.definition.name, self.key, self.shard))

    async def _read(self, sender: str | None, name: str) -> None:
        """Ask the `authorize` hook about the read `name` of this entity (kind "read")."""
        with self._about(send=False):
            await self._boundary.permit(sender, self.definition.name, self.key, "read", name)

    async def history(self, *, limit: int = 100, after: str | None = None,
                      sender: str | None = None) -> EntityHistory:
        """The entity's runs (with start inputs and results), one page of its messages
        oldest first (each accepted, applied or dead-lettered, with its id, sender and
        time), its signal waits, its pending timers and its durable steps (`StepInfo`:
        attempts, duration, result or last error with its traceback, the Ray node a
        task ran on; a step still retrying too), read from the store without
        activating the entity. Pass `history.messages.next_cursor` as `after` for the
        next page. What the store no longer keeps is None (a message's name and payload
        once a snapshot covers it; messages the dedupe window forgot are gone).

        Raises:
            EntityNotRunningError: the entity was never started.
            UnauthorizedError: the `authorize` hook refused (kind "read").

        Example:
            h = await ref.history(limit=20)
            for m in h.messages.items:
                print(m.seq, m.name, m.status, m.sender)
            for s in h.steps:
                print(s.name, s.status, s.attempts, s.error)
        """
        limit, position = check_limit(limit), _seq_cursor(after)
        await self._read(sender, "history")
        return await self._backend.handle(History(
            self.definition.name, self.key, self.shard, limit, position))

    async def state(self, *, limit: int = 100, after: str | None = None,
                    sender: str | None = None) -> EntityState:
        """The latest snapshot's state of the current run, as JSON data, and one page of
        the run's messages accepted after it, with their payloads (`after`: the
        previous page's `pending.next_cursor`). Read from the store, without activating
        the entity; the state is as stored (before any upgrade hook).

        Raises:
            EntityNotRunningError: the entity was never started.
            UnauthorizedError: the `authorize` hook refused (kind "read").
        """
        limit, position = check_limit(limit), _seq_cursor(after)
        await self._read(sender, "state")
        return await self._backend.handle(State(
            self.definition.name, self.key, self.shard, limit, position))

    async def result(self: EntityRef[_Runs[R], Any], *, timeout: float | None = None,
                     sender: str | None = None) -> R:
        """Wait for the latest run to close and return `run()`'s result.

        Raises:
            EntityFailedError: `run()` raised. EntityTerminatedError: it was terminated.
            TimeoutError: `timeout` seconds passed first.
            UnauthorizedError: the `authorize` hook refused (kind "read").
        """
        waited = check_timeout(timeout)
        await self._read(sender, "result")
        seen: list[int] = []
        try:
            return await within(self._wait_result(seen), waited)
        except Expired:
            run = f"run {seen[-1]}" if seen else "its run"
            raise WaitTimeoutError(
                f"{self!r}: {run} did not close within {waited:g} s",
                entity_type=self.definition.name, key=self.key,
                run_id=seen[-1] if seen else None) from None

    async def _wait_result(self, seen: list[int]) -> Any:
        delay = 0.002
        ident: dict[str, Any] = {"entity_type": self.definition.name, "key": self.key}
        while True:
            run = await self._backend.handle(LatestRun(self.definition.name, self.key, self.shard))
            if run is None:
                raise EntityNotRunningError(
                    f"{self.definition.name} {self.key!r} was never started", **ident)
            seen.append(run.run_id)
            del seen[:-1]
            if run.status is RunStatus.COMPLETED:
                return decode_value(run.result, self.definition.result_type)
            if run.status is RunStatus.FAILED:
                raise EntityFailedError(f"{self!r} run {run.run_id} failed:\n{run.error}",
                                        run_id=run.run_id, **ident)
            if run.status is RunStatus.TERMINATED:
                raise EntityTerminatedError(
                    f"{self!r} run {run.run_id} was terminated: {decode_value(run.error, str)}",
                    run_id=run.run_id, **ident)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def terminate(self, reason: str = "", *, message_id: str | None = None,
                        sender: str | None = None) -> Ack:
        """Close the running run as terminated; messages not yet applied are not applied."""
        with self._about(message_id):
            b = self._boundary
            text = canonical_json(b.check_reason(reason))
            mid = b.check_message_id(message_id)
            who = await b.sender(sender, self.definition, self.key, "terminate", "terminate")
            res = await self._accept(EntryKind.TERMINATE, "terminate", text, mid, who,
                                         None)
            return ack(res)

    async def resume(self, *, message_id: str | None = None, sender: str | None = None) -> Ack:
        """Retry a suspended run now, rather than at its next attempt.

        A run whose `run()` raised (or whose activation could not be built) is suspended:
        still running, accepting messages, retried under the type's `run_retry`
        (`describe().suspension` says why and when). After deploying a fix, `resume()`
        makes the host retry it at once, from any process: it appends a `resume` mark to
        the journal (applied as nothing), which the shard's host receives like any
        message. On a run that is not suspended it changes nothing, so it is safe to
        repeat. The `authorize` hook sees it as kind "resume".

        Raises:
            EntityNotRunningError: the entity has no running run.

        Example:
            if (await ref.describe()).suspension is not None:
                await ref.resume()
        """
        with self._about(message_id):
            b = self._boundary
            mid = b.check_message_id(message_id)
            who = await b.sender(sender, self.definition, self.key, "resume", "resume")
            res = await self._accept(EntryKind.RESUME, "resume", canonical_json(None), mid,
                                     who, None)
            return ack(res)

    # -- dead letters (operators) ------------------------------------------------------

    async def dead_letters(self, *, limit: int = 100, after: int | None = None,
                           sender: str | None = None) -> list[DeadLetter]:
        """This entity's dead letters, oldest first (`after`: only ids above it, the
        cursor of the next page).

        A dead letter is a signal whose handler still raised after the type's
        `RetryPolicy` ran out; the entity went on with its next message. Updates are
        never dead-lettered (their caller gets `UpdateFailedError`).
        """
        limit, after = check_limit(limit), check_after_id(after)
        await self._read(sender, "dead_letters")
        return await self._backend.handle(DeadLetters(
            self.definition.name, self.key, limit, after, self.shard))

    async def replay_dead_letter(self, dead_letter_id: int, *,
                                 sender: str | None = None) -> Ack:
        """Deliver a dead letter's payload again as a new signal, and delete the dead letter.

        Both happen in one transaction; use it after fixing the handler. The signal goes
        to the running run (as a plain `signal`) with the message id
        `replay:<id>:<original message id>`, so a replay retried after a lost answer is
        answered `duplicate` and applied once. The recorded sender stays the original
        one; `sender` is the caller's claim for the `authorize` hook (kind "replay").

        A replay retried after it succeeded (the dead letter is gone by then) answers
        `Ack(status="duplicate")` with the first replay's acknowledgement, as long as
        that replay's id is in the entity's dedupe window.

        Raises:
            DeadLetterNotFoundError: this entity has no dead letter `dead_letter_id`
                (discarded, never there, or replayed so long ago that the replay's id
                left the dedupe window).
            EntityNotRunningError: the entity is not running; the dead letter stays.
            UnauthorizedError: the `authorize` hook refused.
        """
        ident = check_dead_letter_id(dead_letter_id)
        await self._boundary.sender(sender, self.definition, self.key, "replay", "replay")
        res = await self._backend.handle(ReplayDeadLetter(self.definition.name, self.key,
                                                       self.shard, ident))
        return ack(res)

    async def discard_dead_letter(self, dead_letter_id: int, *,
                                  sender: str | None = None) -> bool:
        """Delete a dead letter without delivering it; False if it was already gone.

        The `authorize` hook sees it as kind "discard".
        """
        ident = check_dead_letter_id(dead_letter_id)
        await self._boundary.sender(sender, self.definition, self.key, "discard", "discard")
        return await self._backend.handle(DiscardDeadLetter(self.definition.name, self.key,
                                                         self.shard, ident))


class _About:
    """`EntityRef._about`: a plain context manager (a `contextlib.contextmanager` costs
    ~1 us more, on every send)."""

    __slots__ = ("_message_id", "_ref", "_send")

    def __init__(self, ref: EntityRef[Any, Any], message_id: object, send: bool) -> None:
        self._ref, self._message_id, self._send = ref, message_id, send

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(err, CorralError):
            _annotate(err, self._ref, self._message_id, self._send)


def annotate_refusal(err: CorralError, ref: EntityRef[Any, Any], message_id: object) -> None:
    """`err` refusing a send to `ref`: filled in and counted as rejected."""
    _annotate(err, ref, message_id, send=True)


def _annotate(err: CorralError, ref: EntityRef[Any, Any], message_id: object,
              send: bool) -> None:
    """Fill in what `err` leaves out: the entity and the id; count a refused send."""
    if send:
        metrics.rejected(ref.definition.name, type(err).__name__)
    err.entity_type = err.entity_type or ref.definition.name
    err.key = err.key or ref.key
    if err.message_id is None and isinstance(message_id, str):
        err.message_id = message_id


def _seq_cursor(after: object) -> int:
    """A messages page's cursor (a seq, as its `next_cursor` gives it); 0 for None."""
    if after is None:
        return 0
    if not (isinstance(after, str) and after.isascii() and after.isdecimal()
            and len(after) <= 18):
        raise InvalidArgumentError(f"after must be a cursor a page gave, got {after!r:.60}")
    return int(after)


def ack(res: AcceptResult) -> Ack:
    """The caller's answer to an acceptance."""
    if res.dead_letter_id is not None:
        return Ack("dead_lettered", res.entry.run_id, 0, False, res.dead_letter_id)
    return Ack("duplicate" if res.duplicate else "accepted", res.entry.run_id, res.entry.seq,
               res.started)
