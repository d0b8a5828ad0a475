"""Which Ray actor hosts each shard of a deployment: the directory clients route by.

The placer (`_placer`) records here, for each shard, the name of the host actor that
holds it (`corral/<namespace>/host-<node>-<n>@<release id>`), in Ray's GCS key-value
store (namespace `corral/<namespace>`, key `shard-<k>`): the same place, with the
same lifetime, as the named actors themselves, readable from drivers, tasks and actors
alike without a store connection. No entry: the shard is not placed yet.

How a client stays right (`_connection.RayBackend`): it resolves the name here each time it
makes a handle (not per call); an actor that has handed its shard off answers
`ShardMovedError` naming its successor, and the client re-routes. A move writes the
entry *before* the old host retires the shard: a stale name costs a redirect, never a
second holder.

The value is an actor name, not "the actor of shard k": several shards name one host
actor (`corral/<ns>/host-<node>-<n>@<release id>`, placed by `_placer`), and every move
(a rebalance, a drain, a roll) is the same two steps: the hand-off, then this entry.
The same namespace keeps the nodes an operator drained (`drained-<node id>`), so the
placer, restarted anywhere, places nothing there again.
"""

from __future__ import annotations

__all__ = ["assignment", "clear_directory", "drained_nodes", "host_of", "set_drained",
           "set_host"]


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


def assignment(namespace: str) -> dict[int, str]:
    """Every recorded {shard: actor name}, in one GCS read (call it off the event loop)."""
    from ray.experimental import internal_kv

    ns = _namespace(namespace).encode()
    keys = internal_kv._internal_kv_list("shard-", namespace=ns)
    if not keys:
        return {}
    gcs = internal_kv.internal_kv_get_gcs_client()  # type: ignore[no-untyped-call]
    values = gcs.internal_kv_multi_get(keys, ns)
    return {int(key[len(b"shard-"):]): value.decode() for key, value in values.items()
            if value is not None}


def set_drained(namespace: str, node_id: str, drained: bool) -> None:
    """Record that no shard may be placed on `node_id` (or may again)."""
    from ray.experimental import internal_kv

    if drained:
        internal_kv._internal_kv_put(f"drained-{node_id}", b"1", overwrite=True,
                                     namespace=_namespace(namespace))
    else:
        internal_kv._internal_kv_del(f"drained-{node_id}", namespace=_namespace(namespace))


def drained_nodes(namespace: str) -> set[str]:
    """The node ids drained with `drain_node` (and not undrained since)."""
    from ray.experimental import internal_kv

    keys = internal_kv._internal_kv_list("drained-", namespace=_namespace(namespace))
    return {key.decode()[len("drained-"):] for key in keys}


def clear_directory(namespace: str) -> None:
    """Forget every recorded host and drained node (`stop_ray_hosts`: the next
    deployment is placed afresh)."""
    from ray.experimental import internal_kv

    for prefix in ("shard-", "drained-"):
        for key in internal_kv._internal_kv_list(prefix, namespace=_namespace(namespace)):
            internal_kv._internal_kv_del(key, namespace=_namespace(namespace))
