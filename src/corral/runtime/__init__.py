"""Hosting: shards, activations, routing, leases and the client API.

Its `__all__` is what users need (the client, its records, `stop_ray_hosts`); the
shard, activation and host classes are internals of their private modules.

`Shard` is the one host implementation; the local backend runs shards in-process and
the Ray backend wraps the same class in named actors. The runtime reaches storage only
through the `corral.persistence.Store` protocol.
"""

from corral.persistence import DeadLetter

from ._boundary import Authorize, AuthRequest, Limits
from ._client import Runtime, open_runtime
from ._ray_host import stop_ray_hosts
from ._ref import EntityRef
from ._results import (
    Ack,
    Delivery,
    DeliveryStatus,
    EntityDescription,
    EntitySummary,
    Page,
    RunSummary,
    SignalWaitInfo,
)

__all__ = [
    "Ack",
    "AuthRequest",
    "Authorize",
    "DeadLetter",
    "Delivery",
    "DeliveryStatus",
    "EntityDescription",
    "EntityRef",
    "EntitySummary",
    "Limits",
    "Page",
    "RunSummary",
    "Runtime",
    "SignalWaitInfo",
    "open_runtime",
    "stop_ray_hosts",
]
