"""corral: durable, addressable entities for Python on Ray.

Entities are addressed by business key; `signal_with_start` starts one if needed and
delivers the message in one atomic, durable step. See README.md.

Layering, bottom up: the leaves `corral._errors` (the error hierarchy) and
`corral._common` (run statuses and policies), which import nothing of corral; then
`corral.actors` (the programming model) and `corral.persistence` (the `Store`
protocol and the SQLite store), which import only the leaves and never each other;
then `corral.runtime` (shards, activations, routing, the client), which uses storage
only through `Store`. This module re-exports the user-facing surface.
"""

from corral._app import App
from corral._common import (
    ContinueAsNewPolicy,
    DedupeWindow,
    IdReusePolicy,
    RetryPolicy,
    RunStatus,
    SnapshotPolicy,
    WaitStatus,
)
from corral._errors import (
    CorralError,
    DeadLetterNotFoundError,
    DefinitionMismatchError,
    EntityClosedError,
    EntityDefinitionError,
    EntityFailedError,
    EntityNotRunningError,
    EntityTerminatedError,
    FailRun,
    IdempotencyConflictError,
    InvalidArgumentError,
    InvalidKeyError,
    InvalidPayloadError,
    LeaseLostError,
    PayloadTooLargeError,
    SignalTimeoutError,
    SnapshotRestoreError,
    StoreError,
    StoreUnavailableError,
    UnauthorizedError,
    UnknownEntityTypeError,
    UnknownHandlerError,
    UpdateFailedError,
    WaitTimeoutError,
)
from corral.actors import (
    Entity,
    Mailbox,
    SignalWait,
    query,
    signal,
    update,
    wait,
)
from corral.runtime import (
    Ack,
    AuthRequest,
    DeadLetter,
    Delivery,
    EntityDescription,
    EntityRef,
    EntitySummary,
    Limits,
    Page,
    RunSummary,
    Runtime,
    SignalWaitInfo,
    open_runtime,
)

__all__ = [
    "Ack",
    "App",
    "AuthRequest",
    "ContinueAsNewPolicy",
    "CorralError",
    "DeadLetter",
    "DeadLetterNotFoundError",
    "DedupeWindow",
    "DefinitionMismatchError",
    "Delivery",
    "Entity",
    "EntityClosedError",
    "EntityDefinitionError",
    "EntityDescription",
    "EntityFailedError",
    "EntityNotRunningError",
    "EntityRef",
    "EntitySummary",
    "EntityTerminatedError",
    "FailRun",
    "IdReusePolicy",
    "IdempotencyConflictError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "InvalidPayloadError",
    "LeaseLostError",
    "Limits",
    "Mailbox",
    "Page",
    "PayloadTooLargeError",
    "RetryPolicy",
    "RunStatus",
    "RunSummary",
    "Runtime",
    "SignalTimeoutError",
    "SignalWait",
    "SignalWaitInfo",
    "SnapshotPolicy",
    "SnapshotRestoreError",
    "StoreError",
    "StoreUnavailableError",
    "UnauthorizedError",
    "UnknownEntityTypeError",
    "UnknownHandlerError",
    "UpdateFailedError",
    "WaitStatus",
    "WaitTimeoutError",
    "open_runtime",
    "query",
    "signal",
    "update",
    "wait",
]
__version__ = "0.1.0"
