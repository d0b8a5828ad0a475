"""The programming model: what entity authors import (through `corral`).

Layering: `corral.actors` imports only the package's leaves (`corral._errors`, the
error hierarchy, and `corral._common`, run statuses and policies), never
`corral.runtime` or `corral.persistence`. The host (`corral.runtime`) implements
`EntityContext` and talks to storage only through the `corral.persistence.Store`
protocol. User code imports `corral` and never the host.
"""

from ._context import EntityContext, Mailbox
from ._control import ContinueAsNew
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
from ._state import StateSchema, StateUpgrade, upgrade
from ._step_key import current_step_key, step_key
from ._waits import SignalWait, WaitDefinition, wait

__all__ = [
    "ContinueAsNew",
    "Entity",
    "EntityContext",
    "EntityDefinition",
    "HandlerDefinition",
    "HandlerKind",
    "Mailbox",
    "MailboxSignal",
    "SignalWait",
    "StateSchema",
    "StateUpgrade",
    "WaitDefinition",
    "current_step_key",
    "query",
    "signal",
    "step_key",
    "update",
    "upgrade",
    "wait",
]
