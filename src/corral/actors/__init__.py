"""The programming model: what entity authors import.

Layering: `corral.actors` is the bottom layer and imports neither `corral.runtime` nor
`corral.persistence`. The host (`corral.runtime`) implements `EntityContext` and talks
to storage only through the `corral.persistence.Store` protocol. User code imports
`corral` and never the host.
"""

from ._context import EntityContext, Mailbox
from ._definition import (
    EntityDefinition,
    HandlerDefinition,
    HandlerKind,
    MailboxSignal,
    query,
    signal,
    update,
)
from ._entity import Entity
from ._errors import (
    ContinueAsNew,
    CorralError,
    DeadLetterNotFoundError,
    EntityClosedError,
    EntityDefinitionError,
    EntityFailedError,
    EntityNotRunningError,
    EntityTerminatedError,
    IdempotencyConflictError,
    InvalidArgumentError,
    InvalidKeyError,
    InvalidPayloadError,
    LeaseLostError,
    PayloadTooLargeError,
    SnapshotRestoreError,
    StoreError,
    UnauthorizedError,
    UnknownEntityTypeError,
    UnknownHandlerError,
    UpdateFailedError,
)
from ._policy import (
    ContinueAsNewPolicy,
    DedupeWindow,
    IdReusePolicy,
    RetryPolicy,
    RunStatus,
    SnapshotPolicy,
)

__all__ = [
    "ContinueAsNew",
    "ContinueAsNewPolicy",
    "CorralError",
    "DeadLetterNotFoundError",
    "DedupeWindow",
    "Entity",
    "EntityClosedError",
    "EntityContext",
    "EntityDefinition",
    "EntityDefinitionError",
    "EntityFailedError",
    "EntityNotRunningError",
    "EntityTerminatedError",
    "HandlerDefinition",
    "HandlerKind",
    "IdReusePolicy",
    "IdempotencyConflictError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "InvalidPayloadError",
    "LeaseLostError",
    "Mailbox",
    "MailboxSignal",
    "PayloadTooLargeError",
    "RetryPolicy",
    "RunStatus",
    "SnapshotPolicy",
    "SnapshotRestoreError",
    "StoreError",
    "UnauthorizedError",
    "UnknownEntityTypeError",
    "UnknownHandlerError",
    "UpdateFailedError",
    "query",
    "signal",
    "update",
]
