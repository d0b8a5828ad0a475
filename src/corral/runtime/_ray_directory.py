"""Which Ray actor hosts each shard of a deployment: the directory clients route by.

A deployment starts with one actor per shard under the shard's own name
(`corral/<namespace>/shard-<k>`). A rolling deploy (`_ray_deploy`) replaces each with an
actor under a build-qualified name (`.../shard-<k>@<build>`) and records the new name
here, in Ray's GCS key-value store (namespace `corral/<namespace>`, key `shard-<k>`):
the same place, with the same lifetime, as the named actors themselves, readable from
drivers, tasks and actors alike without a store connection. No entry: the shard's
own name.

How a client stays right (`_ray.RayBackend`): it resolves the name here each time it
makes a handle (not per call); an actor that has handed its shard off answers
`ShardMovedError` naming its successor, and the client re-routes. The roll writes the
entry *before* it kills the old actor, so a client that resolved the old name just
before and re-creates it by name (`get_if_exists`) makes an actor that reads the new
entry at start, takes no lease, and answers `ShardMovedError` (`ShardHost`): a stale
name costs a redirect, never a second holder.

The value is an actor name, not "the actor of shard k": several shards may name one
actor (many shards per host actor, issue 25), and a rebalance moves a shard by the
same two steps (hand-off, then this entry).
"""

from __future__ import annotations

__all__ = ["clear_directory", "host_of", "set_host"]


def _namespace(namespace: str) -> str:
    return f"corral/{namespace}"


def host_of(namespace: str, index: int, default: str) -> str:
    """The name of the actor hosting shard `index` (`default` if none was recorded).
    A GCS read: call it off the event loop."""
    from ray.experimental import internal_kv

    value = internal_kv._internal_kv_get(f"shard-{index}", namespace=_namespace(namespace))
    return default if value is None else value.decode()


def set_host(namespace: str, index: int, actor: str) -> None:
    """Record that `actor` hosts shard `index` now (after the shard was handed to it)."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(f"shard-{index}", actor, overwrite=True,
                                 namespace=_namespace(namespace))


def clear_directory(namespace: str) -> None:
    """Forget every recorded host (`stop_ray_hosts`: the next actors take their own names)."""
    from ray.experimental import internal_kv

    for key in internal_kv._internal_kv_list("shard-", namespace=_namespace(namespace)):
        internal_kv._internal_kv_del(key, namespace=_namespace(namespace))
