"""corral: durable, addressable entities for Python on Ray.

Entities are addressed by business key; `signal_with_start` starts one if needed and
delivers the message in one atomic, durable step. See README.md.

Layering, bottom up: `corral.actors` (the programming model; imports nothing of
corral), `corral.persistence` (the `Store` protocol and the SQLite store; imports only
`actors`), `corral.runtime` (shards, activations, routing, client; uses storage only
through `Store`). This module re-exports the user-facing surface.
"""

from corral.actors import (
    ContinueAsNewPolicy,
    CorralError,
    DeadLetterNotFoundError,
    DedupeWindow,
    Entity,
    EntityClosedError,
    EntityDefinitionError,
    EntityFailedError,
    EntityNotRunningError,
    EntityTerminatedError,
    IdempotencyConflictError,
    IdReusePolicy,
    InvalidArgumentError,
    InvalidKeyError,
    InvalidPayloadError,
    LeaseLostError,
    Mailbox,
    PayloadTooLargeError,
    RetryPolicy,
    RunStatus,
    SnapshotPolicy,
    SnapshotRestoreError,
    StoreError,
    UnauthorizedError,
    UnknownEntityTypeError,
    UnknownHandlerError,
    UpdateFailedError,
    query,
    signal,
    update,
)
from corral.runtime import (
    Ack,
    AuthRequest,
    DeadLetter,
    EntityDescription,
    EntityRef,
    Limits,
    RunSummary,
    Runtime,
    open_runtime,
)

__all__ = [
    "Ack",
    "AuthRequest",
    "ContinueAsNewPolicy",
    "CorralError",
    "DeadLetter",
    "DeadLetterNotFoundError",
    "DedupeWindow",
    "Entity",
    "EntityClosedError",
    "EntityDefinitionError",
    "EntityDescription",
    "EntityFailedError",
    "EntityNotRunningError",
    "EntityRef",
    "EntityTerminatedError",
    "IdReusePolicy",
    "IdempotencyConflictError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "InvalidPayloadError",
    "LeaseLostError",
    "Limits",
    "Mailbox",
    "PayloadTooLargeError",
    "RetryPolicy",
    "RunStatus",
    "RunSummary",
    "Runtime",
    "SnapshotPolicy",
    "SnapshotRestoreError",
    "StoreError",
    "UnauthorizedError",
    "UnknownEntityTypeError",
    "UnknownHandlerError",
    "UpdateFailedError",
    "open_runtime",
    "query",
    "signal",
    "update",
]
__version__ = "0.1.0"
