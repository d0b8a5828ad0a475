"""The Ray side of the Ray backend: `ShardHost`, the body of every corral host actor.

A host actor runs the same pieces as a local host, in its own worker process: it opens
its own store (the deployment's PostgreSQL database, or its SQLite file on a one-machine
cluster), runs a `LocalHost` restricted to the shards assigned to it (`LocalHost.assign`:
it never takes a free shard), and runs each request record a client sends
(`handle(op)`) through a `LocalBackend`. Which actor holds which shard is the placer's
decision (`_placer`), recorded in the directory (`_directory`) that clients
route by; a shard moves between actors only through the graceful hand-off (`take` on
the receiver, `retire` on the old holder).
At start, a host actor takes the shards the directory names it for with
`takeover=True`, before it serves a single call: Ray maps an actor name to one live
incarnation, so a restarted actor fences out its predecessor (a zombie may still run)
by taking a new epoch at once instead of waiting for the old lease to expire.

Dedicated entities (`placement = "dedicated"`) get a pseudo-shard index of their own,
beyond the shard count, derived from a hash of (type, key) (`PlacementRouter`), and an
actor of their own (`corral/<ns>/dedicated-<hex>`, created by clients by name). Journal
rows, leases, fencing, recovery and tailing then work unchanged, and the actor hosting
that pseudo-shard hosts exactly that entity (two keys would share an actor only on a
62-bit hash collision, which stays correct: a pseudo-shard is a shard like any other).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import corral.metrics as metrics
from corral._common import MAX_SHARDS
from corral._errors import (
    BatchRefusedError,
    CorralError,
    DefinitionMismatchError,
    HandlerNotHostedError,
    ShardMovedError,
    UnknownEntityTypeError,
)
from corral.actors import (
    EntityDefinition,
)
from corral.actors._manifest import manifest_json
from corral.persistence import Acceptance, EntryKind, Store, is_postgres_url, open_store

from .._app_path import load_entities
from .._build_registration import BuildRegistration, refused_client
from ..client._requests import AcceptBatch, AnyRequest, Query, WaitUpdate
from ..client._router import Router
from ..host._host import LocalHost
from ..host._local_backend import LocalBackend
from ._directory import assignment, host_of
from ._env import ray_hosting
from ._logs import ship_logs
from ._release import Release, release_tag

__all__ = ["PlacementRouter", "RayHostSpec", "ShardHost", "actor_name",
           "shard_actor_class", "start_failure_hint"]

log = logging.getLogger("corral.ray")

YOUNG_OBJECTS_PER_COLLECTION = 20_000
"""A shard actor's process is corral's own: its garbage collector starts a young
collection after 20,000 new container objects, not CPython's 700. Messages allocate
short-lived ones (futures, coroutines, records) that outlive a young collection only
while in flight, and every 10th and 100th young collection walks older generations (all
the hosted entities): with the default a host spent 3-8% of its time collecting (~650
young, 60 middle, 6 full collections per 90,000 messages). Hot keys on 4 shard actors,
repeated bursts: 15,700-20,600 -> 17,400-22,300 signals/s, 38-50 -> 35-42 us of shard
CPU each. Reference counting still frees everything acyclic at once."""

WAIT_SLICE = 10.0
"""Seconds a `WaitUpdate` waits inside the actor before it answers None (the client then
asks again): a call never parks in an actor for long."""

_HANDLED = frozenset({EntryKind.SIGNAL, EntryKind.UPDATE})
"""Entries applied by a handler of their name (the others carry no handler name)."""

_DEDICATED_SPACE = 1 << 62
"""Pseudo-shard indices of dedicated entities: shards + [0, 2**62), inside SQLite's int64."""


class PlacementRouter(Router):
    """`Router` that also knows placement: a dedicated entity gets its own pseudo-shard.

    Reads `definitions` live, so types registered later route correctly too.
    """

    __slots__ = ("_definitions",)

    def __init__(self, shards: int, definitions: Mapping[str, EntityDefinition]) -> None:
        super().__init__(shards)
        self._definitions = definitions

    def shard_of(self, entity_type: str, key: str) -> int:
        definition = self._definitions.get(entity_type)
        if definition is None or definition.placement != "dedicated":
            return super().shard_of(entity_type, key)
        digest = hashlib.blake2b(f"{entity_type}\0{key}".encode(), digest_size=8,
                                 person=b"corral-dedicated").digest()
        # At least MAX_SHARDS past the count: a store refuses a lease in between, where
        # only a router of another shard count lands (`check_lease_shards`). Moves only
        # the keys whose hash fell below it (a chance of 2**-50 each).
        return self.shards + max(int.from_bytes(digest, "big") % _DEDICATED_SPACE, MAX_SHARDS)

    def is_dedicated(self, index: int) -> bool:
        return index >= self.shards


@dataclass(frozen=True, slots=True)
class RayHostSpec:
    """What every shard actor of one deployment is built from (its constructor args)."""

    store: str
    """What every shard actor opens: the deployment's PostgreSQL URL, or the absolute
    path of its SQLite file (then all the actors run on one machine)."""
    shards: int
    namespace: str
    lease_ttl: float
    poll_interval: float
    dedicated_idle_exit: float | None = 30.0
    """Seconds a dedicated actor lives on with no running run (None: forever)."""


HOST_PROTOCOL = 6
"""The version of what a client and a host actor send each other (2: acceptances and
their results as `to_wire` tuples; 3: every call is one `_ops` record to `handle`; 4:
acceptances carry `max_backlog`, `overflow`, `applied`, results `dead_letter_id`, and an
`AcceptBatch` may be `atomic`; 5: one actor hosts many shards, placed by the placer;
6: a host imports a declared release's app, nothing is pickled from a client).
Detached actors outlive their clients, so an upgraded client can meet an actor of an
older corral: the version is part of the fingerprint both check before the first call,
and a mismatch is refused clearly."""


def host_fingerprint(definition: EntityDefinition) -> str:
    """What a client and a shard actor compare: the entity definition's fingerprint and
    `HOST_PROTOCOL`."""
    return f"{definition.fingerprint}-p{HOST_PROTOCOL}"


def accepted_fingerprints(definition: EntityDefinition) -> frozenset[str]:
    """The client fingerprints a host running `definition` accepts: its own, and those
    of the same definition before its declared renames (a client on the old code sends
    old names, which the host resolves). `host_fingerprint` is one of them."""
    return frozenset(f"{fp}-p{HOST_PROTOCOL}" for fp in definition.compatible_fingerprints)


def actor_name(spec: RayHostSpec, index: int) -> str:
    """`corral/<namespace>/dedicated-<hex>` for a dedicated entity; for a shard, the name
    shard `index` would have alone (`corral/<namespace>/shard-<k>`: messages only; host
    actors are named by the placer)."""
    if index < spec.shards:
        return f"corral/{spec.namespace}/shard-{index}"
    return f"corral/{spec.namespace}/dedicated-{index - spec.shards:016x}"


def start_failure_hint(err: BaseException) -> str:
    """What to add to the error of an actor that failed to start, if the cause is known."""
    if "No module named" in str(err):
        return (" (the Ray workers cannot import an entity module: ship it as an "
                "installed package or with a runtime_env)")
    return ""


class ShardHost:
    """A host actor of a deployment (many shards), or one dedicated entity, inside an
    async Ray actor.

    Clients send every operation as one request record to `handle(op)`; the other
    methods are administration (`check_definitions`, `metrics`, `info`,
    `shutdown`) and placement (`take`, `retire`, called by the placer, `_placer`).
    Every call may run twice (Ray re-executes in-flight calls on a restarted actor,
    `max_task_retries=-1`): accepts are idempotent by message id, updates by update id,
    dead-letter replays by their derived id (a discard run twice answers False the
    second time), and the rest are reads.

    A host actor holds exactly the shards assigned to it (`LocalHost.assign`), never a
    free one: at start, those the directory (`_directory`) names it for, taken at
    once at a new epoch (`takeover`: Ray restarted it, or a predecessor hangs on, and
    the new epoch fences the old incarnation out); later, those the placer moves here
    (`take`). A call for a shard it does not hold (moved away, or never assigned here:
    a client's stale directory read) is answered `ShardMovedError` naming the actor the
    directory names now, and the client re-routes.

    A dedicated actor ends itself once no run of its pseudo-shard has been running for
    `spec.dedicated_idle_exit` seconds, so a finished GPU entity gives its resources
    back; the next message for it creates a fresh actor.
    """

    async def __init__(  # type: ignore[misc]  # Ray awaits an async actor's __init__
        self, spec: RayHostSpec, release: Release, index: int | None,
        name: str | None = None,
    ) -> None:
        """`release`: the code to run (its app is imported here, in the release's
        runtime_env, which the actor was created with). `index`: a dedicated entity's
        pseudo-shard; None for a host actor, which hosts the shards the directory names
        `name` for (`name` then required).

        Raises:
            CorralError: the app imported here is not the release's build (the code at
                its import path changed since it was declared: declare it again).
        """
        self.spec = spec
        self.release = release
        self.index = index
        self.name = name or actor_name(spec, index or 0)
        self.moved_to: dict[int, str] = {}  # shard -> the actor it was handed to
        entities = load_entities(release.app)
        self.definitions: dict[str, EntityDefinition] = {
            cls._corral_definition.name: cls._corral_definition for cls in entities}
        found = release_tag({n: manifest_json(d) for n, d in self.definitions.items()})
        if found != release.tag:
            raise CorralError(
                f"{self.name}: the code at {release.app} here is build {found}, not "
                f"{release}'s build {release.tag}: the code at that path changed since "
                f"the release was declared; declare it again (corral deploy)")
        self.router = PlacementRouter(spec.shards, self.definitions)
        self._inflight = 0
        self._open = asyncio.Event()  # cleared while deciding to exit: calls wait
        self._open.set()
        self._exit_task: asyncio.Task[None] | None = None
        ship_logs(spec.namespace, self.name)  # this process's corral.* records: to drivers
        gc.set_threshold(YOUNG_OBJECTS_PER_COLLECTION, *gc.get_threshold()[1:])
        self.store: Store = await open_store(spec.store, shards=spec.shards)
        self.hosting = ray_hosting(self.store, 2 * spec.lease_ttl)
        try:  # this Ray instance's claim on the store first: refused if another's holds it
            await self.hosting.open()
            self.host = await self._open_host()
            self.taken_at = time.time()
        except BaseException:
            await self.hosting.close()
            await self.store.close()
            raise
        self.backend = LocalBackend(self.store, self.definitions, self.host,
                                    self.router.shard_of)
        log.info("%s: pid %d holds shards %s", self.name, os.getpid(),
                 {i: s.fence.epoch for i, s in sorted(self.host.shards.items())})
        if index is not None and spec.dedicated_idle_exit is not None:
            self._exit_task = asyncio.create_task(self._exit_when_idle(spec.dedicated_idle_exit))

    async def _open_host(self) -> LocalHost:
        """The host of this actor's shards, as the directory (`_directory`) assigns
        them, taken at once (`takeover`)."""
        if self.index is not None:
            mine: tuple[int, ...] = (self.index,)
        else:
            directory = await asyncio.to_thread(assignment, self.spec.namespace)
            mine = tuple(sorted(k for k, actor in directory.items() if actor == self.name))
        host = LocalHost(self.store, self.router, self.definitions,
                         lease_ttl=self.spec.lease_ttl, poll_interval=self.spec.poll_interval,
                         indices=mine, takeover=True)
        # Registered like a local host (`corral builds` lists it; an entry only a live
        # build knows waits for it), and refused here if incompatible, before hosting.
        self.registration = BuildRegistration(
            self.store, self.definitions, process=host.owner, role="host",
            ttl=2 * self.spec.lease_ttl)
        await self.registration.open()
        try:
            await host.open()
        except BaseException:
            await host.close()
            await self.registration.close()
            raise
        return host

    @contextlib.asynccontextmanager
    async def _serving(self) -> AsyncIterator[None]:
        while not self._open.is_set():  # exiting: wait to die (the caller then retries)
            await self._open.wait()
        self._inflight += 1
        try:
            yield
        finally:
            self._inflight -= 1

    # -- the Backend requests ----------------------------------------------------------

    async def handle(self, op: AnyRequest) -> Any:
        """Carry out one request record (`client._requests`) here, as `Backend.handle`
        does: the one entry point of the client.

        An `AcceptBatch` is answered item by item (`_accept_batch`); a `WaitUpdate`
        with its outcome, or None after `WAIT_SLICE` seconds (ask again). Reads without
        a shard (`shard=None`) are answered for all shards: they share one store.
        """
        if op.shard is not None and op.shard not in self.host.indices:
            raise await self._moved(op.shard)  # even while stopping: re-routed at once
        async with self._serving():
            if isinstance(op, AcceptBatch):
                return await self._accept_batch(op)
            if op.shard is not None:  # one entity's (or a key's dead letters)
                self._check(op.entity_type, op.key, op.shard)  # type: ignore[arg-type]
            if type(op) is Query:
                self._check_handler(op.entity_type, op.name)
            if type(op) is WaitUpdate:
                try:
                    return await asyncio.wait_for(self.backend.handle(op), WAIT_SLICE)
                except asyncio.TimeoutError:  # not the builtin before 3.11
                    return None
            return await self.backend.handle(op)

    async def _accept_batch(self, batch: AcceptBatch) -> list[tuple[Any, ...] | BaseException]:
        """Accept a batch (one group commit); each item's result (`AcceptResult.to_wire`)
        or its error.

        An entity type this actor's release lacks fails the whole call before anything
        is accepted (`UnknownEntityTypeError` naming the release; the client sends it
        again while a roll to a release that has it is under way).
        """
        for etype in {acc.entity_type for acc in batch.accs} - set(self.definitions):
            raise self._unknown(etype)
        if batch.atomic:
            return await self._accept_all(batch)
        results: list[tuple[Any, ...] | BaseException | None] = []
        checked: list[Acceptance] = []
        # Routed with our shard count: each acceptance's shard is its key's (no hash again).
        routed = batch.shards == self.router.shards
        for acc in batch.accs:  # a misrouted one is refused alone
            try:
                if not routed:
                    self._check(acc.entity_type, acc.key, batch.shard)
                if acc.shard != batch.shard:
                    raise CorralError(
                        f"{acc.entity_type} {acc.key!r} was routed to shard {acc.shard}, "
                        f"but sent in a batch for shard {batch.shard}")
                if acc.kind in _HANDLED:
                    self._check_handler(acc.entity_type, acc.name)
            except CorralError as err:
                results.append(err)
            else:
                results.append(None)
                checked.append(acc)
        accepted = iter(await self.backend.accept_many(checked) if checked else ())
        return [(a if isinstance(a := next(accepted), Exception) else a.to_wire())
                if r is None else r for r in results]

    def _check_handler(self, etype: str, name: str) -> None:
        """A name the client's build has and this one lacks: a client of a newer build
        (`check_definitions` let it in as a compatible successor). The client retries
        while the current release has it (a roll is moving the shard), else raises."""
        if self.definitions[etype].handler(name) is None:
            raise HandlerNotHostedError(
                f"{self.name} runs {self.release}, whose {etype} has no handler "
                f"{name!r}: deploy a release that has it (corral deploy)",
                entity_type=etype)

    async def _accept_all(self, batch: AcceptBatch) -> list[tuple[Any, ...] | BaseException]:
        """An atomic batch (one shard's part of a `SignalBatch`): every acceptance or
        none; a misrouted one refuses it all (`BatchRefusedError`), a handler this build
        lacks too (`HandlerNotHostedError`, which the client retries while a roll runs)."""
        for index, acc in enumerate(batch.accs):
            try:
                self._check(acc.entity_type, acc.key, batch.shard)
            except CorralError as err:
                raise BatchRefusedError.of(index, err) from err
            if acc.kind in _HANDLED:  # an older build mid-roll: the client retries it all
                self._check_handler(acc.entity_type, acc.name)
        return [r.to_wire() for r in await self.backend.accept_all(batch.accs)]

    def _unknown(self, etype: str) -> UnknownEntityTypeError:
        return UnknownEntityTypeError(
            f"entity type {etype!r} is not in {self.release} that {self.name} runs: "
            f"deploy a release with it (corral deploy)", entity_type=etype)

    def _check(self, etype: str, key: str, shard: int) -> None:
        if etype not in self.definitions:
            raise self._unknown(etype)
        if self.router.shard_of(etype, key) != shard:
            raise CorralError(f"{etype} {key!r} does not belong to shard {shard}")

    async def _moved(self, shard: int) -> ShardMovedError:
        """The answer to a call for `shard`, which this actor does not host: where the
        shard went (what it was handed to, or what the directory names now)."""
        to = self.moved_to.get(shard)
        if to is None:
            to = await asyncio.to_thread(host_of, self.spec.namespace, shard, "")
        return ShardMovedError(f"shard {shard} is not hosted by {self.name}"
                               + (f"; {to} hosts it" if to else "; ask the placer"),
                               shard=shard, actor=to)

    # -- a dedicated actor ends when its entity is done ----------------------------------

    async def _running_here(self) -> int:
        """Runs of this shard that are running (passivated ones included) or in memory."""
        assert self.index is not None  # only dedicated actors exit when idle
        shard = self.host.shard(self.index)
        if shard is not None and len(shard):
            return len(shard)
        return await self.store.count_running(self.index)

    async def _exit_when_idle(self, grace: float) -> None:
        import ray

        idle_since: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(max(grace / 4, 0.05), 5.0))
            if self._inflight or await self._running_here():
                idle_since = None
                continue
            idle_since = idle_since or loop.time()
            if loop.time() - idle_since < grace:
                continue
            self._open.clear()  # new calls wait; let the ones in flight finish
            while self._inflight:
                await asyncio.sleep(0.01)
            if await self._running_here():  # a call started a run meanwhile: stay
                self._open.set()
                idle_since = None
                continue
            log.info("%s: no running entity for %.1f s; exiting", self.name, grace)
            await self.registration.close()
            await self.host.close()
            await self.hosting.close()
            await self.store.close()
            # Calls waiting in _serving die with the actor; their clients retry on a new one.
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
            return

    # -- administration ----------------------------------------------------------------

    async def check_definitions(self, fingerprints: dict[str, str],
                                manifests: dict[str, str] | None = None) -> None:
        """Refuse a client whose entity definitions differ from the ones this actor runs,
        unless one build is a compatible successor of the other (`manifests`: the
        client's builds, see `_build_registration.refused_client`), or that speaks another version
        of this module's calls (`host_fingerprint`).

        Raises:
            DefinitionMismatchError: for the first type whose fingerprints differ.
        """
        for etype, theirs in sorted(fingerprints.items()):
            definition = self.definitions.get(etype)
            if definition is None or theirs in accepted_fingerprints(definition):
                continue
            mine = host_fingerprint(definition)
            same_protocol = theirs.endswith(f"-p{HOST_PROTOCOL}")
            why = refused_client(definition, (manifests or {}).get(etype)) \
                if same_protocol else []
            if why is not None:
                name = self.name
                raise DefinitionMismatchError(
                    f"{name} runs a definition of {etype} (fingerprint {mine}) this "
                    f"client ({theirs}) cannot work with: it was started with "
                    f"incompatible entity code or another corral version"
                    f"{''.join(f'; {d}' for d in why)}. It runs {self.release}: use "
                    f"a client whose code is compatible with it, or deploy this code "
                    f"(corral deploy).",
                    entity_type=etype, client_fingerprint=theirs, host_fingerprint=mine)

    async def metrics(self) -> bytes:
        """This process's series (`corral.metrics`), for a scrape of the deployment
        (`_host_metrics.pull_hosts`)."""
        return metrics.exposition()

    async def info(self, shard: int | None = None) -> dict[str, Any]:
        """Where and as what this incarnation runs (for operators and tests): `shards`
        held ({index: epoch}); `epoch` of `shard` (default: the lowest held)."""
        import ray

        held = {i: s.fence.epoch for i, s in sorted(self.host.shards.items())}
        if shard is None:
            shard = self.index if self.index is not None else min(held, default=None)
        ctx = ray.get_runtime_context()
        return {
            "name": self.name, "index": self.index, "pid": os.getpid(),
            "node_id": ctx.get_node_id(), "owner": self.host.owner,
            "shards": held, "assigned": list(self.host.indices),
            "epoch": held.get(shard) if shard is not None else None,
            "hosted": sum(len(s) for s in self.host.shards.values()),
            "entity_types": sorted(self.definitions),
            "store": "postgresql" if is_postgres_url(self.spec.store) else "sqlite",
            "gc_threshold": gc.get_threshold(), "moved_to": dict(self.moved_to),
            "taken_at": self.taken_at, "spec": dataclasses.asdict(self.spec),  # plain data
            "fingerprints": {n: d.fingerprint for n, d in sorted(self.definitions.items())},
            "release": self.release.id, "release_seq": self.release.seq,
        }

    # -- placement (`_placer`): the one move of a shard -------------------------------

    async def take(self, shards: Sequence[int], *, force: bool = False
                   ) -> tuple[dict[int, int], float]:
        """Host `shards` from now on: ask their holders to hand them over (the graceful
        hand-off, `request_shards`), or, with `force` (their holder's node is gone) or
        when nobody hands them within two lease terms, take them over at a new epoch
        (fencing the old holder out). ({shard: epoch} held here now, when (epoch s))."""
        self.host.assign(set(self.host.indices) | set(shards))
        for index in shards:
            self.moved_to.pop(index, None)
        if force or set(await self.host.request_shards(shards)) != set(shards):
            async with self.host.leasing:
                await self.host.acquire(force=True)
        return ({i: s.fence.epoch for i in shards if (s := self.host.shard(i)) is not None},
                time.time())

    async def retire(self, shard: int, successor: str, *, drain: float = 2.0
                     ) -> float | None:
        """Shard `shard` was handed to `successor`: answer every later call for it with
        `ShardMovedError` naming it (the client re-routes) and let the calls in flight
        finish (up to `drain` seconds); when the hand-off began (epoch s), or None (and
        nothing changed) if this actor still holds the shard."""
        if self.host.shard(shard) is not None:
            return None
        self.moved_to[shard] = successor
        self.host.assign(i for i in self.host.indices if i != shard)
        loop = asyncio.get_running_loop()
        until = loop.time() + drain
        while self._inflight and loop.time() < until:
            await asyncio.sleep(0.01)
        return self.host.handed_at.get(shard, 0.0)

    async def shutdown(self) -> None:
        """Stop hosting, release the lease and close the store (`stop_ray_hosts` then kills
        the actor for good). Calls that arrive afterwards wait until the actor is gone."""
        self._open.clear()
        if self._exit_task is not None:
            self._exit_task.cancel()
        await self.registration.close()  # out of the registry first, as a local host
        with contextlib.suppress(Exception):
            await self.host.close()
        await self.hosting.close()
        await self.store.close()


_actor_class: Any = None


def shard_actor_class() -> Any:
    """`ShardHost` as a Ray actor class (made once per process)."""
    global _actor_class
    if _actor_class is None:
        import ray

        _actor_class = ray.remote(ShardHost)
    return _actor_class
