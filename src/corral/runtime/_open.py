"""`open_runtime`: where a client meets its backend (the composition root).

It checks the options, then builds the backend the caller asked for (the local one:
this process's store, build registration and, with `host=True`, its shards; or a
connection to the Ray deployment) and hands it to a `client.Runtime`, which knows the
backend only through the `client.Backend` seam. The only runtime module that imports all
three roles (client, host, ray).

`open_runtime` is the runtime's one `open_*`, as `open_store` is the store's, hence the
name this module shares with `corral.persistence._open` (which it calls).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from corral._errors import InvalidArgumentError, ShardCountError
from corral.actors import Entity, EntityDefinition
from corral.persistence import Store, open_store

from ._build_registration import BuildRegistration, process_id
from ._clock import Clock, SystemClock
from .client._boundary import Authorize, Boundary, Limits
from .client._options import check_runtime_options
from .client._router import Router
from .client._runtime import Runtime
from .host._host import LocalHost
from .host._hosting import LOCAL, HostingKeeper, local_holder
from .host._local_backend import LocalBackend

__all__ = ["LOCAL_SHARDS", "open_runtime"]


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
    deploy: bool = False,
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
        backend: `"local"` (this process hosts) or `"ray"`: this process is a client of
            the Ray deployment `namespace`, whose shards are held by a few named,
            detached host actors running its declared release (`corral deploy`,
            `corral.runtime.deploy`; or `deploy=True` here); `host` is then ignored and
            `store` must be the deployment's (a PostgreSQL URL, or a file path every
            host actor can open, so one machine). A client never starts, changes or
            stops a host: no deployment running is `DeploymentNotFoundError`, and its
            close stops nothing. Ray is joined (`ray.init(address=address,
            namespace=namespace)`) unless already initialized; a process whose
            `ray.init` started a private Ray instance ends it on close. The host actors
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
        ray_options: Ray backend, with `deploy=True`: the host actors' Ray options, such
            as `{"runtime_env": {"working_dir": "."}}` or `{"num_cpus": 1}` (default
            `num_cpus=0`).
        env_vars: Ray backend, with `deploy=True`: environment variables of the host
            actors (the Ray tasks of their steps inherit them), merged into
            `runtime_env["env_vars"]`. None are forwarded by default: the actors do
            not see this process's `os.environ`. Names and values are str (no NUL, no
            "=" in a name).
        hosts: Ray backend, with `deploy=True`: how many host actors hold the shards:
            an int (the total, spread over the alive nodes) or {node id: count}
            (other nodes: one); default one per alive node; at most one per shard.
        clock: local backend: the clock entities see (timers, deadlines, idle time,
            `Entity.now()`); `corral.testing` passes a virtual one. Default: the system's.
        deploy: Ray backend: first declare a release of `entities` (by their import
            paths, so they must live in importable modules, not in `__main__`) with
            `ray_options`, `env_vars`, `hosts`, `shards`, `lease_ttl` and
            `poll_interval`, unless it is the current one (`corral.runtime.deploy`
            with `wait=True`: the deployment is started, or rolled to it), then connect
            as a client. One call for a single-process start; a fleet declares its
            release once, with `corral deploy`.

    Raises:
        InvalidArgumentError: an option that does not fit, before anything starts
            (a wrong type or a value out of the bounds above, two entity types of one
            name, an unknown `backend`; `address`, `ray_options`, `env_vars` or
            `hosts` with the local backend; with `backend="ray"`: a `Store` object, an
            in-memory store, or a `clock`). Also a `ValueError`.
        IncompatibleBuildError: local backend: this process's build of an entity type
            cannot run beside the newest one registered in the store (see `_build_registration`);
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
        clock=clock, deploy=deploy)
    definitions: dict[str, EntityDefinition] = {}
    for cls in entities:
        definition: EntityDefinition = cls._corral_definition
        if definitions.setdefault(definition.name, definition) is not definition:
            raise InvalidArgumentError(f"two entity types are named {definition.name!r}")
    if backend == "ray":
        from .ray._connection import connect_ray  # imports Ray only when asked for
        from .ray._logs import LogFollower

        if clock is not None:
            raise InvalidArgumentError("a clock is for the local backend (corral.testing)")
        if not isinstance(store, str):
            raise InvalidArgumentError("the Ray backend takes the store as a path or URL "
                                       "(each host actor opens it), not a Store object")
        declare = None
        if deploy:
            declare = _declaring(store, entities, namespace=namespace, address=address,
                                 ray_options=ray_options, env_vars=env_vars, hosts=hosts,
                                 shards=shards, lease_ttl=lease_ttl,
                                 poll_interval=poll_interval)
        began = time.time()  # the hosts a deploy starts log from then on
        ray_backend, placement = await connect_ray(
            store, definitions, shards=shards, address=address, namespace=namespace,
            deploy=declare)
        follower = LogFollower(namespace)  # the host actors' logs, on this process's
        follower.open(since=began)
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
            await local.open()
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


def _declaring(store: str, entities: Sequence[type[Entity]], *, namespace: str,
               address: str | None, ray_options: Mapping[str, Any] | None,
               env_vars: Mapping[str, str] | None, hosts: int | Mapping[str, int] | None,
               shards: int | None, lease_ttl: float, poll_interval: float
               ) -> Callable[[], Any]:
    """`deploy=True`: the blocking call declaring a release of `entities`."""
    from ._app_path import app_path
    from .ray._deployment import deploy
    from .ray._env import with_env_vars

    app = app_path(entities)  # refused here (a class in a script) before Ray starts
    options = with_env_vars(ray_options or {}, env_vars)  # checked before Ray starts too
    runtime_env = options.pop("runtime_env", None)
    return functools.partial(
        deploy, namespace, app=app, store=store, runtime_env=runtime_env, hosts=hosts,
        actor_options=options, shards=shards, address=address,
        lease_ttl=lease_ttl, poll_interval=poll_interval)


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
