"""The seam between the client and whatever hosts the entities: `Backend`.

Everything a caller does through `EntityRef` and `Runtime` is checked and authorized in
the client (`_boundary`), then becomes one request record (`_requests`; an `Acceptance`
for a send, a `DeliveryRequest` for a delivery to a signal wait) handed to
`Backend.handle`. Two backends implement it: `host._local_backend.LocalBackend` serves
the records in this process (the store plus the shards this process hosts), and
`ray._connection.RayBackend` sends each to the Ray host actor that holds its shard,
where a `LocalBackend` serves it. Nothing in the client knows which one it talks to:
`corral.runtime._open.open_runtime` picks one and hands it to `Runtime`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, overload

from prometheus_client.core import Metric

from corral.persistence import Acceptance, AcceptResult, DeliveryRequest, DeliveryResult, Store

from ._requests import Request

__all__ = ["Backend", "HostedShards"]

R = TypeVar("R")


class HostedShards(Protocol):
    """The shards this process hosts, as `Runtime.host` shows them (local backend)."""

    @property
    def owner(self) -> str:
        """This host's lease owner id, unique per open."""
        ...

    @property
    def shards(self) -> Mapping[int, Any]:
        """The shards held now, by number."""
        ...

    async def request_shards(self, indexes: Sequence[int], *, timeout: float | None = None
                             ) -> dict[int, int]:
        """Ask the holders of `indexes` to hand them here and wait until they have (or
        `timeout`); {shard: epoch} held here now."""
        ...


class Backend(Protocol):
    """Where the operations behind `EntityRef` and `Runtime` run, after validation and
    authorization.

    The contract, for every implementation:

    - `handle(request)` carries out one request record where its shard is hosted (the
      record names it: `request.shard`; None for a store-wide read, which any host
      answers) and returns its answer, the type the record declares (`Request[R]`). An
      `Acceptance` is durable when its `AcceptResult` comes back (start, dedupe and
      append in one transaction) and has been handed to the entity's host; the answer
      never waits for the entity's handlers. A `DeliveryRequest` is decided and
      recorded, and wakes the waiting run.
    - Errors are `CorralError` subclasses the caller can act on
      (`StoreUnavailableError`, `EntityNotRunningError`, ...); a record that is not a
      request is a `TypeError` (a bug in the client).
    - A call reaches the store at most once when `calls_once` is true (never retried
      with the same arguments): an id the client made for the call is new to the store.
    - `close()` stops what this backend started in this process and is idempotent.
    """

    calls_once: bool
    """Each call reaches the store at most once (never retried with the same arguments),
    so an id the ref made for its call is new to the store (`Acceptance.fresh_id`)."""

    @overload
    def handle(self, request: Acceptance) -> Awaitable[AcceptResult]: ...
    @overload
    def handle(self, request: DeliveryRequest) -> Awaitable[DeliveryResult]: ...
    @overload
    def handle(self, request: Request[R]) -> Awaitable[R]: ...
    def handle(self, request: Any) -> Awaitable[Any]:
        """Carry out `request` where its shard is hosted; its answer."""
        ...

    @property
    def store(self) -> Store:
        """The store this process opened; `CorralError` if the backend keeps its store
        inside remote hosts."""
        ...

    @property
    def host(self) -> HostedShards | None:
        """The shards this process hosts, or None."""
        ...

    async def host_metrics(self) -> list[Metric]:
        """The metric families of the hosts that run outside this process (none on the
        local backend: it counts into this process's registry)."""
        ...

    async def close(self) -> None:
        """Stop what this backend started in this process (idempotent)."""
        ...
