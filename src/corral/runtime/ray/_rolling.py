"""Operating a Ray deployment's hosts: a rolling deploy of new entity code
(`roll_ray_hosts`) or stopping them all (`stop_ray_hosts`); draining a node is
`_cluster_nodes`. Each asks the deployment's placer (`_placer`), the one actor
that moves shards, so a roll, a drain and the placer's own rebalancing never move one
shard twice at once.

A roll makes the caller's build the placer's; the placer then starts a host actor of
the new build on each node (`corral/<ns>/host-<node>-<n>@<build>`) and moves the shards
to it one at a time, through the graceful hand-off every move uses: the new host asks
the holder for the shard (`request_shards`); the holder stops taking work for it, lets
its commits in flight land and releases the lease, which the new host takes at the next
epoch and recovers from the store (if no holder answers within two lease terms, it
takes the shard over: a new epoch fences a dead or hung holder out); the directory
(`_directory`) names the new host; the old one retires the shard (every later
call is answered `ShardMovedError` naming the new host; its clients re-route). Old
hosts left with no shard are stopped.

What callers see: nothing but a short pause of the shard's entities. Sends meanwhile
are accepted (by the old host through the store until it retires, by the new one
after), so nothing acknowledged is lost or doubled (accepts are idempotent by message
id); a client of the new build that sends a handler only it has, to a shard an old host
still holds, is answered `HandlerNotHostedError` and retries until the shard moves.

Before anything moves, each current host checks that the new build may succeed its
own (`ShardHost.check_successor`, the rules of `corral builds`): an incompatible roll
is refused with `IncompatibleBuildError` naming the differences; such a change goes
through `stop_ray_hosts`. A roll stopped midway is resumed by running it again (the
shards already on the build are skipped). Dedicated actors keep their code until they
exit when idle (or `stop_ray_hosts`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral._errors import CorralError, InvalidArgumentError
from corral.actors import Entity, EntityDefinition
from corral.actors._manifest import manifest_json

from ..client._options import check_address, check_namespace
from ._directory import assignment, clear_directory
from ._env import with_env_vars
from ._logs import retire_relay
from ._placer import RollStep, build_tag, placer_name
from ._shard_host import RayHostSpec

__all__ = ["RollReport", "RollStep", "connect", "placer_of", "roll_ray_hosts",
           "stop_ray_hosts", "unwrapped"]


@dataclass(frozen=True, slots=True)
class RollReport:
    """What `roll_ray_hosts` did: the shards moved, in order, those already on the
    build (skipped), and the seconds the roll took."""

    steps: tuple[RollStep, ...]
    skipped: tuple[int, ...]
    seconds: float


def roll_ray_hosts(namespace: str, entities: Sequence[type[Entity]], *,
                   address: str | None = None, actor_options: dict[str, Any] | None = None,
                   env_vars: Mapping[str, str] | None = None,
                   on_step: Callable[[RollStep], None] | None = None,
                   timeout: float = 120.0) -> RollReport:
    """Move every shard of the Ray deployment `namespace`, one at a time, to host actors
    running `entities` (this process's code), through the graceful hand-off, and stop
    the old hosts.

    Blocking: call it from a thread in async code. Connects to Ray at `address`
    ("auto" when not connected yet). `actor_options`: Ray options of the new actors
    (e.g. a `runtime_env` shipping the new code); the placer uses them for every host
    from then on. `env_vars`: environment variables of the new host actors, checked
    and merged into `actor_options`' `runtime_env` as `open_runtime`'s `env_vars` are
    (the old hosts' variables do not carry over: give them again). `on_step` is called
    after each shard moved (progress).

    Example:
        report = corral.runtime.roll_ray_hosts("helpdesk", [Ticket, Cart],
                                               on_step=print)

    Raises:
        IncompatibleBuildError: the new build cannot succeed the running one; nothing
            moved.
        InvalidArgumentError: a bad `namespace` or `env_vars`, no entity types, or no
            deployment `namespace` runs (nothing moved).
        CorralError: a new host did not start or take its shards within `timeout`.
    """
    import ray

    check_namespace(namespace)
    if not entities:
        raise InvalidArgumentError("roll_ray_hosts needs the entity types of the new build")
    options = with_env_vars(actor_options or {}, env_vars, named="actor_options")
    connect(namespace, address)
    began = time.monotonic()
    definitions = [cls._corral_definition for cls in entities]
    placer = placer_of(namespace, "nothing to roll (the next call to it starts hosts with "
                                "the caller's code)")
    spec: RayHostSpec = ray.get(placer.spec_of.remote(), timeout=timeout)
    current = assignment(namespace)
    _check_successors(namespace, set(current.values()), definitions, timeout)
    tag = build_tag(definitions)
    skipped = tuple(k for k in range(spec.shards) if current.get(k, "").endswith(f"@{tag}"))
    ray.get(placer.roll.remote(list(entities), options), timeout=timeout)
    steps: list[RollStep] = []
    while True:
        moved, _ = unwrapped(placer.roll_step.remote(), timeout)
        if not moved:
            break
        for step in moved:
            steps.append(step)
            if on_step is not None:
                on_step(step)
    left = [k for k, name in assignment(namespace).items() if not name.endswith(f"@{tag}")]
    if left:
        raise CorralError(f"shards {left} could not be moved to build {tag} (a new host "
                          f"did not start or take them within {timeout:.0f} s): run the "
                          f"roll again to resume it")
    return RollReport(tuple(steps), skipped, time.monotonic() - began)


def connect(namespace: str, address: str | None) -> None:
    """Join the Ray cluster at `address` ("auto" if None) unless connected already."""
    import ray

    if address is not None:
        check_address(address)
    if not ray.is_initialized():
        ray.init(address=address or "auto", namespace=namespace, log_to_driver=False)


def placer_of(namespace: str, why: str) -> Any:
    """The placer of `namespace`, or InvalidArgumentError (no deployment runs)."""
    import ray

    try:
        return ray.get_actor(placer_name(namespace), namespace=namespace)
    except ValueError:
        raise InvalidArgumentError(
            f"no Ray deployment {namespace!r} runs (it has no placer): {why}") from None


def unwrapped(ref: Any, timeout: float) -> Any:
    """`ray.get(ref)`, a corral error raised by the actor raised as itself."""
    import ray

    try:
        return ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError as err:
        raise CorralError(f"the placer did not finish within {timeout:.0f} s; run the "
                          f"call again to resume") from err
    except ray.exceptions.RayTaskError as err:
        raise _unwrap(err) from None


def _unwrap(err: Exception) -> Exception:
    import ray

    if isinstance(err, ray.exceptions.RayTaskError) and isinstance(err.cause, CorralError):
        return err.cause
    return err


def _actor(name: str, namespace: str) -> Any | None:
    import ray

    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


def _check_successors(namespace: str, names: set[str], definitions: list[EntityDefinition],
                      timeout: float) -> None:
    """Every current host must accept the new build as its successor."""
    import ray

    manifests = {d.name: manifest_json(d) for d in definitions}
    refs = [h.check_successor.remote(manifests) for name in sorted(names)
            if (h := _actor(name, namespace)) is not None]
    refused: list[Exception] = []
    for ref in refs:  # every answer read: none left to be logged as unhandled
        try:
            ray.get(ref, timeout=timeout)
        except ray.exceptions.RayTaskError as err:
            refused.append(_unwrap(err))
    if refused:
        raise refused[0]


def stop_ray_hosts(namespace: str = "corral", *, timeout: float = 30.0) -> int:
    """Stop every actor of the Ray deployment `namespace`; returns how many were found.

    Shard and dedicated actors are detached: they outlive every driver, by design. This
    stops each one cleanly (it releases its lease and closes its store), then kills it
    for good, and forgets the directory of rolled shards; the next call to the
    deployment creates fresh actors, which recover every running entity from the
    store. For an incompatible change; a compatible one rolls (`roll_ray_hosts`).
    The cluster's log relay (`_logs`) is stopped too when no other deployment has
    actors left; the next one starts it again.
    Blocking: call it from a thread in async code.

    Raises:
        InvalidArgumentError: a bad `namespace` (nothing stopped).
    """
    import ray  # here, not at the top: `import corral` must not import Ray
    from ray import exceptions as rex

    check_namespace(namespace)
    prefix = f"corral/{namespace}/"
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == namespace and a["name"].startswith(prefix)]
    placer = _actor(placer_name(namespace), namespace)
    if placer is not None:  # first: it would start hosts again
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
