"""Building an entity instance and applying one journal entry to it.

Shared by live activations and by read-only replicas (queries answered from the store).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from corral._common import RetryPolicy
from corral.actors import (
    ContinueAsNew,
    Entity,
    EntityContext,
    EntityDefinition,
    HandlerDefinition,
    HandlerKind,
    Mailbox,
)
from corral.persistence import JournalEntry, UpdateOutcome

from .._payloads import decode_model
from ..client._results import encode_value

__all__ = [
    "ReplicaContext",
    "Unappliable",
    "apply_entry",
    "decode_arg",
    "entry_handler",
    "instantiate",
    "run_query",
]

log = logging.getLogger("corral.apply")


def instantiate(definition: EntityDefinition, start_input: str | None,
                context: EntityContext) -> Entity:
    """Create the entity: attach its context and mailbox, then call `__init__(start)`."""
    cls = definition.cls
    entity: Entity = object.__new__(cls)
    entity._corral_context = context
    entity.mailbox = Mailbox(context)
    if definition.start_type is None:
        entity.__init__()  # type: ignore[misc]
    else:
        entity.__init__(decode_model(definition.start_type, start_input or "{}"))  # type: ignore[misc]
    # What `__init__` sets may be snapshotted unannotated (plain JSON): see `_snapshot`.
    entity._corral_init_attrs = frozenset(vars(entity))
    return entity


class Unappliable(Exception):
    """This code cannot apply a journal entry: no handler of its name (today's or a
    `renamed_from=` one), or a payload today's model refuses. A live host moves the
    entry to the dead letters with `reason` (replayable once the code is fixed)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def entry_handler(definition: EntityDefinition, entry: JournalEntry) -> HandlerDefinition:
    """The handler of a signal or update entry, found through `renamed_from=` as well.

    Raises:
        Unappliable: this code has no signal or update handler of the entry's name.
    """
    handler = definition.handler(entry.name)
    if handler is None or handler.kind is HandlerKind.QUERY:
        known = sorted(h.name for h in definition.handlers.values()
                       if h.kind is not HandlerKind.QUERY)
        raise Unappliable(
            f"no {entry.kind.value} handler {entry.name!r} in this code of {definition.name} "
            f"(its signals and updates: {known}); deploy code that has it (or declares "
            f"renamed_from={entry.name!r}), then replay this dead letter")
    return handler


def decode_arg(handler: HandlerDefinition, entry: JournalEntry) -> tuple[BaseModel, ...]:
    """The handler's argument decoded from the entry's payload: () or (model,).

    Raises:
        Unappliable: the stored payload no longer validates against today's model.
    """
    if handler.input_type is None:
        return ()
    try:
        return (decode_model(handler.input_type, entry.payload),)
    except ValueError as err:  # pydantic's ValidationError, also for text that is not JSON
        raise Unappliable(
            f"payload no longer validates against {handler.input_type.__name__} of "
            f"{handler.kind.value} {handler.name!r}: {err}; fix the model (an optional "
            "field, a default) or the payload, then replay this dead letter") from err


async def apply_entry(definition: EntityDefinition, entity: Entity, entry: JournalEntry
                      ) -> UpdateOutcome | None:
    """Apply a signal or update entry; return the outcome for updates.

    A signal handler that raises is logged and counted as applied: this is how
    read-only replicas apply entries. Live hosts apply through `_poison.apply_live`,
    which retries a raising signal handler and then dead-letters the entry. An update
    handler that raises has its error recorded as the outcome (`UpdateFailedError` for
    the caller), never retried and never dead-lettered.

    Raises:
        Unappliable: no handler of the entry's name, or a payload today's model refuses
            (a live host dead-letters the entry; a replica passes over it).
    """
    handler = entry_handler(definition, entry)
    arg = decode_arg(handler, entry)
    try:
        if handler.fn is None:
            payload = arg[0] if arg else None
            entity.mailbox.put(payload, entry,
                               order=handler.release_order(payload, entry.accepted_at))
            result = None
        else:
            result = handler.fn(entity, *arg)
            if handler.is_async:
                result = await result
    except ContinueAsNew:
        log.error("%s %r: continue_as_new() called in handler %r (seq %d); call it from "
                  "run(). Ignored.", definition.name, entity.key, entry.name, entry.seq)
        return None
    except Exception as err:
        if handler.kind is HandlerKind.UPDATE:
            return UpdateOutcome(None, f"{type(err).__name__}: {err}")
        log.error("%s %r: signal %r (seq %d) raised:\n%s", definition.name, entity.key,
                  entry.name, entry.seq, traceback.format_exc())
        return None
    return UpdateOutcome(encode_value(result), None) if handler.kind is HandlerKind.UPDATE else None


def run_query(definition: EntityDefinition, entity: Entity, name: str, payload: str | None
              ) -> str:
    """Call a query handler and return its result as JSON (never a live reference)."""
    handler = definition.handler(name)
    assert handler is not None
    assert handler.fn is not None
    arg = () if handler.input_type is None else (
        decode_model(handler.input_type, payload or "{}"),)
    return encode_value(handler.fn(entity, *arg))


class ReplicaContext:
    """Context of a read-only replica: it replays handlers, it never runs `run()`."""

    def __init__(self, entity_type: str, key: str, run_id: int) -> None:
        self._entity_type, self._key, self._run_id = entity_type, key, run_id

    @property
    def entity_type(self) -> str:
        return self._entity_type

    @property
    def key(self) -> str:
        return self._key

    @property
    def run_id(self) -> int:
        return self._run_id

    async def wait_for(self, predicate: Callable[[], object], timeout: float | None) -> bool:
        raise RuntimeError("a read-only replica cannot wait; handlers must not block")

    async def checkpoint(self) -> None:
        raise RuntimeError("a read-only replica cannot snapshot")

    async def sleep_until(self, deadline: float) -> None:
        raise RuntimeError("a read-only replica cannot sleep")

    async def wait_signal(self, name: str, timeout: float | None) -> str:
        raise RuntimeError("a read-only replica cannot wait for a signal")

    async def step(self, fn: Callable[..., Any], args: tuple[Any, ...], *, name: str,
                   retry: RetryPolicy | None, timeout: float | None,
                   ray_options: dict[str, Any] | None) -> Any:
        raise RuntimeError("a read-only replica cannot run a step")

    def send(self, entity_type: type, key: str, handler: object, payload: object,
             start: object, with_start: bool) -> None:
        """A handler's send, as a replica re-applies it to answer a query: the host of
        the entity made it (and delivers it); the replica only rebuilds the state."""

    @property
    def continue_as_new_suggested(self) -> bool:
        return False

    def now(self) -> float:
        return time.time()

    def notify(self) -> None:
        pass
