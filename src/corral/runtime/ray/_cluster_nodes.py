"""The nodes of a Ray deployment, for operators: what each holds (`ray_nodes`), and
draining one before it is removed (`drain_node`, `undrain_node`).

A drain asks the deployment's placer (`_placer`), like a roll: it marks the node
drained in the directory (`_directory`), so no round places a shard there again,
and moves the node's shards off through the graceful hand-off, then stops the host
actors left there with nothing to hold. `undrain_node` lifts the mark; the placer's
next rounds even the load out onto the node again.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

from corral._errors import InvalidArgumentError

from ..client._options import check_namespace, check_node_id
from ._deployment import connect, placer_of, unwrapped
from ._directory import assignment, drained_nodes
from ._placer import RollStep, host_node_prefix

__all__ = ["DrainReport", "RayNode", "drain_node", "ray_nodes", "undrain_node"]


@dataclass(frozen=True, slots=True)
class RayNode:
    """One node of the Ray cluster as a deployment sees it (`ray_nodes`).

    Attributes:
        node_id: Ray's node id (`ray.nodes()[i]["NodeID"]`), what `drain_node` takes.
        address: the node's IP address.
        alive: whether Ray counts it alive (a lost node keeps its shards until the
            placer's next round moves them).
        drained: drained with `drain_node` (and not undrained since).
        hosts: the deployment's host actors on it.
        shards: how many of the deployment's shards its hosts hold.
    """

    node_id: str
    address: str
    alive: bool
    drained: bool
    hosts: tuple[str, ...]
    shards: int


def ray_nodes(namespace: str = "corral", *, address: str | None = None
              ) -> tuple[RayNode, ...]:
    """The nodes of the Ray cluster with what the deployment `namespace` places on
    them: every alive node, and a dead or drained one while the deployment still
    counts it; sorted by node id. Blocking.

    Example:
        for node in corral.runtime.ray_nodes("helpdesk"):
            print(node.node_id, node.shards)

    Raises:
        InvalidArgumentError: a bad `namespace`, or no deployment `namespace` runs.
    """
    import ray

    check_namespace(namespace)
    connect(namespace, address)
    placer_of(namespace)
    prefix = f"corral/{namespace}/host-"
    named = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == namespace and a["name"].startswith(prefix)]
    held = collections.Counter(assignment(namespace).values())
    drained = drained_nodes(namespace)
    found = []
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        node_id: str = node["NodeID"]
        hosts = tuple(sorted(h for h in {*named, *held}
                             if node_id.startswith(host_node_prefix(h))))
        if node["Alive"] or node_id in drained or hosts:
            found.append(RayNode(node_id, str(node.get("NodeManagerAddress", "")),
                                 bool(node["Alive"]), node_id in drained, hosts,
                                 sum(held[h] for h in hosts)))
    return tuple(sorted(found, key=lambda n: n.node_id))


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What `drain_node` did: the node, the shards moved off it (in order), the host
    actors stopped there, and the seconds it took."""

    node_id: str
    steps: tuple[RollStep, ...]
    stopped: tuple[str, ...]
    seconds: float


def drain_node(node_id: str, *, namespace: str = "corral", address: str | None = None,
               timeout: float = 300.0) -> DrainReport:
    """Move every shard of the Ray deployment `namespace` off node `node_id` (a Ray
    node id, `ray.nodes()[i]["NodeID"]`) through the graceful hand-off, stop the host
    actors there, and place nothing there again (until `undrain_node`): for a planned
    removal of the node. Blocking: call it from a thread in async code.

    Example:
        report = corral.runtime.drain_node(node_id, namespace="helpdesk")
        print(len(report.steps), "shards moved off", report.node_id)

    Raises:
        InvalidArgumentError: a bad `namespace` or `node_id`, no alive Ray node
            `node_id` (the message lists the alive ones), no deployment `namespace`, or
            no other node that can run its hosts (nothing changed).
        CorralError: a shard could not be moved within `timeout` (run it again).
    """
    check_namespace(namespace)
    check_node_id(node_id)
    connect(namespace, address)
    began = time.monotonic()
    alive = _alive_nodes()
    if node_id not in alive:
        raise InvalidArgumentError(f"no alive Ray node {node_id!r} to drain; the alive "
                                   f"nodes: {', '.join(sorted(alive)) or 'none'}")
    placer = placer_of(namespace)
    steps, stopped = unwrapped(placer.drain.remote(node_id), timeout)
    return DrainReport(node_id, tuple(steps), tuple(stopped), time.monotonic() - began)


def undrain_node(node_id: str, *, namespace: str = "corral",
                 address: str | None = None) -> None:
    """Let the placer of `namespace` place shards on `node_id` again (after
    `drain_node`); its next rounds even the load out onto it. Blocking.

    Raises:
        InvalidArgumentError: a bad `namespace` or `node_id`, a `node_id` that is
            neither alive nor drained (the message lists those that are), or no
            deployment `namespace`.
    """
    import ray

    check_namespace(namespace)
    check_node_id(node_id)
    connect(namespace, address)
    placer = placer_of(namespace)
    known = _alive_nodes() | drained_nodes(namespace)
    if node_id not in known:
        raise InvalidArgumentError(f"no Ray node {node_id!r} is alive or drained in "
                                   f"{namespace!r}; those that are: "
                                   f"{', '.join(sorted(known)) or 'none'}")
    ray.get(placer.undrain.remote(node_id), timeout=60)


def _alive_nodes() -> set[str]:
    import ray

    return {n["NodeID"] for n in ray.nodes()  # type: ignore[no-untyped-call]
            if n["Alive"]}
