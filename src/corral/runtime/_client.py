"""The public client API: `open_runtime`, `Runtime` and `EntityRef`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar, overload

from prometheus_client.core import Metric

from corral._common import RunStatus
from corral._errors import CorralError, InvalidArgumentError, ShardCountError
from corral.actors import (
    Entity,
    EntityDefinition,
)
from corral.persistence import (
    Census,
    DeadLetter,
    Store,
    UnreadableRow,
    open_store,
)

from ._backend import Backend, LocalBackend
from ._boundary import Authorize, Boundary, Limits, check_after_id, check_limit, check_status
from ._builds import BuildInfo, BuildRegistration, build_infos, process_id
from ._clock import Clock, SystemClock
from ._host import LocalHost
from ._hosting import LOCAL, HostingKeeper, local_holder
from ._ops import DeadLetters, Entities, SignalWaits, TakeCensus
from ._options import check_runtime_options
from ._ref import EntityRef
from ._results import Ack, EntitySummary, Page, SignalWaitInfo, decode_cursor, encode_cursor
from ._router import Router
from ._signal_many import SignalItem, signal_many

__all__ = ["Runtime", "open_runtime"]

E = TypeVar("E", bound=Entity)
S = TypeVar("S")


_MAX_REFS = 16_384
"""Refs `Runtime.ref` keeps for reuse (~200 bytes each)."""


class Runtime:
    """A connection to a corral deployment: validation, routing and a backend.

    Create it with `open_runtime`. `ref(Type, key)` addresses an entity; no lookup or
    existence check happens until you send.
    """

    def __init__(self, backend: Backend, router: Router, boundary: Boundary,
                 clock: Clock | None = None) -> None:
        self.backend = backend
        self.router = router
        self.boundary = boundary
        self.clock: Clock = clock or SystemClock()
        # Refs handed out, by (id of the entity type object, key): a webhook handler
        # calls `ref` on every event, and building one (key check, routing hash) costs
        # more than the lookup. An entry holds the type object, so its id stays its own
        # while it is here. Cleared when full.
        self._refs: dict[tuple[int, str], tuple[object, EntityRef[Any, Any]]] = {}

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

    @overload
    def ref(self, entity_type: Callable[[], E], key: str) -> EntityRef[E, None]: ...
    @overload
    def ref(self, entity_type: Callable[[S], E], key: str) -> EntityRef[E, S]: ...
    def ref(self, entity_type: Any, key: str) -> EntityRef[Any, Any]:
        """A handle to the entity `key` of `entity_type` (validated, never looked up).

        Typed `EntityRef[Type, StartModel]` from the class and its `__init__`. Refs are
        immutable and cheap to ask for again: the runtime hands back the one it built
        for the same type and key while it keeps it (the last ~16,000).
        """
        # Only an exact str key is looked up: a str subclass's own __eq__ or __hash__
        # is never asked.
        ident = (id(entity_type), key)
        found = self._refs.get(ident) if type(key) is str else None
        if found is not None and found[0] is entity_type:
            return found[1]
        definition = self.boundary.definition(entity_type)
        key = self.boundary.check_key(key)
        ref: EntityRef[Any, Any] = EntityRef(
            self.boundary, self.backend, self.clock, definition, key,
            self.router.shard_of(definition.name, key))
        if type(key) is str:
            if len(self._refs) >= _MAX_REFS:
                self._refs.clear()
            self._refs[ident] = (entity_type, ref)
        return ref

    async def signal_many(self, items: Sequence[SignalItem]) -> list[Ack]:
        """Accept a batch of signals (mixed types and keys) in one call: one `Ack` per
        item, in batch order. For a stream consumer handing over a poll's worth of events.

        All or nothing: the local backend commits the batch in one transaction (one
        group commit). An item whose message id was accepted before (or earlier in the
        batch) is answered `duplicate`, as alone: resending a whole batch after a lost
        answer is safe. A bad item (invalid payload, unknown handler, refused sender)
        or one the store refuses (`IdempotencyConflictError`, `EntityNotRunningError`,
        `EntityClosedError`, `EntityOverloadedError`) refuses the batch with
        `BatchRefusedError`, naming the item's index; nothing of it was stored. Each
        entity's items are journaled in batch order.

        On Ray the batch is split by shard, each part committed by its shard's actor,
        all at once: atomic per shard, not across shards. When one part is refused,
        the others may have committed; resend the batch (same ids) without the refused
        item and the committed ones are answered `duplicate`.

        Args:
            items: at most 10,000 `corral.SignalItem`s.

        Example:
            acks = await rt.signal_many([
                corral.SignalItem(rt.ref(Ticket, f"ticket-{e.ticket}"), Ticket.reply,
                                  Reply(body=e.body), message_id=e.id,
                                  start=TicketInput(tenant=e.tenant))
                for e in poll])
        """
        return await signal_many(self.backend, items)

    async def dead_letters(self, entity_type: type[Entity] | str | None = None,
                           key: str | None = None, *, limit: int = 100,
                           after: int | None = None, sender: str | None = None
                           ) -> list[DeadLetter]:
        """Dead letters across entities, oldest first: signals whose handler still raised
        after their type's `RetryPolicy` ran out.

        Args:
            entity_type: only this type (a registered class or its name).
            key: only entities with this key.
            limit: at most this many.
            after: only ids above this one. Ids grow and are never reused, so the last
                id of a page is the cursor of the next.
            sender: the caller's claim, for the `authorize` hook (kind "read", name
                "dead_letters"; `key` "" for no key, `entity_type` "" for no type).

        Example:
            for dead in await rt.dead_letters(TicketAgent):
                print(dead.id, dead.key, dead.name, dead.error)
        """
        etype = None if entity_type is None else self.boundary.definition(entity_type).name
        checked = None if key is None else self.boundary.check_key(key)
        owner = None if etype is None or checked is None else self.router.shard_of(etype, checked)
        limit, start = check_limit(limit), check_after_id(after)
        await self.boundary.permit(sender, etype or "", checked or "", "read", "dead_letters")
        return await self.backend.run(DeadLetters(etype, checked, limit, start, owner))


    async def entities(self, entity_type: type[Entity] | str | None = None, *,
                       status: RunStatus | str | None = None, limit: int = 100,
                       after: str | None = None, key_prefix: str | None = None,
                       sender: str | None = None) -> Page[EntitySummary]:
        """Entities in (type, key) order, paged; indexed, so a page costs the same
        however many entities the store holds.

        Args:
            entity_type: only this type (a registered class or its name).
            status: only entities whose latest run has this status.
            limit: at most this many per page.
            after: the `next_cursor` of the previous page.
            key_prefix: only entities whose key starts with it (the walk filters on
                it: a page costs as many entities as the walk passes over).
            sender: the caller's claim, for the `authorize` hook (kind "read", name
                "entities", `key` "", `entity_type` "" for no type).

        Example:
            page = await rt.entities(TicketAgent, status="running")
            for e in page.items:
                print(e.key, e.run_id, e.accepted_seq, e.updated_at)

        An entity whose row does not decode (damaged, or written by hand) is left out of
        `items` and named in `page.unreadable`, with why.
        """
        etype = None if entity_type is None else self.boundary.definition(entity_type).name
        wanted = None if status is None else check_status(status)
        limit = check_limit(limit)
        position = decode_cursor(after, (str, str))
        prefix = None if key_prefix in (None, "") else \
            self.boundary.check_identifier(key_prefix, "key prefix")
        await self.boundary.permit(sender, etype or "", "", "read", "entities")
        rows = await self.backend.run(Entities(etype, wanted, limit + 1, position,
                                               key_prefix=prefix))
        last = rows[limit - 1] if len(rows) > limit else None
        return Page([r for r in rows[:limit] if isinstance(r, EntitySummary)],
                    None if last is None else encode_cursor((last.entity_type, last.key)),
                    tuple(r.error for r in rows[:limit] if isinstance(r, UnreadableRow)))

    async def signal_waits(self, entity_type: type[Entity] | str | None = None, *,
                           limit: int = 100, after: str | None = None,
                           sender: str | None = None) -> Page[SignalWaitInfo]:
        """Open durable signal waits, oldest first, paged (payloads are never shown).

        Args:
            entity_type: only this type (a registered class or its name).
            limit: at most this many per page.
            after: the `next_cursor` of the previous page.
            sender: the caller's claim, for the `authorize` hook (kind "read", name
                "signal_waits", `key` "", `entity_type` "" for no type).

        Example:
            page = await rt.signal_waits(Order)
            for w in page.items:
                print(w.key, w.name, "since", w.waiting_since, "until", w.deadline)
        """
        etype = None if entity_type is None else self.boundary.definition(entity_type).name
        limit = check_limit(limit)
        position = decode_cursor(after, (float, str, str, int, str))
        await self.boundary.permit(sender, etype or "", "", "read", "signal_waits")
        rows = await self.backend.run(SignalWaits(etype, limit + 1, position))
        items = [SignalWaitInfo.of(w) for w in rows[:limit]]
        last = rows[limit - 1] if len(rows) > limit else None
        cursor = None if last is None else encode_cursor(
            (last.opened_at or 0.0, last.entity_type, last.key, last.run_id, last.name))
        return Page(items, cursor)

    async def census(self) -> Census:
        """The whole deployment's numbers as its store holds them (entities by type and
        status, backlog and the oldest unapplied message, dead letters, open waits,
        suspended runs, live processes and shards held), aggregated in SQL, on every
        backend: the `corral_store_*` series of `corral metrics` and of the dashboard's
        `/metrics`.

        Example:
            c = await rt.census()
            print(sum(b.messages for b in c.backlog), "messages behind")
        """
        return await self.backend.run(TakeCensus())

    async def host_metrics(self) -> list[Metric]:
        """The `corral.metrics` series of the deployment's hosts that run outside this
        process, as Prometheus metric families: on Ray, every host actor's, pulled by
        one call each, each sample labelled `host` with the actor's name, and
        `corral_host_up{host}`; on the local backend none (a process that hosts counts
        into its own `corral.metrics.REGISTRY`). The dashboard's `/metrics` serves them.

        Example:
            text = corral.metrics.exposition(corral.metrics.merge(
                corral.metrics.REGISTRY.collect(), await rt.host_metrics()))
        """
        if isinstance(self.backend, LocalBackend):
            return []
        from ._ray_metrics import pull_hosts

        return await pull_hosts(self.backend.spec.namespace)  # type: ignore[attr-defined]

    async def builds(self, entity_type: type[Entity] | str | None = None) -> list[BuildInfo]:
        """The builds registered in the store (local backend), per type oldest first:
        fingerprint, state version, first and last seen, live processes, and whether
        the newest build of the type may run beside each (and why not).

        Example:
            for b in await rt.builds():
                print(b.entity_type, b.fingerprint, b.newest, b.compatible, b.why)
        """
        etype = entity_type if isinstance(entity_type, str) or entity_type is None \
            else self.boundary.definition(entity_type).name
        return await build_infos(self.store, etype)


LOCAL_SHARDS = 16
"""A local store's shard count when `open_runtime` is given none."""


@contextlib.asynccontextmanager
async def open_runtime(
    store: str | Store = "corral.db",
    *,
    entities: Sequence[type[Entity]],
    shards: int | None = None,
    host: bool = True,
    authorize: Authorize | None = None,
    limits: Limits | None = None,
    lease_ttl: float = 10.0,
    poll_interval: float = 0.005,
    backend: str = "local",
    address: str | None = None,
    namespace: str = "corral",
    ray_options: Mapping[str, Any] | None = None,
    env_vars: Mapping[str, str] | None = None,
    hosts: int | Mapping[str, int] | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[Runtime]:
    """Open a runtime on a store and, with `host=True`, host the shards free to take.

    Args:
        store: a SQLite path, `"sqlite:///path"`, `":memory:"` (non-durable), a
            PostgreSQL URL `"postgresql://user:pw@host:port/db"` (the `postgres` extra;
            for deployments on several machines), or a `Store`.
        entities: every entity type this process may address or host.
        shards: fixed for the life of a store (checked against it: another count is
            refused, `ShardCountError`). None: the store's own with a `Store`, else 16
            with the local backend; with `backend="ray"` the store's own count if it exists,
            else the running deployment's, else 256 (shards are what moves between
            nodes, so many more shards than host actors). At most `MAX_SHARDS` (4096).
        host: whether this process takes shard leases and runs entities. Pure clients
            (scripts, web workers) may pass False: they accept, another process applies.
        authorize: hook that sees each call and returns the sender to record.
        limits: input limits (payload bytes, key length and pattern).
        lease_ttl: seconds a dead host keeps its shards before others take them
            (> 0, at most 3600).
        poll_interval: how often a host checks for messages other processes accepted
            (seconds, > 0, at most 3600).
        backend: `"local"` (this process hosts) or `"ray"`: the shards are held by a few
            named, detached Ray host actors (by default one per node), which the
            deployment's placer (`corral/<namespace>/placer`) starts on first use and
            moves shards between as nodes join and leave; `host` is then ignored and
            `store` must be a PostgreSQL URL or a file path that every host actor can
            open (so one machine). Ray is started
            (`ray.init(address=address, namespace=namespace)`) unless already
            initialized, and shut down on close only if started here. The host actors
            tail the journal at most every 50 ms (calls reach them directly; tailing
            only catches what a fenced-out predecessor accepted). One store is hosted
            by one cluster: every process of a Ray deployment must reach the same Ray
            instance (`ray start --head` once, then `address="auto"`); a runtime whose
            Ray instance is another is refused with `StoreHostedElsewhereError`, as
            is a local host (`host=True`) beside a Ray deployment, or a Ray deployment
            beside local hosts. The host
            actors' `corral.*` log records (INFO and above, tracebacks included) reach
            this process's `logging` under the same logger names, while it is open;
            their lifecycle events (`corral.lifecycle`) only with
            `env_vars={"CORRAL_LIFECYCLE_EVENTS": "1"}`.
        address: Ray backend: `None` (local instance, or `RAY_ADDRESS`), `"auto"`, or
            `"ray://host:10001"`.
        namespace: Ray backend: the deployment's name (1-64 letters, digits, '.', '_'
            or '-', starting with a letter or digit); clients of one namespace share
            its host actors.
        ray_options: Ray backend: extra Ray actor options for the host actors, such as
            `{"runtime_env": {...}}` or `{"num_cpus": 1}` (default `num_cpus=0`).
        env_vars: Ray backend: environment variables of every actor this runtime
            creates (shared and dedicated; the Ray tasks of their steps inherit them),
            merged into `runtime_env["env_vars"]` of `ray_options`. None are forwarded
            by default: the actors do not see this process's `os.environ`. Names and
            values are str (no NUL, no "=" in a name). Actors already running keep the
            environment they were created with (`stop_ray_hosts`, or a roll with the
            same `runtime_env` in its `actor_options`, changes it).
        hosts: Ray backend: how many host actors hold the shards: an int (the total,
            spread over the alive nodes) or {node id: count} (other nodes: one);
            default one per alive node; at most one per shard. Given, it replaces
            the deployment's setting when this client connects (the placer starts or
            stops hosts and evens the shards out over them, a few moves per second).
        clock: local backend: the clock entities see (timers, deadlines, idle time,
            `Entity.now()`); `corral.testing` passes a virtual one. Default: the system's.

    Raises:
        InvalidArgumentError: an option that does not fit, before anything starts
            (a wrong type or a value out of the bounds above, two entity types of one
            name, an unknown `backend`; `address`, `ray_options`, `env_vars` or
            `hosts` with the local backend; with `backend="ray"`: a `Store` object, an
            in-memory store, or a `clock`). Also a `ValueError`.
        IncompatibleBuildError: local backend: this process's build of an entity type
            cannot run beside the newest one registered in the store (see `_builds`);
            nothing was registered or hosted.
        StoreHostedElsewhereError: hosts of another cluster (another Ray instance, or
            local hosts beside a Ray deployment, or the reverse) hold the store; the
            message names them and the fix. Nothing was stored; they keep working.

    Example:
        async with corral.open_runtime("corral.db", entities=[TicketAgent]) as rt:
            await rt.ref(TicketAgent, "ticket-9104").signal_with_start(...)
    """
    check_runtime_options(
        entities=entities, shards=shards, host=host, authorize=authorize, limits=limits,
        lease_ttl=lease_ttl, poll_interval=poll_interval, backend=backend, address=address,
        namespace=namespace, ray_options=ray_options, env_vars=env_vars, hosts=hosts,
        clock=clock)
    definitions: dict[str, EntityDefinition] = {}
    for cls in entities:
        definition: EntityDefinition = cls._corral_definition
        if definitions.setdefault(definition.name, definition) is not definition:
            raise InvalidArgumentError(f"two entity types are named {definition.name!r}")
    if backend == "ray":
        from ._ray import connect_ray  # imports Ray only when asked for
        from ._ray_logs import LogFollower

        if clock is not None:
            raise InvalidArgumentError("a clock is for the local backend (corral.testing)")
        if not isinstance(store, str):
            raise InvalidArgumentError("the Ray backend takes the store as a path or URL "
                                       "(each host actor opens it), not a Store object")
        ray_backend, placement = await connect_ray(
            store, definitions, shards=shards, address=address, namespace=namespace,
            lease_ttl=lease_ttl, poll_interval=poll_interval, actor_options=ray_options,
            env_vars=env_vars, hosts=hosts)
        follower = LogFollower(namespace)  # the host actors' logs, on this process's
        follower.start()
        try:
            yield Runtime(ray_backend, placement,
                          Boundary(definitions, limits or Limits(), authorize))
        finally:
            await follower.close()
            await ray_backend.close()
        return
    if isinstance(store, str):
        shards = LOCAL_SHARDS if shards is None else shards
        the_store: Store = await open_store(store, shards=shards)  # checks the count
    else:
        the_store, shards = store, _store_shards(store, shards)
    owned_store = isinstance(store, str)
    router = Router(shards)
    clock = clock or SystemClock()
    local: LocalHost | None = None
    local_backend: LocalBackend | None = None
    registration: BuildRegistration | None = None
    hosting: HostingKeeper | None = None
    try:
        if host:  # the store's claim for local hosts first: refused beside a Ray deployment
            hosting = HostingKeeper(the_store, cluster=LOCAL, holder=local_holder(),
                                    ttl=2 * lease_ttl)
            await hosting.open()
            local = LocalHost(the_store, router, definitions, lease_ttl=lease_ttl,
                              poll_interval=poll_interval, clock=clock)
        registration = BuildRegistration(  # refused here, before anything is hosted
            the_store, definitions, process=local.owner if local else process_id(),
            role="host" if local else "client", ttl=2 * lease_ttl)
        await registration.open()
        if local is not None:
            await local.start()
        local_backend = LocalBackend(the_store, definitions, local, router.shard_of, clock)
        local = None  # the backend owns the host now
        yield Runtime(local_backend, router,
                      Boundary(definitions, limits or Limits(), authorize), clock)
    finally:
        # Out of the registry first: a closing host is no heir (`live_hosts`) and no
        # host of an older build yields to it any more (`_newest`).
        if registration is not None:
            await registration.close()
        if local is not None:
            await local.close()
        if local_backend is not None:
            await local_backend.close()
        if hosting is not None:
            await hosting.close()
        if owned_store:
            await the_store.close()


def _store_shards(store: Store, shards: int | None) -> int:
    """The shard count to route by over an opened `store`: its own (`shards`, if given,
    must be it). A host routing by another would run the same keys as the store's."""
    if shards is not None and shards != store.shards:
        raise ShardCountError(
            f"shards={shards}, but {store!r} was created with shards="
            f"{store.shards}; the shard count is fixed when a store is created (pass "
            f"shards={store.shards}, or none: a Store's own count is used)",
            store_shards=store.shards, shards=shards)
    return store.shards
