"""Hosting: shards, activations, routing, leases and the client API.

Its `__all__` is what users need (the client, its records, `roll_ray_hosts`,
`ray_nodes`, `drain_node` and `stop_ray_hosts`); the shard, activation and host classes are
internals of their private modules.

`Shard` is the one host implementation; the local backend runs shards in-process and
the Ray backend wraps the same class in named actors. The runtime reaches storage only
through the `corral.persistence.Store` protocol.

The path of a signal (`ref.signal_with_start(...)`; updates, deliveries and reads take
the same path as other `_ops` records):

Local backend, one process:

1. `_ref.EntityRef._signal` checks handler, payload, start input and id (`_boundary`)
   and builds a `persistence.Acceptance` that names its shard (`_router.Router`).
2. `_backend.LocalBackend.run(acc)` hands it, by kind, to `LocalBackend.accept`:
   `Store.accept` starts, dedupes and appends in one group commit (SQLite: the
   store's `CommitQueue`, its writer task, one transaction in the writer thread).
3. `LocalBackend._accepted` gives the committed entry to the shard this process
   hosts: `_shard.Shard.enqueue` (or `enqueue_started` for a run it just started),
   then `_activation.Activation.enqueue`, which applies a sync signal at once
   (`_apply_now`) or queues it for the activation's worker task (`_drain`, `_apply`).
   The caller's `Ack` comes back from step 2; applying never holds it up. Another
   process hosting the shard finds the entry by tailing the journal (`_host`; a
   store's tail leaves out what its own process committed and handed over here).

Ray backend, client process -> host actor:

1. As local step 1, in the client process.
2. `_ray.RayBackend.run(acc)` queues it per shard; on the event loop's next turn
   (`_flush`) the shard's queue goes as one `_ops.AcceptBatch` in one Ray call
   (`RayBackend.call`: the shard's host actor as the directory names it, placed by
   the deployment's placer if need be; re-routed on `ShardMovedError`, retried while
   it restarts).
3. In the actor, `_ray_host.ShardHost.handle(batch)` checks the routing (each key
   hashed again only if the batch was routed with another shard count) and runs
   `LocalBackend.accept_many`: one group commit, then local step 3 for each entry;
   the results travel back as `AcceptResult.to_wire` tuples to each caller's future.
   Every other record is one `ShardHost.handle(op)` call, run by the actor's
   `LocalBackend.run(op)`.
"""

from corral.persistence import DeadLetter

from ._build_registration import BuildInfo
from ._open import open_runtime
from .client._boundary import Authorize, AuthRequest, Limits
from .client._inspection import EntityHistory, EntityState, MessageInfo, TimerInfo, WaitSummary
from .client._options import MAX_SHARDS
from .client._ref import QUERY_TIMEOUT, EntityRef
from .client._results import (
    Ack,
    Delivery,
    DeliveryStatus,
    EntityDescription,
    EntitySummary,
    Page,
    RunSummary,
    SignalWaitInfo,
)
from .client._runtime import Runtime
from .client._signal_many import SignalItem
from .ray._cluster_nodes import DrainReport, RayNode, drain_node, ray_nodes, undrain_node
from .ray._rolling import RollReport, RollStep, roll_ray_hosts, stop_ray_hosts

__all__ = [
    "MAX_SHARDS",
    "QUERY_TIMEOUT",
    "Ack",
    "AuthRequest",
    "Authorize",
    "BuildInfo",
    "DeadLetter",
    "Delivery",
    "DeliveryStatus",
    "DrainReport",
    "EntityDescription",
    "EntityHistory",
    "EntityRef",
    "EntityState",
    "EntitySummary",
    "Limits",
    "MessageInfo",
    "Page",
    "RayNode",
    "RollReport",
    "RollStep",
    "RunSummary",
    "Runtime",
    "SignalItem",
    "SignalWaitInfo",
    "TimerInfo",
    "WaitSummary",
    "drain_node",
    "open_runtime",
    "ray_nodes",
    "roll_ray_hosts",
    "stop_ray_hosts",
    "undrain_node",
]
