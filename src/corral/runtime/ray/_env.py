"""What a Ray deployment takes from its environment: the Ray instance it runs in (its
cluster, for the store's hosting claim, `_hosting`) and the environment variables its
actors get (`open_runtime(..., env_vars=...)`).

Several processes, one deployment: every driver, web worker or Serve replica that
opens `open_runtime(store, backend="ray")` must reach the *same* Ray instance. Each
with `address=None` and no Ray running starts a private one; its actors would host the
store beside the first instance's. The second is refused (`StoreHostedElsewhereError`)
rather than joined to the first: a Ray instance started by a driver's `ray.init()`
ends with that driver, so joining it would tie every process to the first one's life.
The fix the error names is to start Ray once (`ray start --head`) and connect every
process to it (`address="auto"` or `RAY_ADDRESS`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

from corral._errors import InvalidArgumentError
from corral.persistence import Store, is_postgres_url, open_store

from ..host._hosting import RAY_HOLDER, HostingKeeper, check_hosting
from ._logs import LIFECYCLE_EVENTS

__all__ = ["check_ray_hosting", "env_vars_of", "ray_cluster", "ray_hosting", "with_env_vars"]


def ray_cluster() -> tuple[str, str]:
    """(cluster, holder) of this process's Ray instance: `ray:<session>` (a session
    names one start of a Ray instance, the same in every process of it, however each
    reached its GCS) and a description for people, with the GCS address to join."""
    import ray

    ctx = ray.get_runtime_context()
    session = ctx.get_session_name()
    return (f"ray:{session}",
            f"{RAY_HOLDER}{ctx.gcs_address} (session {session}); "
            f"host {socket.gethostname()}, pid {os.getpid()}")


def ray_hosting(store: Store, ttl: float) -> HostingKeeper:
    """A host actor's claim on its store for its Ray instance (`open` it before taking
    any lease: `StoreHostedElsewhereError` if another Ray instance's, or local, hosts
    hold the store)."""
    cluster, holder = ray_cluster()
    return HostingKeeper(store, cluster=cluster, holder=holder, ttl=ttl)


async def check_ray_hosting(location: str, shards: int, address: str | None) -> None:
    """The client's check before it creates any actor: refuse when hosts of another
    cluster hold the store at `location` (a PostgreSQL URL, or a SQLite path).

    Skipped where this process cannot see the actors' store: through Ray Client
    (`ray://`, the cluster is elsewhere) or for a SQLite file that does not exist here
    (nothing hosts it yet). The actors check again before they take a lease.

    Raises:
        StoreHostedElsewhereError: naming the other cluster's host and the fix.
    """
    from ray.util.client import ray as ray_client

    client = ray_client.is_connected()  # type: ignore[no-untyped-call]  # Ray Client
    if (address or "").startswith("ray://") or client or not (
            is_postgres_url(location) or os.path.exists(location)):  # noqa: ASYNC240 (a stat)
        return
    store = await open_store(location, shards=shards)
    try:
        await check_hosting(store, ray_cluster()[0])
    finally:
        await store.close()


def with_env_vars(options: Mapping[str, Any], env_vars: Mapping[str, str] | None, *,
                  named: str = "ray_options") -> dict[str, Any]:
    """Ray actor `options` (the caller's argument `named`) whose `runtime_env` carries
    `env_vars` as well, checked.

    `env_vars` and any `runtime_env["env_vars"]` already in `options` are merged; a
    name given in both with two values is refused, as is anything but str -> str, an
    empty name, a name with "=" or NUL, a value with NUL, or a `CORRAL_LIFECYCLE_EVENTS`
    (`_logs.LIFECYCLE_EVENTS`) other than "0" or "1".

    Raises:
        InvalidArgumentError: naming the variable.
    """
    runtime_env = options.get("runtime_env") or {}
    if not isinstance(runtime_env, Mapping):
        raise InvalidArgumentError(f"{named}['runtime_env'] must be a dict, "
                                   f"got {type(runtime_env).__name__}")
    merged = dict(_checked(runtime_env.get("env_vars") or {},
                           f"{named}['runtime_env']['env_vars']"))
    for name, value in _checked(env_vars or {}, "env_vars").items():
        if merged.setdefault(name, value) != value:
            raise InvalidArgumentError(
                f"env_vars[{name!r}] and {named}['runtime_env']['env_vars'][{name!r}] "
                f"differ: give the variable once")
    if merged.get(LIFECYCLE_EVENTS, "0") not in ("0", "1"):
        raise InvalidArgumentError(
            f"{LIFECYCLE_EVENTS} turns the host actors' lifecycle events on ('1') or off "
            f"('0'), got {merged[LIFECYCLE_EVENTS]!r:.80}")
    if not merged:
        return dict(options)
    return {**options, "runtime_env": {**runtime_env, "env_vars": merged}}


def env_vars_of(options: Mapping[str, Any]) -> dict[str, str]:
    """The `runtime_env` env_vars of Ray actor `options` (what `with_env_vars` made)."""
    return dict((options.get("runtime_env") or {}).get("env_vars") or {})


def _checked(env: object, where: str) -> dict[str, str]:
    if not isinstance(env, Mapping):
        raise InvalidArgumentError(f"{where} must be a dict of str to str, "
                                   f"got {type(env).__name__}")
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise InvalidArgumentError(
                f"{where}: {name!r} is not an environment variable name (a non-empty "
                f"str without '=' or NUL)")
        if not isinstance(value, str) or "\0" in value:
            raise InvalidArgumentError(
                f"{where}[{name!r}] must be a str without NUL, got {value!r:.80}")
    return dict(env)


