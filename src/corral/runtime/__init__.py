"""Hosting: shards, activations, routing, leases and the client API.

`Shard` is the one host implementation; the local backend runs shards in-process and
the Ray backend wraps the same class in named actors. The runtime reaches storage only
through the `corral.persistence.Store` protocol.
"""

from corral.persistence import DeadLetter

from ._activation import Activation
from ._boundary import Authorize, AuthRequest, Limits
from ._client import EntityRef, Runtime, open_runtime
from ._host import LocalHost
from ._ray_host import stop_ray_hosts
from ._results import Ack, EntityDescription, RunSummary
from ._router import Router
from ._shard import Shard

__all__ = [
    "Ack",
    "Activation",
    "AuthRequest",
    "Authorize",
    "DeadLetter",
    "EntityDescription",
    "EntityRef",
    "Limits",
    "LocalHost",
    "Router",
    "RunSummary",
    "Runtime",
    "Shard",
    "open_runtime",
    "stop_ray_hosts",
]
