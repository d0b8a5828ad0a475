"""The options of `open_runtime` and the Ray deployment verbs, checked before anything
starts: a wrong type or an out-of-range value is an `InvalidArgumentError` naming the
option, never a Ray traceback from inside an actor, a busy loop, a lease that expires
as it is taken, or a deployment's placer left with a setting that fails every round.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from corral._common import MAX_SHARDS
from corral._errors import InvalidArgumentError

from ._boundary import _FORBIDDEN, Limits

__all__ = ["MAX_SHARDS", "check_address", "check_hosts", "check_namespace", "check_node_id",
           "check_runtime_options", "check_shards"]

_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_runtime_options(*, entities: object, shards: object, host: object,
                          authorize: object, limits: object, lease_ttl: object,
                          poll_interval: object, backend: object, address: object,
                          namespace: object, ray_options: object, env_vars: object,
                          hosts: object, clock: object, deploy: object = False) -> None:
    """Refuse a bad `open_runtime` option (`InvalidArgumentError` naming it)."""
    if backend not in ("local", "ray"):
        raise InvalidArgumentError(f"backend must be 'local' or 'ray', got {backend!r}")
    if isinstance(entities, str | bytes) or not isinstance(entities, Sequence | set | frozenset):
        raise InvalidArgumentError(
            f"entities must be a list of corral.Entity classes, got {_shown(entities)}")
    for cls in entities:
        if not (isinstance(cls, type) and hasattr(cls, "_corral_definition")):
            raise InvalidArgumentError(
                f"entities must hold corral.Entity subclasses, got {_shown(cls)}")
    if shards is not None:
        check_shards(shards)
    if not isinstance(host, bool):
        raise InvalidArgumentError(f"host must be True or False, got {_shown(host)}")
    if authorize is not None and not callable(authorize):
        raise InvalidArgumentError(f"authorize must be None or a callable, got "
                                   f"{_shown(authorize)}")
    if limits is not None and not isinstance(limits, Limits):
        raise InvalidArgumentError(f"limits must be None or a corral.Limits, got "
                                   f"{_shown(limits)}")
    _seconds("lease_ttl", lease_ttl, at_most=3600.0)  # a dead host's shards wait this long
    _seconds("poll_interval", poll_interval, at_most=3600.0)  # 3600: tests that never poll
    if address is not None:
        check_address(address)
    check_namespace(namespace)
    if ray_options is not None and not (
            isinstance(ray_options, Mapping) and all(isinstance(k, str) for k in ray_options)):
        raise InvalidArgumentError(f"ray_options must be None or a mapping of Ray actor "
                                   f"options, got {_shown(ray_options)}")
    if hosts is not None:
        check_hosts(hosts)
    if clock is not None and not all(callable(getattr(clock, m, None))
                                     for m in ("time", "monotonic", "wait")):
        raise InvalidArgumentError(f"clock must be None or a corral.testing clock, got "
                                   f"{_shown(clock)}")
    if not isinstance(deploy, bool):
        raise InvalidArgumentError(f"deploy must be True or False, got {_shown(deploy)}")
    if backend == "local":
        for name, value in (("env_vars", env_vars), ("hosts", hosts),
                            ("ray_options", ray_options), ("address", address),
                            ("deploy", deploy or None)):
            if value is not None:
                raise InvalidArgumentError(
                    f"{name} is for the Ray backend (backend='ray'); a local host runs "
                    f"in this process")
    elif not deploy:
        for name, value in (("env_vars", env_vars), ("hosts", hosts),
                            ("ray_options", ray_options)):
            if value is not None:
                raise InvalidArgumentError(
                    f"{name} is a setting of a Ray deployment's release, which a client "
                    f"never changes: give it to `corral deploy` (corral.runtime.deploy), "
                    f"or open with deploy=True to declare this process's release")


def check_address(address: object) -> str:
    """A Ray address (`"auto"`, `"host:port"`, `"ray://host:10001"`): non-empty text."""
    return _text("address", address)


def check_shards(shards: object) -> int:
    """A store's shard count: an int from 1 to `MAX_SHARDS`."""
    if isinstance(shards, bool) or not isinstance(shards, int) \
            or not 1 <= shards <= MAX_SHARDS:
        raise InvalidArgumentError(
            f"shards must be an int from 1 to {MAX_SHARDS}, got {_shown(shards)}")
    return shards


def check_namespace(namespace: object) -> str:
    """A Ray deployment's namespace: 1-64 letters, digits, '.', '_' or '-', starting
    with a letter or digit (it names the Ray namespace and every actor of the
    deployment, `corral/<namespace>/...`)."""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise InvalidArgumentError(
            f"namespace must be 1-64 letters, digits, '.', '_' or '-' (starting with a "
            f"letter or digit), got {_shown(namespace)}")
    return namespace


def check_node_id(node_id: object) -> str:
    """A Ray node id as text (`ray.nodes()[i]["NodeID"]`): a non-empty str without
    control characters or lone surrogates. Whether such a node exists is the caller's
    question (it asks Ray)."""
    return _text("node_id", node_id)


def check_hosts(hosts: object, shards: int | None = None) -> int | dict[str, int]:
    """`hosts=`: a total number of host actors (>= 1), or {Ray node id: count >= 0}
    with at least one host; at most one host per shard when `shards` is known."""
    if isinstance(hosts, Mapping):
        if not hosts or not all(isinstance(node, str) and node and not _bad_text(node)
                                and _count(n) for node, n in hosts.items()):
            raise InvalidArgumentError(
                f"hosts as a mapping is {{Ray node id: number of host actors >= 0}}, "
                f"not empty, got {_shown(hosts)}")
        total = sum(hosts.values())
        if total < 1:
            raise InvalidArgumentError(f"hosts names no host actor at all: {_shown(hosts)}")
        checked: int | dict[str, int] = dict(hosts)
    elif _count(hosts) and hosts:
        total = checked = int(hosts)  # type: ignore[call-overload]
    else:
        raise InvalidArgumentError(
            f"hosts must be None, a number of host actors >= 1, or {{Ray node id: "
            f"count}}, got {_shown(hosts)}")
    limit = MAX_SHARDS if shards is None else shards
    if total > limit:
        raise InvalidArgumentError(
            f"hosts asks for {total} host actors but a host without a shard does nothing: "
            f"at most one per shard ({limit})")
    return checked


def _count(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) \
        and 0 <= value <= MAX_SHARDS


def _seconds(name: str, value: object, *, at_most: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not (math.isfinite(value) and 0 < value <= at_most):
        raise InvalidArgumentError(
            f"{name} must be a number of seconds > 0 and <= {at_most:g}, got {_shown(value)}")
    return float(value)


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value or _bad_text(value):
        raise InvalidArgumentError(
            f"{name} must be a non-empty string without control characters or lone "
            f"surrogates, got {_shown(value)}")
    return value


def _bad_text(value: str) -> bool:
    return _FORBIDDEN.search(value) is not None


def _shown(value: object) -> str:
    """A value for an error message: its repr, cut short, with its type."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"
