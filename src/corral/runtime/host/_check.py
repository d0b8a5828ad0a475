"""Checking stored snapshots against the code about to be deployed, writing nothing.

For each entity (all, or a sample per type) its latest run's latest snapshot is
decoded, upgraded and restored with the code given, and the journal after it is
replayed through the handlers as a read-only replica does: `run()` never runs, no
store write is made. A finished entity's latest snapshot is its final state (kept by
the close), which queries on it restore: it is checked as a running one's is. What
does not restore or replay is reported per type with the reason.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field

from corral._errors import CorruptRowError
from corral.actors import EntityDefinition, HandlerKind
from corral.persistence import EntityRecord, EntryKind, Store, UnreadableRow

from .._payloads import decode_model
from ._apply import ReplicaContext
from ._snapshot import rebuild

__all__ = ["SnapshotCheck", "SnapshotFailure", "TypeCheck", "check_store"]

_PAGE = 500


@dataclass(frozen=True, slots=True)
class SnapshotFailure:
    """One entity that does not restore (or replay) with the code checked."""

    entity_type: str
    key: str
    run_id: int
    error: str
    """`ErrorType: message`."""


@dataclass(frozen=True, slots=True)
class TypeCheck:
    """The outcome for one entity type: how many were checked and which failed."""

    entity_type: str
    checked: int = 0
    failures: tuple[SnapshotFailure, ...] = ()

    @property
    def restored(self) -> int:
        return self.checked - len(self.failures)


@dataclass(frozen=True, slots=True)
class SnapshotCheck:
    """What `corral check-snapshots` (and `corral.testing.check_snapshots`) found.

    Example:
        report = await corral.testing.check_snapshots(store, entities=[Ticket])
        assert report.ok, report.summary()
    """

    types: tuple[TypeCheck, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """No entity failed."""
        return not self.failures

    @property
    def failures(self) -> tuple[SnapshotFailure, ...]:
        return tuple(f for t in self.types for f in t.failures)

    def summary(self) -> str:
        """One line per type (`Ticket: 40 of 41 restore`), then one per failure."""
        lines = [f"{t.entity_type}: {t.restored} of {t.checked} restore" for t in self.types]
        lines += [f"  {f.entity_type} {f.key!r} run {f.run_id}: {f.error}"
                  for f in self.failures]
        return "\n".join(lines)


async def check_store(store: Store, definitions: Sequence[EntityDefinition], *,
                      sample: int | None = None, seed: int | None = None) -> SnapshotCheck:
    """Restore and replay each entity of `definitions` (or `sample` per type, chosen at
    random) with their code, reading `store` only."""
    found = []
    for definition in definitions:
        records = await _entities(store, definition.name, sample, random.Random(seed))
        failures = [f for r in records
                    if (f := await _check_one(store, definition, r)) is not None]
        found.append(TypeCheck(definition.name, len(records), tuple(failures)))
    return SnapshotCheck(tuple(found))


async def _entities(store: Store, etype: str, sample: int | None,
                    rng: random.Random) -> list[EntityRecord | UnreadableRow]:
    """The entities of `etype`, or a uniform sample of them (reservoir); a row that
    does not decode is checked too (it fails)."""
    chosen: list[EntityRecord | UnreadableRow] = []
    seen, after = 0, None
    while True:
        page = await store.entities(etype, None, limit=_PAGE, after=after)
        for record in page:
            seen += 1
            if sample is None or len(chosen) < sample:
                chosen.append(record)
            elif (slot := rng.randrange(seen)) < sample:
                chosen[slot] = record
        if len(page) < _PAGE:
            return chosen
        after = (page[-1].entity_type, page[-1].key)


async def _check_one(store: Store, definition: EntityDefinition,
                     record: EntityRecord | UnreadableRow) -> SnapshotFailure | None:
    etype, key = definition.name, record.key
    try:
        found = await store.latest_run(etype, key)
    except CorruptRowError as err:
        return SnapshotFailure(etype, key, err.run_id or 0, f"{type(err).__name__}: {err}")
    if found is None:
        return None  # purged meanwhile
    run = found[0]
    try:
        entity, after = await rebuild(store, definition, run, ReplicaContext(etype, key,
                                                                             run.run_id))
        dead = await store.dead_letter_seqs(etype, key, run.run_id)
        for entry in await store.journal(etype, key, run_id=run.run_id, after_seq=after):
            if entry.kind not in (EntryKind.SIGNAL, EntryKind.UPDATE) or entry.seq in dead:
                continue
            handler = definition.handler(entry.name)
            if handler is None or handler.kind is HandlerKind.QUERY:
                raise LookupError(f"seq {entry.seq}: no handler {entry.name!r} in this code")
            arg = () if handler.input_type is None else (
                decode_model(handler.input_type, entry.payload),)
            if handler.fn is None:
                payload = arg[0] if arg else None
                entity.mailbox.put(payload, entry,
                                   order=handler.release_order(payload, entry.accepted_at))
                continue
            try:
                result = handler.fn(entity, *arg)
                if handler.is_async:
                    await result
            except Exception:
                if handler.kind is HandlerKind.SIGNAL:
                    raise  # an update's error is its outcome; a signal's is a failure
    except Exception as err:
        text = "".join(traceback.format_exception_only(err)).strip().replace("\n", " ")
        return SnapshotFailure(etype, key, run.run_id, text)
    return None
