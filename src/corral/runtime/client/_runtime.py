"""The public client API: `open_runtime`, `Runtime` and `EntityRef`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, overload

from prometheus_client.core import Metric

from corral._common import RunStatus
from corral.actors import (
    Entity,
)
from corral.persistence import (
    Census,
    DeadLetter,
    Store,
    UnreadableRow,
)

from .._build_registration import BuildInfo, build_infos
from .._clock import Clock, SystemClock
from ._backend import Backend, HostedShards
from ._boundary import Boundary, check_after_id, check_limit, check_status
from ._ref import EntityRef
from ._requests import DeadLetters, Entities, SignalWaits, TakeCensus
from ._results import Ack, EntitySummary, Page, SignalWaitInfo, decode_cursor, encode_cursor
from ._router import Router
from ._schedules import Schedules
from ._signal_many import SignalItem, signal_many

__all__ = ["Runtime"]

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
        self.schedules = Schedules(backend, boundary, self.clock)
        """Schedules: entities signalled on a calendar (`corral.Schedule`)."""

    @property
    def store(self) -> Store:
        """The store this process opened (local backend only)."""
        return self.backend.store

    @property
    def host(self) -> HostedShards | None:
        """The shards this process hosts (local backend), else None."""
        return self.backend.host

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
        limit, after_id = check_limit(limit), check_after_id(after)
        await self.boundary.permit(sender, etype or "", checked or "", "read", "dead_letters")
        return await self.backend.handle(DeadLetters(etype, checked, limit, after_id, owner))


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
        rows = await self.backend.handle(Entities(etype, wanted, limit + 1, position,
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
        rows = await self.backend.handle(SignalWaits(etype, limit + 1, position))
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
        return await self.backend.handle(TakeCensus())

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
        return await self.backend.host_metrics()

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
