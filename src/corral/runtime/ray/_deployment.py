"""Operating a Ray deployment: declaring a release (`deploy`), its state
(`deploy_status`) and stopping it (`stop_ray_hosts`); draining a node is
`_cluster_nodes`. Each asks the deployment's placer (`_placer`), the one actor that
moves shards, so a roll, a drain and the placer's own rebalancing never move one shard
twice at once. Only these start, change or stop a deployment: clients never do.

`deploy` declares a release (`_release`): it uploads the runtime_env's local code,
imports the app inside that runtime_env (where the hosts will), and asks the placer
to record it in the store; the placer refuses it, before anything moves, if the
current release cannot be replaced by it (`_build_registration.refused_release`:
the rules of `corral builds`, including a state field whose type changed without an
upgrade hook). The placer then starts host actors of the release on each node and
moves the shards to them, `MOVES_PER_ROUND` at a time, through the graceful hand-off
every move uses: the new host asks the holder for the shard; the holder stops taking
work for it, lets its commits in flight land and releases the lease, which the new host
takes at the next epoch and recovers from the store (if no holder answers within two
lease terms, it takes the shard over: a new epoch fences a dead or hung holder out);
the directory (`_directory`) names the new host; the old one retires the shard
(later calls are answered `ShardMovedError` naming the new host; clients re-route).
Old hosts left with no shard are stopped.

What callers see: a short pause of each shard's entities. Sends meanwhile are accepted
(by the old host until it retires, by the new one after), so nothing acknowledged is
lost or doubled (accepts are idempotent by message id). A handler only the new release
has, sent to a shard an old host still holds, is retried by the client until the shard
moves; a handler the current release lacks is refused at once (`HandlerNotHostedError`).
A rollback is declaring the older release again; a deploy stopped midway resumes by
itself (the placer keeps rolling to the current release), and `deploy` run again waits
for it. Dedicated actors keep their code until they exit when idle.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from corral._errors import CorralError, DeploymentNotFoundError, InvalidArgumentError
from corral.persistence import is_postgres_url

from ..client._options import check_address, check_hosts, check_namespace
from ._directory import assignment, clear_directory, drained_nodes
from ._env import with_env_vars
from ._logs import retire_relay
from ._placer import RollStep, host_node_prefix, placer_handle, placer_name, release_of
from ._release import (
    DeploymentStatus,
    DeployReport,
    HostStatus,
    Release,
    declared_by,
    inspect_release,
    resolve_runtime_env,
)
from ._shard_host import RayHostSpec

__all__ = ["RollReport", "RollStep", "connect", "deploy", "deploy_status", "placer_of",
           "roll_ray_hosts", "shown_store", "stop_ray_hosts", "store_location", "unwrapped"]

T = TypeVar("T")

MIN_POLL = 0.05
"""Host actors tail the journal at most this often (calls reach them directly)."""

RAY_SHARDS = 256
"""A new Ray deployment's shard count when `deploy` is given none: shards are the unit
that moves between host actors as nodes join and leave, so many more of them than
hosts (16 hosts hold 16 each; `benchmarks/placement.py` measures what a host holding
64 costs when idle)."""


def deploy(namespace: str = "corral", *, app: str, store: str | None = None,
           runtime_env: Mapping[str, Any] | None = None,
           hosts: int | Mapping[str, int] | None = None,
           actor_options: Mapping[str, Any] | None = None,
           env_vars: Mapping[str, str] | None = None, shards: int | None = None,
           address: str | None = None, lease_ttl: float = 10.0,
           poll_interval: float = MIN_POLL, check_snapshots: bool = False,
           wait: bool = True, on_step: Callable[[RollStep], None] | None = None,
           timeout: float = 600.0) -> DeployReport:
    """Declare a release of the Ray deployment `namespace` and roll every shard to it.

    Blocking: call it from a thread in async code. Connects to Ray at `address`
    ("auto" when not connected yet). The first release of a namespace starts the
    deployment (its placer, then one host actor per node, or `hosts`) on `store`; a
    later one replaces the current release, shard by shard. Declaring the current
    release again changes nothing (`unchanged`); a rollback is declaring an older one.

    Args:
        app: the import path of the entity code, `"pkg.module:APP"` (an App, an Entity
            class or a list of them; several paths joined by ","), imported by every
            host inside `runtime_env`, never sent from here.
        store: the deployment's store (a PostgreSQL URL, or a SQLite path every host
            can open); needed for the first release, checked against the running one.
        runtime_env: the hosts' Ray runtime_env: `working_dir` and `py_modules` local
            paths are uploaded from here (Ray's packaging), `pip`, `image_uri` and the
            rest are passed on.
        hosts: host actors: a total over the alive nodes, or {node id: count}; default
            the current release's, or one per node.
        actor_options: other Ray options of the hosts (`num_cpus`, `resources`...).
        env_vars: environment variables of the hosts, merged into runtime_env's.
        shards: the store's shard count (first release only; default: the store's, else
            `RAY_SHARDS`).
        lease_ttl: the hosts' lease term (first release only).
        poll_interval: how often the hosts tail the journal (first release only).
        check_snapshots: before declaring, restore a sample of the stored snapshots
            with the release's code (in its runtime_env); refuse it if any fails.
        wait: wait until every shard is on the release (else return once declared).
        on_step: called with each shard moved (progress).
        timeout: seconds to wait for the import and for the roll.

    Raises:
        IncompatibleBuildError: the release cannot replace the current one; nothing
            was recorded or moved (each difference named).
        InvalidArgumentError: a bad argument, an app that does not import in the
            runtime_env, or a `store` other than the running deployment's.
        SnapshotRestoreError: `check_snapshots` found a snapshot the code cannot restore.
        CorralError: the roll did not finish within `timeout` (it goes on: run `deploy`
            again, or `deploy_status`, to follow it).
    """
    import ray

    began = time.monotonic()
    check_namespace(namespace)
    if not isinstance(app, str) or not app.strip():
        raise InvalidArgumentError(f"app must be an import path 'pkg.module:APP', got {app!r}")
    if hosts is not None:
        check_hosts(hosts, shards)
    options = dict(actor_options or {})
    if "runtime_env" in options:
        raise InvalidArgumentError("give the runtime_env as runtime_env=, not in actor_options")
    if runtime_env is not None and not isinstance(runtime_env, Mapping):
        raise InvalidArgumentError(
            f"runtime_env must be a dict, got {type(runtime_env).__name__}")
    env = with_env_vars({"runtime_env": dict(runtime_env or {})}, env_vars,
                        named="deploy")["runtime_env"]
    connect(namespace, address)
    placer, spec = _placer_and_spec(namespace, store, shards, lease_ttl, poll_interval,
                                    address)
    resolved = resolve_runtime_env(env)
    release = Release(namespace, app.strip(), resolved, options,
                      dict(hosts) if isinstance(hosts, Mapping) else hosts,
                      inspect_release(app.strip(), resolved, timeout),
                      declared_by=declared_by())
    if check_snapshots:
        _check_snapshots(spec, release, timeout)
    if placer is None:
        placer = placer_handle(spec)
    before = assignment(namespace)
    since = unwrapped(placer.progress.remote(0), timeout)[0]
    was, _ = ray.get(placer.current.remote(), timeout=timeout)
    current, previous, notes = unwrapped(placer.declare.remote(release), timeout)
    unchanged = was is not None and was.key == current.key
    skipped = tuple(k for k, name in sorted(before.items()) if release_of(name) == current.id)
    steps: list[RollStep] = []
    if wait:
        steps = _follow(placer, spec, current, since, on_step, timeout - (time.monotonic()
                                                                          - began))
    return DeployReport(current, previous, tuple(steps), skipped,
                        time.monotonic() - began, unchanged, tuple(notes))


def _placer_and_spec(namespace: str, store: str | None, shards: int | None,
                     lease_ttl: float, poll_interval: float, address: str | None
                     ) -> tuple[Any, RayHostSpec]:
    """The running placer and its spec, or (None, the spec of a new deployment)."""

    import ray

    from ._env import check_ray_hosting

    location = None if store is None else store_location(store)
    try:
        placer = ray.get_actor(placer_name(namespace), namespace=namespace)
    except ValueError:
        placer = None
    if placer is not None:
        spec: RayHostSpec = ray.get(placer.spec_of.remote(), timeout=60)
        if location is not None and location != spec.store:
            raise InvalidArgumentError(
                f"the Ray deployment {namespace!r} runs on the store {shown_store(spec.store)}, "
                f"not {shown_store(location)}: one deployment, one store")
        if shards is not None and shards != spec.shards:
            raise InvalidArgumentError(f"the Ray deployment {namespace!r} has "
                                       f"{spec.shards} shards, not {shards}")
        return placer, spec
    if location is None:
        raise DeploymentNotFoundError(
            f"no Ray deployment {namespace!r} runs: its first release needs the store "
            f"(--store / store=)")
    from corral.persistence import stored_shards

    async def checked() -> int:
        try:
            count = await stored_shards(location, any_version=True)
        except InvalidArgumentError:  # no store there yet
            count = shards or RAY_SHARDS
        if shards is not None and shards != count:
            raise InvalidArgumentError(f"the store at {shown_store(location)} has {count} "
                                       f"shards, not {shards}")
        await check_ray_hosting(location, count, address)
        return count

    count = _blocking(checked())
    return None, RayHostSpec(location, count, namespace, lease_ttl,
                             max(poll_interval, MIN_POLL))


def _blocking(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` to its end from blocking code (in a thread of its own when this one
    runs an event loop: a blocking call made from async code still works)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


def store_location(store: str) -> str:
    """What every host actor opens: a PostgreSQL URL, or a SQLite file's absolute path.

    Raises:
        InvalidArgumentError: an in-memory store (each actor would have its own).
    """
    if not isinstance(store, str):
        raise InvalidArgumentError(f"the Ray backend takes the store as a path or URL, "
                                   f"got {type(store).__name__}")
    if is_postgres_url(store):
        return store
    if store.startswith("sqlite:///"):
        store = store[len("sqlite:///"):]
    if store in (":memory:", "sqlite://:memory:", ""):
        raise InvalidArgumentError(
            "the Ray backend needs a store every host actor can open (a PostgreSQL URL, "
            "or a file on this machine), not an in-memory store")
    return os.path.abspath(store)


def shown_store(location: str) -> str:
    """A store location for messages, without a PostgreSQL password."""
    from corral.persistence._urls import redacted

    return redacted(location) if is_postgres_url(location) else location


STALLED = 20.0
"""Seconds a roll may fail to move a shard (each round failing) before `deploy` gives up
waiting for it (the placer goes on trying)."""


def _follow(placer: Any, spec: RayHostSpec, release: Release, since: int,
            on_step: Callable[[RollStep], None] | None, timeout: float) -> list[RollStep]:
    """Wait until every shard is on `release`'s hosts; the moves meanwhile.

    Raises:
        StoreHostedElsewhereError: the hosts cannot start: another cluster holds the store.
        CorralError: no shard moved for `STALLED` seconds while rounds failed (a host
            that cannot start, named), or `timeout` passed.
    """

    from ._env import check_ray_hosting

    deadline = time.monotonic() + max(timeout, 1.0)
    steps: list[RollStep] = []
    stalled_since: float | None = None
    last_on = -1
    while True:
        count, new, on, failed = unwrapped(placer.progress.remote(since), 60.0)
        since = count
        for step in new:
            steps.append(step)
            if on_step is not None:
                on_step(step)
        if on >= spec.shards:
            return steps
        now = time.monotonic()
        if failed and on == last_on and not new:
            if stalled_since is None:  # once a stall: it opens the store
                _blocking(check_ray_hosting(spec.store, spec.shards, None))
                stalled_since = now
            if now - stalled_since > STALLED:
                raise CorralError(f"the roll to {release} is stuck at {on} of "
                                  f"{spec.shards} shards: {failed}")
        else:
            stalled_since = None
        last_on = on
        if now > deadline:
            raise CorralError(
                f"{spec.shards - on} of {spec.shards} shards are not on {release} after "
                f"{timeout:.0f} s (a host did not start or take them: see the placer's "
                f"log); the placer goes on rolling: `corral deploy status` follows it")
        if not on:  # nothing placed yet (the first release): a round now
            with contextlib.suppress(CorralError):
                unwrapped(placer.place.remote(), 60.0)
        time.sleep(0.2)


def _check_snapshots(spec: RayHostSpec, release: Release, timeout: float) -> None:
    """Restore a sample of the stored snapshots with the release's code (a Ray task in
    its runtime_env).

    Raises:
        SnapshotRestoreError: naming the first entity whose snapshot failed.
    """
    import ray
    from ray import exceptions as rex

    task = ray.remote(num_cpus=0, max_retries=0)(_restore_sample)
    try:
        failures: list[str] = ray.get(task.options(runtime_env=release.runtime_env or None)
                                      .remote(spec.store, release.app), timeout=timeout)
    except rex.RayTaskError as err:
        raise (err.cause if isinstance(err.cause, CorralError) else err) from None
    if failures:
        from corral._errors import SnapshotRestoreError

        raise SnapshotRestoreError(
            f"{len(failures)} stored snapshots do not restore with {release.app} "
            f"({release.tag}): " + "; ".join(failures[:5]) + ": add an upgrade hook, or "
            "fix the code, before deploying it")


SNAPSHOT_SAMPLE = 200
"""Entities per type whose snapshots `deploy(check_snapshots=True)` restores."""


def _restore_sample(location: str, app: str) -> list[str]:
    """Inside the release's runtime_env: each snapshot of a sample that fails."""
    from corral.persistence import open_store, stored_shards

    from .._app_path import load_entities
    from ..host._check import check_store

    async def check() -> list[str]:
        store = await open_store(location, shards=await stored_shards(location))
        try:
            report = await check_store(store, [cls._corral_definition
                                               for cls in load_entities(app)],
                                       sample=SNAPSHOT_SAMPLE, seed=None)
        finally:
            await store.close()
        return [f"{f.entity_type} {f.key!r} run {f.run_id}: {f.error}"
                for f in report.failures]

    return asyncio.run(check())


def deploy_status(namespace: str = "corral", *, address: str | None = None
                  ) -> DeploymentStatus:
    """The deployment's current and previous releases, its hosts (which release each
    runs, how many shards it holds) and how many shards are on the current release.
    Blocking.

    Raises:
        DeploymentNotFoundError: no deployment `namespace` runs.
    """
    import ray

    check_namespace(namespace)
    connect(namespace, address)
    placer = placer_of(namespace)
    spec: RayHostSpec = ray.get(placer.spec_of.remote(), timeout=60)
    release, previous = unwrapped(placer.current.remote(), 60.0)
    directory = assignment(namespace)
    prefix = f"corral/{namespace}/host-"
    named = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                   if a["namespace"] == namespace and a["name"].startswith(prefix))
    held = {name: 0 for name in named}
    for name in directory.values():
        held[name] = held.get(name, 0) + 1
    hosts = tuple(HostStatus(name, host_node_prefix(name), release_of(name), count)
                  for name, count in sorted(held.items()))
    on = 0 if release is None else sum(
        1 for name in directory.values() if release_of(name) == release.id)
    return DeploymentStatus(namespace, release, previous, hosts, spec.shards, on,
                            tuple(sorted(drained_nodes(namespace))))


@dataclass(frozen=True, slots=True)
class RollReport:
    """What `roll_ray_hosts` did: the shards moved, in order, those already on the
    build (skipped), and the seconds the roll took."""

    steps: tuple[RollStep, ...]
    skipped: tuple[int, ...]
    seconds: float


def roll_ray_hosts(namespace: str, entities: Any, *,
                   address: str | None = None, actor_options: dict[str, Any] | None = None,
                   env_vars: Mapping[str, str] | None = None,
                   on_step: Callable[[RollStep], None] | None = None,
                   timeout: float = 120.0) -> RollReport:
    """Declare a release of `entities` (by their import paths: the hosts import them
    in `actor_options["runtime_env"]`) and roll every shard to it: `deploy` with
    `app=` the classes' paths. Blocking.

    Example:
        report = corral.runtime.roll_ray_hosts("helpdesk", [Ticket, Cart],
                                               on_step=print)

    Raises:
        IncompatibleBuildError: the new build cannot succeed the running one; nothing
            moved.
        InvalidArgumentError: a bad `namespace` or `env_vars`, no entity types, a class
            defined in a script or a function, or no deployment `namespace` runs.
        CorralError: a new host did not start or take its shards within `timeout`.
    """
    from .._app_path import app_path

    check_namespace(namespace)
    if not entities:
        raise InvalidArgumentError("roll_ray_hosts needs the entity types of the new build")
    options = with_env_vars(actor_options or {}, env_vars, named="actor_options")
    runtime_env = options.pop("runtime_env", None)
    app = app_path(list(entities))
    connect(namespace, address)
    placer_of(namespace)  # a roll needs a deployment running: DeploymentNotFoundError
    report = deploy(namespace, app=app, runtime_env=runtime_env, actor_options=options,
                    address=address, on_step=on_step, timeout=timeout)
    return RollReport(report.steps, report.skipped, report.seconds)


def connect(namespace: str, address: str | None) -> None:
    """Join the Ray cluster at `address` ("auto" if None) unless connected already."""
    import ray

    if address is not None:
        check_address(address)
    if not ray.is_initialized():
        ray.init(address=address or "auto", namespace=namespace, log_to_driver=False)


def placer_of(namespace: str) -> Any:
    """The placer of `namespace`.

    Raises:
        DeploymentNotFoundError: no deployment runs (it has no placer).
    """
    import ray

    try:
        return ray.get_actor(placer_name(namespace), namespace=namespace)
    except ValueError:
        raise DeploymentNotFoundError(
            f"no Ray deployment {namespace!r} runs on this cluster: declare its first "
            f"release with `corral deploy --namespace {namespace} --app pkg.module:APP "
            f"--store URL` (corral.runtime.deploy), or open_runtime(..., deploy=True)"
        ) from None


def unwrapped(ref: Any, timeout: float) -> Any:
    """`ray.get(ref)`, a corral error raised by the actor raised as itself."""
    import ray

    try:
        return ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError as err:
        raise CorralError(f"the placer did not answer within {timeout:.0f} s; run the "
                          f"call again to resume") from err
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, CorralError):
            raise err.cause from None
        raise


def stop_ray_hosts(namespace: str = "corral", *, timeout: float = 30.0) -> int:
    """Stop every actor of the Ray deployment `namespace`; returns how many were found.

    The only way a deployment stops: host actors are detached and outlive every
    client, by design. This stops the placer first (it would start hosts again), then
    each host cleanly (it releases its lease and closes its store), then kills it for
    good, and forgets the directory. The releases stay in the store: the next `deploy`
    starts afresh, and the new hosts recover every running entity from the store. The
    cluster's log relay (`_logs`) is stopped too when no other deployment has actors
    left. Blocking: call it from a thread in async code.

    Raises:
        InvalidArgumentError: a bad `namespace` (nothing stopped).
    """
    import ray  # here, not at the top: `import corral` must not import Ray
    from ray import exceptions as rex

    check_namespace(namespace)
    prefix = f"corral/{namespace}/"
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == namespace and a["name"].startswith(prefix)]
    with contextlib.suppress(DeploymentNotFoundError):
        placer = placer_of(namespace)  # first: it would start hosts again
        with contextlib.suppress(rex.RayError):
            ray.get(placer.shutdown.remote(), timeout=timeout)
        ray.kill(placer, no_restart=True)
    refs: list[Any] = []
    for name in names:
        try:
            refs.append(ray.get_actor(name, namespace=namespace).shutdown.remote())
        except ValueError:  # gone meanwhile
            continue
    for ref in refs:  # a dead or hung one is killed below all the same
        with contextlib.suppress(rex.RayError):
            ray.get(ref, timeout=timeout)
    for name in names:
        try:
            ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
        except ValueError:
            continue
    clear_directory(namespace)
    retire_relay(namespace)
    return len(names)
