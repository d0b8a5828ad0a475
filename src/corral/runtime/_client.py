"""The public client API: `open_runtime`, `Runtime` and `EntityRef`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from corral._common import RunStatus
from corral._errors import (
    CorralError,
    EntityFailedError,
    EntityNotRunningError,
    EntityTerminatedError,
    InvalidArgumentError,
    UpdateFailedError,
    WaitTimeoutError,
)
from corral.actors import (
    Entity,
    EntityDefinition,
    HandlerDefinition,
    HandlerKind,
)
from corral.persistence import (
    Acceptance,
    AcceptResult,
    DeadLetter,
    EntryKind,
    Store,
    canonical_json,
    open_sqlite_store,
    payload_hash,
)

from ._backend import Backend, LocalBackend
from ._boundary import Authorize, Boundary, Limits
from ._host import LocalHost
from ._results import Ack, EntityDescription, decode_value
from ._router import Router

__all__ = ["EntityRef", "Runtime", "open_runtime"]

E = TypeVar("E", bound=Entity)


class Runtime:
    """A connection to a corral deployment: validation, routing and a backend.

    Create it with `open_runtime`. `ref(Type, key)` addresses an entity; no lookup or
    existence check happens until you send.
    """

    def __init__(self, backend: Backend, router: Router, boundary: Boundary) -> None:
        self.backend = backend
        self.router = router
        self.boundary = boundary

    @property
    def store(self) -> Store:
        """The store this process opened (local backend only)."""
        if isinstance(self.backend, LocalBackend):
            return self.backend.store
        raise CorralError("this backend keeps its store inside the shard hosts")

    @property
    def host(self) -> LocalHost | None:
        """The shards this process hosts (local backend), else None."""
        return self.backend.host if isinstance(self.backend, LocalBackend) else None

    def ref(self, entity_type: type[E], key: str) -> EntityRef[E]:
        """A handle to the entity `key` of `entity_type` (validated, never looked up)."""
        definition = self.boundary.definition(entity_type)
        return EntityRef(self, definition, self.boundary.check_key(key))

    async def dead_letters(self, entity_type: type[Entity] | str | None = None,
                           key: str | None = None, *, limit: int = 100) -> list[DeadLetter]:
        """Dead letters across entities, oldest first: signals whose handler still raised
        after their type's `RetryPolicy` ran out.

        Args:
            entity_type: only this type (a registered class or its name).
            key: only entities with this key.
            limit: at most this many.

        Example:
            for dead in await rt.dead_letters(TicketAgent):
                print(dead.id, dead.key, dead.name, dead.error)
        """
        etype = None if entity_type is None else self.boundary.definition(entity_type).name
        checked = None if key is None else self.boundary.check_key(key)
        return await self.backend.dead_letters(etype, checked, _check_limit(limit))

    async def _accept(self, ref: EntityRef[Any], kind: EntryKind, name: str, payload: str,
                      message_id: str, sender: str | None, start: str | None) -> AcceptResult:
        acc = Acceptance(
            ref.definition.name, ref.key, ref.shard, kind, name, message_id, payload,
            payload_hash(name, payload), sender, start, ref.definition.id_reuse, time.time(),
        )
        return await self.backend.accept(acc)


class EntityRef(Generic[E]):
    """The address of one entity. Every send is durable when it returns.

    Example:
        ref = rt.ref(TicketAgent, "ticket-9104")
        ack = await ref.signal_with_start(TicketAgent.customer_reply, reply,
                                          start=TicketInput(tenant="acme"), message_id="m-1")
    """

    def __init__(self, runtime: Runtime, definition: EntityDefinition, key: str) -> None:
        self._rt = runtime
        self.definition = definition
        self.key = key
        self.shard = runtime.router.shard_of(definition.name, key)

    def __repr__(self) -> str:
        return f"EntityRef({self.definition.name}, {self.key!r})"

    # -- signals -------------------------------------------------------------------------

    async def signal_with_start(self, handler: Any, payload: Any = None, *, start: Any,
                                message_id: str | None = None, sender: str | None = None) -> Ack:
        """Deliver a signal, starting the entity first if it is not running (atomically).

        `start` is validated and sent every time; it is used only when a run starts.
        """
        return (await self._send(HandlerKind.SIGNAL, handler, payload, start=start,
                                 with_start=True, message_id=message_id, sender=sender))[0]

    async def signal(self, handler: Any, payload: Any = None, *,
                     message_id: str | None = None, sender: str | None = None) -> Ack:
        """Deliver a signal to the running entity; `EntityNotRunningError` if it is not."""
        return (await self._send(HandlerKind.SIGNAL, handler, payload, start=None,
                                 with_start=False, message_id=message_id, sender=sender))[0]

    # -- updates -------------------------------------------------------------------------

    async def update(self, handler: Any, payload: Any = None, *, update_id: str | None = None,
                     sender: str | None = None, timeout: float | None = None) -> Any:
        """Deliver an update and return the handler's result (deduplicated by `update_id`).

        Raises:
            UpdateFailedError: the handler raised. Updates are not retried and never
                dead-lettered (unlike signals, see `RetryPolicy`); the error is recorded,
                so retrying the same `update_id` raises it again.
        """
        return await self._update(handler, payload, None, False, update_id, sender, timeout)

    async def update_with_start(self, handler: Any, payload: Any = None, *, start: Any,
                                update_id: str | None = None, sender: str | None = None,
                                timeout: float | None = None) -> Any:
        """`update`, starting the entity first if it is not running (atomically)."""
        return await self._update(handler, payload, start, True, update_id, sender, timeout)

    async def _update(self, handler: Any, payload: Any, start: Any, with_start: bool,
                      update_id: str | None, sender: str | None, timeout: float | None) -> Any:
        timeout = _check_timeout(timeout)
        ack, h, mid = await self._send(HandlerKind.UPDATE, handler, payload, start=start,
                                       with_start=with_start, message_id=update_id,
                                       sender=sender)
        try:
            outcome = await asyncio.wait_for(
                self._rt.backend.wait_update(self.definition.name, self.key, mid), timeout)
        except asyncio.TimeoutError:
            raise WaitTimeoutError(
                f"update {h.name!r} {mid!r} of {self!r} was accepted but not applied within "
                f"{timeout:g} s; it stays accepted: ask again with the same update id",
                entity_type=self.definition.name, key=self.key, run_id=ack.run_id,
                message_id=mid) from None
        if outcome.error is not None:
            raise UpdateFailedError(f"update {h.name!r} of {self!r} failed: {outcome.error}",
                                    entity_type=self.definition.name, key=self.key,
                                    run_id=ack.run_id, message_id=mid)
        return decode_value(outcome.result, h.output_type)

    async def _send(self, kind: HandlerKind, handler: Any, payload: Any, *, start: Any,
                    with_start: bool, message_id: str | None, sender: str | None
                    ) -> tuple[Ack, HandlerDefinition, str]:
        with self._about(message_id):
            return await self._send_checked(kind, handler, payload, start=start,
                                            with_start=with_start, message_id=message_id,
                                            sender=sender)

    @contextlib.contextmanager
    def _about(self, message_id: object = None) -> Iterator[None]:
        """Fill in what a `CorralError` raised below leaves out: this entity and id."""
        try:
            yield
        except CorralError as err:
            err.entity_type = err.entity_type or self.definition.name
            err.key = err.key or self.key
            if err.message_id is None and isinstance(message_id, str):
                err.message_id = message_id
            raise

    async def _send_checked(self, kind: HandlerKind, handler: Any, payload: Any, *,
                            start: Any, with_start: bool, message_id: str | None,
                            sender: str | None) -> tuple[Ack, HandlerDefinition, str]:
        b = self._rt.boundary
        h = b.handler(self.definition, handler, (kind,))
        text = b.payload(h, payload)
        start_text = b.start_input(self.definition, start) if with_start else None
        mid = b.check_message_id(message_id,
                                 "update id" if kind is HandlerKind.UPDATE else "message id")
        who = await b.sender(sender, self.definition, self.key, kind.value, h.name)
        res = await self._rt._accept(self, EntryKind(kind.value), h.name, text, mid, who,
                                     start_text)
        ack = _ack(res)
        return ack, h, mid

    # -- reads ---------------------------------------------------------------------------

    async def query(self, handler: Any, payload: Any = None, *, sender: str | None = None,
                    activate: bool = False) -> Any:
        """Read state through a query handler.

        Answered by the live activation once everything accepted before the query is
        applied (read-your-writes). Where no activation is in memory (passivated,
        hosted by another process, or closed) a read-only replica is rebuilt from the
        latest snapshot and the journal after it, without activating the entity; state
        that only `run()` changed since that snapshot is not visible there. Pass
        `activate=True` to bring a passivated entity back and answer from live state.
        """
        with self._about():
            b = self._rt.boundary
            h = b.handler(self.definition, handler, (HandlerKind.QUERY,))
            text = b.payload(h, payload) if h.input_type is not None else None
            await b.sender(sender, self.definition, self.key, "query", h.name)
            text = await self._rt.backend.query(self.definition.name, self.key, h.name, text,
                                                activate=activate)
            return decode_value(text, h.output_type)

    async def describe(self) -> EntityDescription:
        """Status, current run, accepted and applied sequence, mailbox depth, run chain."""
        return await self._rt.backend.describe(self.definition.name, self.key)

    async def result(self, *, timeout: float | None = None) -> Any:
        """Wait for the latest run to close and return `run()`'s result.

        Raises:
            EntityFailedError: `run()` raised. EntityTerminatedError: it was terminated.
            TimeoutError: `timeout` seconds passed first.
        """
        waited = _check_timeout(timeout)
        seen: list[int] = []
        try:
            return await asyncio.wait_for(self._wait_result(seen), waited)
        except asyncio.TimeoutError:
            run = f"run {seen[-1]}" if seen else "its run"
            raise WaitTimeoutError(
                f"{self!r}: {run} did not close within {waited:g} s",
                entity_type=self.definition.name, key=self.key,
                run_id=seen[-1] if seen else None) from None

    async def _wait_result(self, seen: list[int]) -> Any:
        delay = 0.002
        ident: dict[str, Any] = {"entity_type": self.definition.name, "key": self.key}
        while True:
            run = await self._rt.backend.latest_run(self.definition.name, self.key)
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
            b = self._rt.boundary
            text = canonical_json(b.check_reason(reason))
            mid = b.check_message_id(message_id)
            who = await b.sender(sender, self.definition, self.key, "terminate", "terminate")
            res = await self._rt._accept(self, EntryKind.TERMINATE, "terminate", text, mid, who,
                                         None)
            return _ack(res)

    # -- dead letters (operators) ------------------------------------------------------

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        """This entity's dead letters, oldest first.

        A dead letter is a signal whose handler still raised after the type's
        `RetryPolicy` ran out; the entity went on with its next message. Updates are
        never dead-lettered (their caller gets `UpdateFailedError`).
        """
        return await self._rt.backend.dead_letters(self.definition.name, self.key,
                                                   _check_limit(limit))

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
        ident = _check_id(dead_letter_id)
        await self._rt.boundary.sender(sender, self.definition, self.key, "replay", "replay")
        res = await self._rt.backend.replay_dead_letter(self.definition.name, self.key, ident)
        return _ack(res)

    async def discard_dead_letter(self, dead_letter_id: int, *,
                                  sender: str | None = None) -> bool:
        """Delete a dead letter without delivering it; False if it was already gone.

        The `authorize` hook sees it as kind "discard".
        """
        ident = _check_id(dead_letter_id)
        await self._rt.boundary.sender(sender, self.definition, self.key, "discard", "discard")
        return await self._rt.backend.discard_dead_letter(self.definition.name, self.key, ident)


def _ack(res: AcceptResult) -> Ack:
    return Ack("duplicate" if res.duplicate else "accepted", res.entry.run_id, res.entry.seq,
               res.started)


def _check_id(dead_letter_id: object) -> int:
    if isinstance(dead_letter_id, bool) or not isinstance(dead_letter_id, int) \
            or not 0 < dead_letter_id < 2**63:
        raise InvalidArgumentError(f"a dead letter id is a positive int, got {dead_letter_id!r}")
    return dead_letter_id


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
        raise InvalidArgumentError(f"limit must be an int from 1 to 100000, got {limit!r}")
    return limit


def _check_timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) \
            or not 0 <= timeout < float("inf"):
        raise InvalidArgumentError(
            f"timeout must be None or a finite number of seconds >= 0, got {timeout!r}")
    return float(timeout)


@contextlib.asynccontextmanager
async def open_runtime(
    store: str | Store = "corral.db",
    *,
    entities: Sequence[type[Entity]],
    shards: int = 16,
    host: bool = True,
    authorize: Authorize | None = None,
    limits: Limits | None = None,
    lease_ttl: float = 10.0,
    poll_interval: float = 0.005,
    backend: str = "local",
    address: str | None = None,
    namespace: str = "corral",
    ray_options: Mapping[str, Any] | None = None,
) -> AsyncIterator[Runtime]:
    """Open a runtime on a store and, with `host=True`, host the shards free to take.

    Args:
        store: a SQLite path, `"sqlite:///path"`, `":memory:"` (non-durable), or a `Store`.
        entities: every entity type this process may address or host.
        shards: fixed for the life of a store (checked against it).
        host: whether this process takes shard leases and runs entities. Pure clients
            (scripts, web workers) may pass False: they accept, another process applies.
        authorize: hook that sees each call and returns the sender to record.
        limits: input limits (payload bytes, key length and pattern).
        lease_ttl: seconds a dead host keeps its shards before others take them.
        poll_interval: how often a host checks for messages other processes accepted.
        backend: `"local"` (this process hosts) or `"ray"`: every shard is a named,
            detached Ray actor (`corral/<namespace>/shard-<k>`) hosting it, created on
            first use; `host` is then ignored and `store` must be a file path that every
            shard actor can open. Ray is started (`ray.init(address=address,
            namespace=namespace)`) unless already initialized, and shut down on close
            only if started here. The shard actors tail the journal at most every
            50 ms (calls reach them directly; tailing only catches what a fenced-out
            predecessor accepted).
        address: Ray backend: `None` (local instance, or `RAY_ADDRESS`), `"auto"`, or
            `"ray://host:10001"`.
        namespace: Ray backend: the deployment's name; clients of one namespace share
            its shard actors.
        ray_options: Ray backend: extra Ray actor options for the shard actors, such as
            `{"runtime_env": {...}}` or `{"num_cpus": 1}` (default `num_cpus=0`).

    Example:
        async with corral.open_runtime("corral.db", entities=[TicketAgent]) as rt:
            await rt.ref(TicketAgent, "ticket-9104").signal_with_start(...)
    """
    definitions: dict[str, EntityDefinition] = {}
    for cls in entities:
        definition: EntityDefinition = cls._corral_definition
        if definitions.setdefault(definition.name, definition) is not definition:
            raise ValueError(f"two entity types are named {definition.name!r}")
    if backend == "ray":
        from ._ray import connect_ray  # imports Ray only when asked for

        if not isinstance(store, str):
            raise TypeError("the Ray backend takes the store as a path (each shard actor "
                            "opens it), not a Store object")
        ray_backend, placement = await connect_ray(
            store, definitions, shards=shards, address=address, namespace=namespace,
            lease_ttl=lease_ttl, poll_interval=poll_interval, actor_options=ray_options)
        try:
            yield Runtime(ray_backend, placement,
                          Boundary(definitions, limits or Limits(), authorize))
        finally:
            await ray_backend.close()
        return
    if backend != "local":
        raise ValueError(f"backend must be 'local' or 'ray', got {backend!r}")
    router = Router(shards)
    owned_store = isinstance(store, str)
    the_store: Store = await open_sqlite_store(store, shards=shards) if isinstance(store, str) \
        else store
    local: LocalHost | None = None
    local_backend: LocalBackend | None = None
    try:
        if host:
            local = LocalHost(the_store, router, definitions, lease_ttl=lease_ttl,
                              poll_interval=poll_interval)
            await local.start()
        local_backend = LocalBackend(the_store, definitions, local, router.shard_of)
        local = None  # the backend owns the host now
        yield Runtime(local_backend, router,
                      Boundary(definitions, limits or Limits(), authorize))
    finally:
        if local is not None:
            await local.close()
        if local_backend is not None:
            await local_backend.close()
        if owned_store:
            await the_store.close()
