"""The Ray backend's client: routes each call to the host actor holding its shard.

A Ray deployment is declared, not opened: `deploy` (`_deployment`) records a release
in the store and the deployment's placer (`_placer`) starts host actors that import the
release's code. `RayBackend` is what every driver, web worker, script, Ray task or
Serve replica opens (`open_runtime(backend="ray")`): it connects to the namespace's
current release and routes; it never creates, stops or changes a host, and its close
stops nothing (a process that started a private Ray instance for itself ends that
instance, and with it the hosts it ran, cleanly: they could not outlive it).

It computes the owning shard of an entity (the same stable hash in every process),
finds the host actor that holds the shard in the directory (`_directory`; a shard not
placed yet is placed by the placer first) and sends it the call's request record
(`client._requests`) through its one entry point, `ShardHost.handle(request)`; a host
that no longer holds the shard answers `ShardMovedError` and the call is re-routed. A
dedicated entity's actor is got or created by its own name (`get_if_exists=True`:
atomic in Ray, exactly one constructor per name), with the release's code and
runtime_env. The actor (`ShardHost`, in `_shard_host.py`) runs the same host code as
the local backend (`LocalBackend.handle(request)`).

Calls are safe to repeat, which the fault tolerance relies on:

- Actors are created with `max_restarts=-1, max_task_retries=-1`: when a host actor
  dies, Ray restarts it and re-executes the calls that were in flight. Accepts are
  idempotent by message id (a re-executed accept is answered from the dedupe table),
  updates by update id, and the other calls are reads.
- A handle may point at an actor that is dying for good (killed without restart,
  exited, stopped after its shards moved, or pinned to a node that is gone): the
  client drops it, resolves the shard's host again and repeats the call, for up to
  `retry_timeout` seconds.
- A handler (or entity type) the host lacks: if the current release has it, the host
  runs an older release that a roll has not moved off the shard yet, and the call is
  sent again until it has; if the current release lacks it, `HandlerNotHostedError`
  (`UnknownEntityTypeError`) at once, naming the release. Nothing was stored.

Concurrent accepts for one shard from one client are sent as one actor call, an
`AcceptBatch` (the batch is whatever is queued when the event loop comes round): one
Ray round trip and one group commit for many messages, and no added latency for a lone
caller.

A client's connection to where its entities live, as `corral._cli._connection` is the
command line's (its options and the runtime they open), hence the shared name.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import ray
from prometheus_client.core import Metric
from ray import exceptions as rex

from corral._errors import (
    BatchRefusedError,
    CorralError,
    DeploymentNotFoundError,
    HandlerNotHostedError,
    InvalidArgumentError,
    ShardCountError,
    ShardMovedError,
    UnknownEntityTypeError,
)
from corral.actors import EntityDefinition
from corral.actors._manifest import manifest_json
from corral.persistence import Acceptance, AcceptResult, Store, UpdateOutcome

from ..client._requests import AcceptBatch, AnyRequest, SignalBatch, WaitUpdate
from ._deployment import placer_of, shown_store, store_location
from ._deployment import stop_ray_hosts as stop_hosts
from ._directory import host_of
from ._env import env_vars_of, with_env_vars
from ._release import Release
from ._shard_host import (
    PlacementRouter,
    RayHostSpec,
    actor_name,
    host_fingerprint,
    shard_actor_class,
    start_failure_hint,
)
from ._sigterm import keeping_sigterm

__all__ = ["RayBackend", "connect_ray", "shard_actor_class", "stop_hosts"]

log = logging.getLogger("corral.ray")

_MAX_BATCH = 512
"""Accepts per actor call; bigger batches are split (the pieces still share commits)."""
_MAX_HANDLES = 4096
"""Actor handles kept per client (dedicated entities each have their own)."""
_RETRYABLE = (rex.ActorDiedError, rex.ActorUnavailableError, rex.RayActorError,
              rex.ActorUnschedulableError)
"""An actor gone or going (a host pinned to a node that is gone is unschedulable: the
placer moves its shards, and the next handle is the new host's)."""
_MAX_MOVES = 8
"""Re-routes of one call after `ShardMovedError` (a roll moves a shard once)."""
RELEASE_READ = 0.2
"""Seconds between a client's reads of the current release (after a refusal only)."""

class RayBackend:
    """The client of a Ray deployment: routes each call to the owning host actor.

    Args:
        spec: the deployment (store, shard count, namespace, lease settings), its
            placer's.
        definitions: the entity types this client addresses.
        router: routing with placement (dedicated entities get their own actor).
        placer: the deployment's placer (its current release, and shards to place).
        release: the current release when this client connected.
        retry_timeout: how long to keep retrying a call whose actor is unavailable.
        started_ray: whether this process started its Ray instance (then `close()`
            ends it, its hosts first, cleanly).
    """

    calls_once = False  # a call whose actor died is sent again (by `call`, and by Ray itself:
    # max_task_retries), and it may have committed before the actor died

    host = None  # the shards are held by the host actors, never by this process

    @property
    def store(self) -> Store:
        raise CorralError("this backend keeps its store inside the shard hosts")

    async def host_metrics(self) -> list[Metric]:
        """Every host actor's `corral.metrics` series (`_host_metrics.pull_hosts`)."""
        from ._host_metrics import pull_hosts

        return await pull_hosts(self.spec.namespace)

    def __init__(self, spec: RayHostSpec, definitions: Mapping[str, EntityDefinition],
                 router: PlacementRouter, placer: Any, release: Release, *,
                 retry_timeout: float = 120.0, started_ray: bool = False) -> None:
        self.spec = spec
        self.router = router
        self.release = release
        self._placer = placer
        self._release_read = time.monotonic()
        self._definitions = definitions
        self._retry_timeout = retry_timeout
        self._started_ray = started_ray
        self._handles: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self._creating: dict[int, asyncio.Future[Any]] = {}
        self._queued: dict[int, list[tuple[Acceptance, asyncio.Future[AcceptResult]]]] = {}
        self._sending: set[asyncio.Task[None]] = set()
        self.retries: collections.Counter[str] = collections.Counter()
        """Calls sent again, by why: `moved` (a roll moved the shard: re-routed),
        `not_hosted` (an older release hosts it: `HandlerNotHostedError`),
        `unavailable` (the actor restarting or gone). For operators and benchmarks."""

    # -- the release -------------------------------------------------------------------

    async def _current(self) -> Release:
        """The current release, read again from the placer (at most every
        `RELEASE_READ` seconds)."""
        if time.monotonic() - self._release_read >= RELEASE_READ:
            self._release_read = time.monotonic()
            with contextlib.suppress(rex.RayError, DeploymentNotFoundError):
                try:
                    release, _ = await self._placer.current.remote()
                except rex.RayActorError:  # stopped, and maybe deployed again
                    self._placer = await asyncio.to_thread(placer_of, self.spec.namespace)
                    release, _ = await self._placer.current.remote()
                if release is not None:
                    self.release = release
        return self.release

    async def _rolling_to(self, etype: str, name: str | None) -> bool:
        """Whether the current release has `etype` (and its handler `name`): then a
        host that lacks it runs an older release, and the call is sent again."""
        release = await self._current()
        return etype in release.manifests if name is None else release.handles(etype, name)

    # -- actors ------------------------------------------------------------------------

    def _options(self, etype: str, name: str) -> dict[str, Any]:
        """A dedicated actor's options: the release's, then the entity's `ray_options`."""
        # Calls waiting for an update's outcome park in the actor (up to WAIT_SLICE):
        # room for many, so they never hold up accepts behind them.
        options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 10_000,
                                   **self.release.actor_options}
        options.update(with_env_vars(self._definitions[etype].ray_options,
                                     env_vars_of(self.release.runtime_env),
                                     named=f"{etype}.ray_options"))
        runtime_env = {**self.release.runtime_env, **options.get("runtime_env", {})}
        if runtime_env:
            options["runtime_env"] = runtime_env
        options.update(
            name=name, namespace=self.spec.namespace,
            get_if_exists=True, lifetime="detached", max_restarts=-1, max_task_retries=-1,
        )
        return options

    def _create(self, index: int, etype: str) -> Any:
        """The actor hosting shard `index`: a dedicated entity's own (got or created by
        name, with the release's code), or the host actor the directory names
        (`_directory`); a shard not placed yet, or placed on an actor that is gone, is
        placed by the deployment's placer first. Blocking (GCS calls)."""
        if self.router.is_dedicated(index):
            name = actor_name(self.spec, index)
            return shard_actor_class().options(**self._options(etype, name)).remote(
                self.spec, self.release, index, name)
        deadline = time.monotonic() + self._retry_timeout
        while True:
            name = host_of(self.spec.namespace, index, "")
            if name:
                with contextlib.suppress(ValueError):
                    return ray.get_actor(name, namespace=self.spec.namespace)
            if time.monotonic() > deadline:
                raise CorralError(f"no host actor of the Ray deployment "
                                  f"{self.spec.namespace!r} took shard {index} within "
                                  f"{self._retry_timeout:.0f} s (see the placer's log)")
            self.place()
            if host_of(self.spec.namespace, index, "") == name:
                time.sleep(0.1)  # named, but not (yet, or any more) a live actor

    def place(self) -> None:
        """Ask the placer to place every shard now (this client found one unplaced).
        Blocking.

        Raises:
            DeploymentNotFoundError: the deployment was stopped (and not deployed again).
        """
        try:
            ray.get(self._placer.place.remote(), timeout=self._retry_timeout)
        except rex.RayTaskError as err:
            if isinstance(err.cause, CorralError):
                raise err.cause from None
            raise
        except rex.RayActorError:  # stopped; deployed again since? the new placer
            self._placer = placer_of(self.spec.namespace)
            ray.get(self._placer.place.remote(), timeout=self._retry_timeout)

    async def _handle(self, index: int, etype: str) -> Any:
        handle = self._handles.get(index)
        if handle is not None:
            self._handles.move_to_end(index)
            return handle
        pending = self._creating.get(index)
        if pending is None:  # one get-or-create per actor, shared by concurrent callers
            pending = self._creating[index] = asyncio.ensure_future(
                self._create_and_keep(index, etype))
        return await asyncio.shield(pending)  # a cancelled caller leaves it to the others

    async def _create_and_keep(self, index: int, etype: str) -> Any:
        try:
            # get-or-create asks the GCS synchronously: keep it off the event loop.
            handle = await asyncio.to_thread(self._create, index, etype)
            await self._check_definitions(handle, index, etype)
        finally:
            del self._creating[index]
        self._handles[index] = handle
        while len(self._handles) > _MAX_HANDLES:
            self._handles.popitem(last=False)
        return handle

    async def _check_definitions(self, handle: Any, index: int, etype: str) -> None:
        """Before the first call through a handle: the actor must run the entity code
        this client has (an actor started with older code raises
        `DefinitionMismatchError`). Once per handle, so once per actor incarnation
        name; a restarted actor re-runs the code it was created with."""
        ours = [self._definitions[etype]] if self.router.is_dedicated(index) \
            else self._definitions.values()
        try:
            await handle.check_definitions.remote({d.name: host_fingerprint(d) for d in ours},
                                                  {d.name: manifest_json(d) for d in ours})
        except rex.RayTaskError as err:
            if isinstance(err.cause, CorralError):
                raise err.cause from None
            raise
        except _RETRYABLE:
            pass  # the call itself will find the actor unavailable and retry

    async def call(self, index: int, etype: str, op: AnyRequest,
                   sent: tuple[Any, Any] | None = None) -> Any:
        """`ShardHost.handle(op)` on shard `index`'s actor: get-or-create, retry, unwrap
        errors; the actor's answer.

        `sent`: (handle, object ref) of a first attempt the caller already made.
        """
        deadline = time.monotonic() + self._retry_timeout
        delay = 0.02
        init_failures = moves = 0
        while True:
            if sent is not None:
                (handle, attempt), sent = sent, None
            else:
                handle = await self._handle(index, etype)
                attempt = handle.handle.remote(op)
            try:
                return await attempt
            except rex.RayTaskError as err:  # the method itself raised: not retried
                cause = err.cause
                if isinstance(cause, ShardMovedError) and moves < _MAX_MOVES:
                    moves += 1  # the shard moved: the next handle is its new actor's
                    self.retries["moved"] += 1
                    self._forget(index, handle)
                    continue
                if isinstance(cause, HandlerNotHostedError | UnknownEntityTypeError) and \
                        time.monotonic() + delay <= deadline and await self._rolling_to(
                            etype, getattr(op, "name", None)
                            if isinstance(cause, HandlerNotHostedError) else None):
                    self._forget(index, handle)  # an older release hosts it: the roll
                    self.retries["not_hosted"] += 1  # moves the shard soon
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                if isinstance(cause, Exception):
                    raise cause from None
                raise
            except _RETRYABLE as err:
                self._forget(index, handle)
                self.retries["unavailable"] += 1
                if getattr(err, "_actor_init_failed", False):
                    init_failures += 1
                    if init_failures >= 3:
                        hint = start_failure_hint(err)
                        raise CorralError(f"{actor_name(self.spec, index)} failed to "
                                          f"start{hint}: {err}") from err
                if time.monotonic() + delay > deadline:
                    raise CorralError(
                        f"{actor_name(self.spec, index)} unavailable for "
                        f"{self._retry_timeout:.0f} s: {err}") from err
                log.info("%s unavailable (%s); retrying in %.2f s",
                         actor_name(self.spec, index), type(err).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _forget(self, index: int, handle: Any) -> None:
        """Drop `handle` of shard `index` (the next call resolves the actor again)."""
        if self._handles.get(index) is handle:
            del self._handles[index]

    # -- Backend -----------------------------------------------------------------------

    def handle(self, request: Any) -> Awaitable[Any]:
        """An `Acceptance` joins its shard's next batch; a `WaitUpdate` is asked again
        each `WAIT_SLICE`; every other record is one call to the owning shard's actor
        (any actor, shard 0, for the store-wide reads)."""
        if type(request) is Acceptance:
            return self._accept(request)
        if type(request) is WaitUpdate:
            return self._wait_update(request)
        if type(request) is SignalBatch:
            return self._accept_all(request)
        return self._call(request)

    async def _accept_all(self, op: SignalBatch) -> list[AcceptResult]:
        """A `SignalBatch` split by shard: each shard's part one atomic `AcceptBatch` to
        its actor, all at once. Atomic per shard only: when a part is refused, the parts
        of other shards may have committed; the refusal names its item's index in the
        whole batch (the lowest, if several parts were refused)."""
        parts: dict[int, list[int]] = {}
        for index, acc in enumerate(op.accs):
            parts.setdefault(acc.shard, []).append(index)
        answers = await asyncio.gather(*(
            self.call(shard, op.accs[indexes[0]].entity_type, AcceptBatch(
                shard, [op.accs[i] for i in indexes], self.router.shards, atomic=True))
            for shard, indexes in parts.items()), return_exceptions=True)
        results: list[AcceptResult | None] = [None] * len(op.accs)
        refusals: list[BatchRefusedError] = []
        for indexes, answer in zip(parts.values(), answers, strict=True):
            if isinstance(answer, BatchRefusedError):
                answer.index = indexes[answer.index]
                refusals.append(answer)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                for i, wire in zip(indexes, answer, strict=True):
                    results[i] = AcceptResult.from_wire(wire)
        if refusals:
            first = min(refusals, key=lambda err: err.index)
            first.args = (f"item {first.index} of the batch was refused, so the items of "
                          f"its shard were: {first.error!r}",)
            raise first
        return [r for r in results if r is not None]

    async def _call(self, op: Any) -> Any:
        """`op` (a record naming one entity type or none) to its shard's actor."""
        etype: str = op.entity_type or next(iter(self._definitions))
        return await self.call(0 if op.shard is None else op.shard, etype, op)

    async def _wait_update(self, op: WaitUpdate) -> UpdateOutcome:
        while True:
            outcome: UpdateOutcome | None = await self.call(op.shard, op.entity_type, op)
            if outcome is not None:
                return outcome

    def _accept(self, acc: Acceptance) -> asyncio.Future[AcceptResult]:
        """Queue `acc` for its shard's next batch; its result's future (no coroutine of
        its own: one object fewer per send in flight for the collector to scan)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[AcceptResult] = loop.create_future()
        queue = self._queued.get(acc.shard)
        if queue is None:
            queue = self._queued[acc.shard] = []
            loop.call_soon(self._flush, acc.shard)
        queue.append((acc, fut))
        if len(queue) >= _MAX_BATCH:  # a full batch goes now: the shard works on it while
            self._flush(acc.shard)  # the callers queued behind this one are still checked
        return fut

    def _flush(self, index: int) -> None:
        queue = self._queued.pop(index, None)
        if not queue:  # sent already, full
            return
        handle = self._handles.get(index)
        for start in range(0, len(queue), _MAX_BATCH):
            waiting = queue[start:start + _MAX_BATCH]
            batch = AcceptBatch(index, [acc for acc, _ in waiting], self.router.shards)
            sent = None
            if handle is not None:  # a known actor: send at once, not when a task first runs
                try:
                    sent = (handle, handle.handle.remote(batch))
                except Exception:  # the call in `_send` makes it again, and reports
                    sent = None
            task = asyncio.ensure_future(self._send(batch, waiting, sent))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: AcceptBatch,
                    waiting: list[tuple[Acceptance, asyncio.Future[AcceptResult]]],
                    sent: tuple[Any, Any] | None) -> None:
        """Send `batch` and give each waiter its result. An acceptance refused with
        `HandlerNotHostedError` while the current release has the handler (an older
        release hosts the shard during a roll) is sent again, with backoff, for up to
        `retry_timeout` seconds; refused for a handler the release lacks, at once."""
        deadline = time.monotonic() + self._retry_timeout
        delay = 0.05
        while True:
            try:
                results = await self.call(batch.shard, batch.accs[0].entity_type, batch,
                                          sent=sent)
            except BaseException as err:  # every waiter gets it
                for _, fut in waiting:
                    if not fut.done():
                        fut.set_exception(err)
                if not isinstance(err, Exception):
                    raise
                return
            again = []
            for (acc, fut), result in zip(waiting, results, strict=True):
                if fut.done():  # its caller was cancelled; the accept still happened
                    continue
                if isinstance(result, HandlerNotHostedError) and \
                        time.monotonic() + delay <= deadline and \
                        await self._rolling_to(acc.entity_type, acc.name):
                    again.append((acc, fut))
                elif isinstance(result, BaseException):
                    fut.set_exception(result)
                else:
                    fut.set_result(AcceptResult.from_wire(result))
            if not again:
                return
            self.retries["not_hosted"] += len(again)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
            waiting, sent = again, None
            batch = AcceptBatch(batch.shard, [acc for acc, _ in again], batch.shards)

    async def close(self) -> None:
        """Forget the actor handles: the deployment runs on, whoever else uses it. Only
        a process that started its own Ray instance ends it (its hosts, which cannot
        outlive it, are stopped cleanly first: each releases its leases and its claim
        on the store, so that the store's next host need not wait two lease terms)."""
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
        self._handles.clear()
        if self._started_ray:
            try:
                await asyncio.to_thread(stop_hosts, self.spec.namespace, timeout=10.0)
            except Exception as err:  # they die with Ray all the same
                log.warning("stopping the actors of %s before Ray: %s",
                            self.spec.namespace, err)
            await asyncio.to_thread(ray.shutdown)

    # -- operations --------------------------------------------------------------------

    async def actor(self, etype: str, key: str) -> Any:
        """The handle of the actor hosting `key` (created if needed); for operators and tests."""
        return await self._handle(self.router.shard_of(etype, key), etype)


async def connect_ray(store: str, definitions: Mapping[str, EntityDefinition], *,
                      shards: int | None, address: str | None, namespace: str,
                      deploy: Callable[[], Any] | None = None,
                      ) -> tuple[RayBackend, PlacementRouter]:
    """Connect to Ray (started when not initialized and `address` is None and no
    cluster is found) and build a client of the deployment `namespace`, after `deploy`
    (a blocking call declaring this process's release) if given.

    Raises:
        DeploymentNotFoundError: no deployment `namespace` runs on this Ray cluster.
        InvalidArgumentError: `store` or `shards` other than the deployment's.
    """
    location = store_location(store)
    started = False
    if not ray.is_initialized():
        with keeping_sigterm():  # a server's SIGTERM handler stays (`_sigterm`)
            ray.init(address=address, namespace=namespace, log_to_driver=False)
        node = getattr(ray._private.worker, "_global_node", None)
        started = bool(getattr(node, "head", False))  # not connected: started here
    try:
        if deploy is not None:
            await asyncio.to_thread(deploy)
        placer = await asyncio.to_thread(placer_of, namespace)
        spec: RayHostSpec = await placer.spec_of.remote()
        if spec.store != location:
            raise InvalidArgumentError(
                f"the Ray deployment {namespace!r} runs on another store than "
                f"{shown_store(location)}: open the runtime on its store, or use another "
                f"namespace")
        if shards is not None and shards != spec.shards:
            raise ShardCountError(
                f"shards={shards}, but the Ray deployment {namespace!r} has "
                f"{spec.shards} shards (pass none: the deployment's count is used)",
                store_shards=spec.shards, shards=shards)
        release, _ = await placer.current.remote()
        if release is None:
            raise DeploymentNotFoundError(
                f"the Ray deployment {namespace!r} has no release yet: declare one "
                f"(corral deploy)")
    except BaseException:
        if started:
            await asyncio.to_thread(ray.shutdown)
        raise
    router = PlacementRouter(spec.shards, definitions)
    backend = RayBackend(spec, definitions, router, placer, release, started_ray=started)
    return backend, router
