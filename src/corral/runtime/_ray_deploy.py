"""Deploying new entity code to a Ray deployment: a rolling replacement of its shard
actors (`roll_ray_hosts`), or stopping them all (`stop_ray_hosts`).

A roll replaces the shard actors one at a time, each through the graceful hand-off the
local backend uses (`_handoff`): for shard k it

1. starts an *heir*, a shard actor running the caller's entity code under a
   build-qualified name (`corral/<ns>/shard-<k>@<build>`), which asks the holder for
   the shard (`request_shards`); the holder stops taking work for it, lets its commits
   in flight land and releases the lease to the heir, which takes it at the next epoch
   and recovers the shard from the store (if no holder answers within two lease terms,
   it takes the shard over: a new epoch fences a dead or hung holder out);
2. records the heir as the shard's host in the directory (`_ray_directory`);
3. retires the old actor: every later call to it is answered `ShardMovedError`
   naming the heir (its clients re-route), the calls in flight finish, then it is
   stopped and killed for good.

What callers see: nothing but a short pause of the shard's entities. Sends meanwhile
are accepted (by the old actor through the store until it retires, by the heir after),
so nothing acknowledged is lost or doubled (accepts are idempotent by message id); a
client of the new build that sends a handler only it has, to a shard an old actor still
hosts, is answered `HandlerNotHostedError` and retries until the shard moves.

Before anything moves, each current actor checks that the new build may succeed its
own (`ShardHost.check_successor`, the rules of `corral builds`): an incompatible roll
is refused with `IncompatibleBuildError` naming the differences; such a change goes
through `stop_ray_hosts`. A roll stopped midway is resumed by running it again (the
shards already on the build are skipped). Dedicated actors keep their code until they
exit when idle (or `stop_ray_hosts`).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from corral._errors import CorralError, InvalidArgumentError
from corral.actors import Entity, EntityDefinition
from corral.actors._manifest import manifest_json

from ._ray_directory import clear_directory, host_of, set_host
from ._ray_host import RayHostSpec, actor_name, shard_actor_class

__all__ = ["RollReport", "RollStep", "roll_ray_hosts", "stop_ray_hosts"]


@dataclass(frozen=True, slots=True)
class RollStep:
    """One shard moved by `roll_ray_hosts`.

    Attributes:
        shard: the shard index.
        old_actor, new_actor: the actor names it moved from and to.
        epoch: the lease epoch the new actor holds it at.
        pause: seconds from the old holder stopping the shard to the new one having
            recovered it (its entities' pause; wall clocks of two processes).
        seconds: how long the whole step took (starting the new actor included).
    """

    shard: int
    old_actor: str
    new_actor: str
    epoch: int
    pause: float
    seconds: float


@dataclass(frozen=True, slots=True)
class RollReport:
    """What `roll_ray_hosts` did: the shards moved, in order, those already on the
    build (skipped), and the seconds the roll took."""

    steps: tuple[RollStep, ...]
    skipped: tuple[int, ...]
    seconds: float


def build_tag(definitions: Sequence[EntityDefinition]) -> str:
    """A short name for a build (every type's fingerprint): new actors' name suffix."""
    text = "\0".join(sorted(f"{d.name}={d.fingerprint}" for d in definitions))
    return hashlib.blake2b(text.encode(), digest_size=5).hexdigest()


def roll_ray_hosts(namespace: str, entities: Sequence[type[Entity]], *,
                   address: str | None = None, actor_options: dict[str, Any] | None = None,
                   on_step: Callable[[RollStep], None] | None = None,
                   timeout: float = 120.0) -> RollReport:
    """Replace the shard actors of the Ray deployment `namespace`, one at a time, with
    actors running `entities` (this process's code), through the graceful hand-off.

    Blocking: call it from a thread in async code. Connects to Ray at `address`
    ("auto" when not connected yet). `actor_options`: Ray options of the new actors
    (e.g. a `runtime_env` shipping the new code). `on_step` is called after each shard
    moved (progress).

    Example:
        report = corral.runtime.roll_ray_hosts("helpdesk", [Ticket, Cart],
                                               on_step=print)

    Raises:
        IncompatibleBuildError: the new build cannot succeed the running one; nothing
            moved.
        InvalidArgumentError: no entity types, or no shard actor of `namespace` runs.
        CorralError: a new actor did not start or take its shard within `timeout`.
    """
    import ray

    if not entities:
        raise InvalidArgumentError("roll_ray_hosts needs the entity types of the new build")
    if not ray.is_initialized():
        ray.init(address=address or "auto", namespace=namespace, log_to_driver=False)
    began = time.monotonic()
    definitions = [cls._corral_definition for cls in entities]
    spec = _spec(namespace)
    current = {k: host_of(namespace, k, actor_name(spec, k)) for k in range(spec.shards)}
    _check_successors(namespace, set(current.values()), definitions, timeout)
    tag = build_tag(definitions)
    steps: list[RollStep] = []
    skipped: list[int] = []
    for index, old in sorted(current.items()):
        new = f"{actor_name(spec, index)}@{tag}"
        if new == old:
            skipped.append(index)
            continue
        step = _move(spec, index, old, new, list(entities), actor_options or {}, timeout)
        steps.append(step)
        if on_step is not None:
            on_step(step)
    _sweep(namespace, spec)
    return RollReport(tuple(steps), tuple(skipped), time.monotonic() - began)


def _actor(name: str, namespace: str) -> Any | None:
    import ray

    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


def _shard_actor_names(namespace: str) -> list[str]:
    import ray

    prefix = f"corral/{namespace}/shard-"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == namespace and a["name"].startswith(prefix))


def _spec(namespace: str) -> RayHostSpec:
    """The deployment's spec, from one of its running shard actors."""
    import ray

    for name in _shard_actor_names(namespace):
        handle = _actor(name, namespace)
        if handle is not None:
            with contextlib.suppress(ray.exceptions.RayActorError):
                return RayHostSpec(**ray.get(handle.info.remote(), timeout=60)["spec"])
    raise InvalidArgumentError(
        f"no shard actor of the Ray deployment {namespace!r} runs: nothing to roll (the "
        f"next call to it starts actors with the caller's code)")


def _unwrap(err: Exception) -> Exception:
    import ray

    if isinstance(err, ray.exceptions.RayTaskError) and isinstance(err.cause, CorralError):
        return err.cause
    return err


def _check_successors(namespace: str, names: set[str], definitions: list[EntityDefinition],
                      timeout: float) -> None:
    """Every current actor must accept the new build as its successor."""
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


def _move(spec: RayHostSpec, index: int, old: str, new: str, entities: list[type[Entity]],
          actor_options: dict[str, Any], timeout: float) -> RollStep:
    """Shard `index` from actor `old` to a new actor `new` (the module's steps 1-3)."""
    import ray

    began = time.monotonic()
    options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 10_000, **actor_options}
    options.update(name=new, namespace=spec.namespace, get_if_exists=True,
                   lifetime="detached", max_restarts=-1, max_task_retries=-1)
    heir = shard_actor_class().options(**options).remote(spec, entities, index, new, True)
    try:
        info = ray.get(heir.info.remote(), timeout=timeout)
    except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError,
            ray.exceptions.GetTimeoutError) as err:
        raise CorralError(f"{new} did not start and take shard {index}: {err}") from err
    if info["epoch"] is None:
        raise CorralError(f"{new} did not take shard {index} within two lease terms")
    set_host(spec.namespace, index, new)  # before the old actor goes: see _ray_directory
    handed_at = None
    retiring = _actor(old, spec.namespace)
    if retiring is not None:
        with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            handed_at = ray.get(retiring.retire.remote(new), timeout=timeout)  # a hung one:
        _stop(retiring, timeout)  # killed all the same
    pause = max(0.0, info["taken_at"] - handed_at) if handed_at else 0.0
    return RollStep(index, old, new, info["epoch"], pause, time.monotonic() - began)


def _stop(handle: Any, timeout: float) -> None:
    """Stop an actor cleanly (it releases what it holds), then kill it for good."""
    import ray
    from ray import exceptions as rex

    with contextlib.suppress(rex.RayActorError, rex.GetTimeoutError, rex.RayTaskError):
        ray.get(handle.shutdown.remote(), timeout=timeout)
    with contextlib.suppress(ValueError):
        ray.kill(handle, no_restart=True)


def _sweep(namespace: str, spec: RayHostSpec) -> None:
    """Stop the shard actors the directory no longer names (re-created by a client
    that resolved an old name: they hold nothing, see `ShardHost._start_host`)."""
    live = {host_of(namespace, k, actor_name(spec, k)) for k in range(spec.shards)}
    for name in _shard_actor_names(namespace):
        if name not in live and (handle := _actor(name, namespace)) is not None:
            _stop(handle, 30.0)


def stop_ray_hosts(namespace: str = "corral", *, timeout: float = 30.0) -> int:
    """Stop every actor of the Ray deployment `namespace`; returns how many were found.

    Shard and dedicated actors are detached: they outlive every driver, by design. This
    stops each one cleanly (it releases its lease and closes its store), then kills it
    for good, and forgets the directory of rolled shards; the next call to the
    deployment creates fresh actors, which recover every running entity from the
    store. For an incompatible change; a compatible one rolls (`roll_ray_hosts`).
    Blocking: call it from a thread in async code.
    """
    import ray  # here, not at the top: `import corral` must not import Ray
    from ray import exceptions as rex

    prefix = f"corral/{namespace}/"
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == namespace and a["name"].startswith(prefix)]
    refs: list[Any] = []
    for name in names:
        try:
            refs.append(ray.get_actor(name, namespace=namespace).shutdown.remote())
        except ValueError:  # gone meanwhile
            continue
    for ref in refs:  # a dead or hung one is killed below all the same
        with contextlib.suppress(rex.RayActorError, rex.GetTimeoutError, rex.RayTaskError):
            ray.get(ref, timeout=timeout)
    for name in names:
        try:
            ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
        except ValueError:
            continue
    clear_directory(namespace)
    return len(names)
