"""Snapshots of entity state: the pickle protocol through cloudpickle.

A snapshot holds what the entity's `__getstate__` returns, never the class itself: the
class always comes from the code the host runs, and `__setstate__` rebuilds the
instance (override both to customise). Only the runtime writes snapshots, so
unpickling them is safe; payloads sent by callers are never pickled.
"""

from __future__ import annotations

from typing import Any

import cloudpickle

from corral._errors import SnapshotRestoreError
from corral.actors import (
    Entity,
    EntityContext,
    EntityDefinition,
    Mailbox,
)
from corral.persistence import RunRecord, Store

from ._apply import instantiate

__all__ = ["capture", "rebuild", "restore"]


def capture(entity: Entity) -> bytes:
    """Pickle the entity's state (its host context is never part of it)."""
    data: bytes = cloudpickle.dumps(entity.__getstate__())
    return data


def restore(definition: EntityDefinition, key: str, applied_seq: int, blob: bytes,
            context: EntityContext) -> Entity:
    """Rebuild an entity from a snapshot and bind it to `context`.

    Raises:
        SnapshotRestoreError: the snapshot cannot be unpickled or `__setstate__` fails;
            the entity is named so an operator can act (never a silent reset).
    """
    entity: Entity = object.__new__(definition.cls)
    entity._corral_context = context
    try:
        state: Any = cloudpickle.loads(blob)
        entity.__setstate__(state)
    except Exception as err:
        raise SnapshotRestoreError(
            f"{definition.name} {key!r}: snapshot at seq {applied_seq} does not restore: "
            f"{type(err).__name__}: {err}"
        ) from err
    entity._corral_context = context
    mailbox = getattr(entity, "mailbox", None)
    if isinstance(mailbox, Mailbox):
        mailbox.attach(context)
    else:
        entity.mailbox = Mailbox(context)
    return entity


async def rebuild(store: Store, definition: EntityDefinition, run: RunRecord,
                  context: EntityContext) -> tuple[Entity, int]:
    """The run's entity from its latest snapshot, else from `__init__(start_input)`.

    Returns the entity and the journal seq it covers (replay the journal after it).
    """
    snapshot = await store.latest_snapshot(definition.name, run.key, run.run_id)
    if snapshot is None:
        return instantiate(definition, run.start_input, context), 0
    seq, blob = snapshot
    return restore(definition, run.key, seq, blob, context), seq
