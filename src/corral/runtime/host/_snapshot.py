"""Snapshots of entity state as JSON data, never pickles.

A snapshot is a JSON envelope (UTF-8, in the store's `snapshots.state` column):

    {"format": 1, "state_version": 2, "state": {"answered": 3, "inbox": [...]},
     "mailbox": [{"seq": 9, "name": "customer_reply", "payload": "{...}", ...}],
     "released": {"seq": 7, "name": "customer_reply", ...}}

`state` holds the entity's attributes, each annotated one encoded by pydantic
(`corral.actors._state`), or whatever an overriding `__getstate__` returns.
`mailbox` holds the journal entries of mailbox payloads `run()` has not taken yet;
their payloads are rebuilt with today's model on restore. `released` (only under a
reorder window, once a payload was released) is the journal entry of the payload with
the highest order key released so far, so a payload ordered before it is still flagged
`late` after a restart; an envelope without it (older, or none released) starts with no
watermark. Restoring calls
`__init__(start_input)`, brings `state` to the class's `state_version` through its
`@corral.upgrade` hooks, and sets it over the new instance, validated against today's
annotations. Nothing read from the store is ever unpickled: a pickled snapshot of an
older release is refused (`PickledSnapshotError`), never loaded.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import ValidationError

from corral._errors import (
    CorruptRowError,
    PickledSnapshotError,
    SnapshotCaptureError,
    SnapshotRestoreError,
    SnapshotVersionError,
)
from corral.actors import Entity, EntityContext, EntityDefinition, Mailbox
from corral.persistence import EntryKind, JournalEntry, Row, RunRecord, Store, stored_json

from .._payloads import decode_model
from ._apply import instantiate

__all__ = ["FORMAT", "Envelope", "capture", "decode", "rebuild", "restore", "upgrade_state"]

log = logging.getLogger("corral.snapshot")

FORMAT = 1
"""The envelope's format number (bumped only if the envelope itself changes)."""

_PICKLE = b"\x80"  # every pickle of protocol >= 2 starts with PROTO
_JSON_SCALARS = (str, int, float, bool, type(None))

Envelope = dict[str, Any]


def capture(definition: EntityDefinition, entity: Entity) -> bytes:
    """The entity's state and pending mailbox as a JSON envelope.

    Raises:
        SnapshotCaptureError: an attribute does not encode (named in the error).
    """
    where = dict(entity_type=definition.name, key=entity.key, run_id=entity.run_id)
    if definition.state.custom:
        state = _custom_state(definition, entity, where)
    else:
        state = {name: _encode_attribute(definition, entity, name, value, where)
                 for name, value in vars(entity).items() if _is_state(name)}
    envelope = {"format": FORMAT, "state_version": definition.state.version, "state": state,
                "mailbox": _encode_mailbox(definition, entity, where)}
    released = entity.mailbox.released() if isinstance(entity.mailbox, Mailbox) else None
    if isinstance(released, JournalEntry):
        envelope["released"] = _encode_entry(released)
    return json.dumps(envelope, separators=(",", ":"), ensure_ascii=False).encode()


def decode(definition: EntityDefinition, key: str, applied_seq: int, blob: bytes) -> Envelope:
    """The envelope of a stored snapshot, without executing anything it holds.

    Raises:
        PickledSnapshotError: a pickle written by an older release (refused, not loaded).
        SnapshotRestoreError: not a corral snapshot envelope.
    """
    where: dict[str, Any] = dict(entity_type=definition.name, key=key, applied_seq=applied_seq)
    what = f"{definition.name} {key!r}: snapshot at seq {applied_seq}"
    if bytes(blob[:1]) == _PICKLE:
        raise PickledSnapshotError(
            f"{what} is a pickle written by a corral release before snapshots were JSON; "
            "corral never unpickles what it reads from a store (a crafted row would run "
            "code), so it is left untouched and the entity is not activated: keep this "
            "store on the release that wrote it until its snapshots are converted",
            **where)
    try:
        envelope = stored_json(bytes(blob), Row("snapshots", definition.name, key), "state")
    except CorruptRowError as err:  # not JSON, or nested too deeply to read
        raise SnapshotRestoreError(f"{what} does not decode: {err}", **where) from err
    if (not isinstance(envelope, dict) or envelope.get("format") != FORMAT
            or not isinstance(envelope.get("state_version"), int)
            or not isinstance(envelope.get("mailbox"), list)):
        raise SnapshotRestoreError(
            f"{what} is not a corral snapshot of format {FORMAT} (written by a newer "
            "corral?); deploy the release that wrote it", **where)
    return envelope


def upgrade_state(definition: EntityDefinition, key: str, applied_seq: int,
                  envelope: Envelope) -> Any:
    """The envelope's state brought to the class's `state_version` by its hooks.

    Raises:
        SnapshotVersionError: the snapshot is newer than the code, or a step is missing.
        SnapshotRestoreError: a hook raised or returned something else than a dict.
    """
    schema = definition.state
    stored: int = envelope["state_version"]
    state: Any = envelope.get("state")
    where: dict[str, Any] = dict(entity_type=definition.name, key=key, applied_seq=applied_seq,
                                 stored_version=stored, code_version=schema.version)
    what = f"{definition.name} {key!r}: snapshot at seq {applied_seq}"
    if stored > schema.version:
        raise SnapshotVersionError(
            f"{what} has state_version {stored}, newer than this code's {schema.version} "
            "(a rollback?); it is kept as it is: deploy code with state_version >= "
            f"{stored}", **where)
    for step in range(stored, schema.version):
        hook = schema.upgrades.get(step)
        if hook is None:
            raise SnapshotVersionError(
                f"{what} has state_version {stored}, but {definition.name} declares no "
                f"@corral.upgrade(from_version={step}) to reach {schema.version}; add it",
                missing_from=step, **where)
        try:
            state = hook(state)
        except Exception as err:
            raise SnapshotRestoreError(
                f"{what}: @corral.upgrade(from_version={step}) raised "
                f"{type(err).__name__}: {err}", entity_type=definition.name, key=key,
                applied_seq=applied_seq) from err
        if not isinstance(state, dict) and not schema.custom:
            raise SnapshotRestoreError(
                f"{what}: @corral.upgrade(from_version={step}) returned "
                f"{type(state).__name__}, not a dict", entity_type=definition.name, key=key,
                applied_seq=applied_seq)
    return state


def restore(definition: EntityDefinition, key: str, applied_seq: int, blob: bytes,
            context: EntityContext, start_input: str | None) -> Entity:
    """Rebuild an entity from a snapshot and bind it to `context`:
    `__init__(start_input)`, then the upgraded state over it, then the mailbox.

    Raises:
        SnapshotRestoreError: (or a subclass) the snapshot does not restore with this
            code; the entity is named so an operator can act (never a silent reset).
    """
    envelope = decode(definition, key, applied_seq, blob)
    state = upgrade_state(definition, key, applied_seq, envelope)
    what = f"{definition.name} {key!r}: snapshot at seq {applied_seq}"
    where: dict[str, Any] = dict(entity_type=definition.name, key=key, applied_seq=applied_seq)
    try:
        entity = instantiate(definition, start_input, context)
    except Exception as err:
        raise SnapshotRestoreError(
            f"{what}: __init__ raised {type(err).__name__}: {err}", **where) from err
    if definition.state.custom:
        try:
            entity.__setstate__(state)
        except Exception as err:
            raise SnapshotRestoreError(
                f"{what}: __setstate__ raised {type(err).__name__}: {err}", **where) from err
    elif isinstance(state, dict):
        _set_state(definition, entity, state, what, where)
    else:
        raise SnapshotRestoreError(f"{what}: its state is {type(state).__name__}, not a dict",
                                   **where)
    _restore_mailbox(definition, entity, envelope["mailbox"], envelope.get("released"), what,
                     where)
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
    return restore(definition, run.key, seq, blob, context, run.start_input), seq


def _is_state(name: str) -> bool:
    return name != "mailbox" and not name.startswith("_corral")


def _encode_attribute(definition: EntityDefinition, entity: Entity, name: str, value: Any,
                      where: dict[str, Any]) -> Any:
    adapter = definition.state.fields.get(name)
    what = f"{definition.name} {entity.key!r}: attribute `{name}`"
    if adapter is not None:
        try:
            return adapter.dump_python(value, mode="json", warnings="error")
        except Exception as err:
            raise SnapshotCaptureError(
                f"{what} does not encode as its annotation says "
                f"({type(err).__name__}: {str(err).splitlines()[0]}); keep a value of the "
                "annotated type in it", attribute=name, **where) from err
    odd = _not_plain(value)
    if odd is not None:
        holds = type(value).__name__ if odd is type(value) else \
            f"a {type(value).__name__} holding {odd.__name__}"
        raise SnapshotCaptureError(
            f"{what} holds {holds}, which is not plain JSON: annotate it on the class "
            f"(`{name}: <type>`, e.g. `list[{odd.__name__}]`) so pydantic encodes it",
            attribute=name, **where)
    initial = getattr(entity, "_corral_init_attrs", None)
    if initial is not None and name not in initial:
        raise SnapshotCaptureError(
            f"{what} is neither annotated on the class nor set by __init__, so a restore "
            f"could not tell it from a removed attribute: annotate it on the class "
            f"(`{name}: <type>`) or set it in __init__", attribute=name, **where)
    return value


def _not_plain(value: Any, depth: int = 0) -> type | None:
    """The first type in `value` that would not come back from JSON as it is (exact
    types: no tuples, no int keys, no str enums, no models); None if there is none."""
    kind = type(value)
    if kind in _JSON_SCALARS:
        return None
    if depth > 100:
        return kind
    if kind is list:
        return next((t for v in value if (t := _not_plain(v, depth + 1)) is not None), None)
    if kind is dict:
        for k, v in value.items():
            if type(k) is not str:
                return type(k)
            if (t := _not_plain(v, depth + 1)) is not None:
                return t
        return None
    return kind


def _custom_state(definition: EntityDefinition, entity: Entity, where: dict[str, Any]) -> Any:
    what = f"{definition.name} {entity.key!r}"
    try:
        state = entity.__getstate__()
    except Exception as err:
        raise SnapshotCaptureError(
            f"{what}: __getstate__ raised {type(err).__name__}: {err}", **where) from err
    try:
        json.dumps(state)
    except (TypeError, ValueError) as err:
        bad = next((k for k, v in state.items() if not _dumps(v)), None) \
            if isinstance(state, dict) else None
        raise SnapshotCaptureError(
            f"{what}: __getstate__ must return JSON data" + (f"; `{bad}` is not" if bad else "")
            + f" ({err})", attribute=bad, **where) from err
    return state


def _dumps(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _encode_mailbox(definition: EntityDefinition, entity: Entity,
                    where: dict[str, Any]) -> list[dict[str, Any]]:
    tokens = entity.mailbox.pending_tokens() if isinstance(entity.mailbox, Mailbox) else []
    if not all(isinstance(t, JournalEntry) for t in tokens):
        raise SnapshotCaptureError(
            f"{definition.name} {entity.key!r}: the mailbox holds a payload that no signal "
            "delivered (put by code); keep such items in an annotated attribute",
            attribute="mailbox", **where)
    return [_encode_entry(t) for t in tokens]


def _encode_entry(entry: JournalEntry) -> dict[str, Any]:
    encoded = {**entry._asdict(), "kind": entry.kind.value}
    if encoded["trace"] is None:  # as before traces: a snapshot without them unchanged
        del encoded["trace"]
    return encoded


def _set_state(definition: EntityDefinition, entity: Entity, state: dict[str, Any],
               what: str, where: dict[str, Any]) -> None:
    fields = definition.state.fields
    for name, value in state.items():
        adapter = fields.get(name)
        if adapter is not None:
            try:
                setattr(entity, name, adapter.validate_python(value))
            except ValidationError as err:
                raise SnapshotRestoreError(
                    f"{what}: attribute `{name}` does not validate against today's "
                    f"annotation ({err.error_count()} error(s): {err.errors()[0]['msg']} at "
                    f"{err.errors()[0]['loc']}); raise state_version and add an "
                    "@corral.upgrade hook that converts it", attribute=name, **where) from err
        elif name in vars(entity) and _is_state(name):
            setattr(entity, name, value)  # plain JSON, set by today's __init__ too
        else:
            log.info("%s: attribute %r is no longer declared; dropped", what, name)


def _restore_mailbox(definition: EntityDefinition, entity: Entity,
                     stored: list[dict[str, Any]], released: dict[str, Any] | None,
                     what: str, where: dict[str, Any]) -> None:
    items = [_mailbox_item(definition, raw, what, where) for raw in stored]
    mailbox = Mailbox()
    for payload, entry, order in items:  # before attaching: nothing to notify yet
        mailbox.put(payload, entry, order=order)
    if released is not None:
        try:
            _, entry, order = _mailbox_item(definition, released, what, where)
        except SnapshotRestoreError as err:  # its signal is gone or changed: no watermark
            log.info("%s: the reorder window's watermark is dropped (%s)", what, err)
        else:
            if order is not None:
                mailbox.restore_released(order[0], entry)
    mailbox.attach(entity._corral_context)
    entity.mailbox = mailbox


def _mailbox_item(definition: EntityDefinition, raw: dict[str, Any], what: str,
                  where: dict[str, Any]) -> tuple[Any, JournalEntry, tuple[Any, float] | None]:
    """A stored mailbox entry as (payload rebuilt with today's model, entry, release
    order under its signal's window)."""
    try:
        entry = JournalEntry(**{**raw, "kind": EntryKind(raw["kind"])})
    except (TypeError, ValueError, KeyError) as err:
        raise SnapshotRestoreError(f"{what}: a mailbox entry is malformed ({err})",
                                   **where) from err
    handler = definition.handler(entry.name)
    if handler is None or handler.fn is not None:
        raise SnapshotRestoreError(
            f"{what}: its mailbox holds seq {entry.seq} of signal {entry.name!r}, which "
            "this code does not declare as a mailbox signal", **where)
    try:
        payload = (None if handler.input_type is None
                   else decode_model(handler.input_type, entry.payload))
    except ValidationError as err:
        raise SnapshotRestoreError(
            f"{what}: mailbox seq {entry.seq} ({entry.name!r}) no longer validates "
            f"against {handler.input_type.__name__ if handler.input_type else None}: "
            f"{err.errors()[0]['msg']}", **where) from err
    return payload, entry, handler.release_order(payload, entry.accepted_at)
