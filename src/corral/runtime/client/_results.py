"""Values the client API returns, and decoding of stored JSON results."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, TypeAdapter
from pydantic_core import to_jsonable_python

from corral._common import RunStatus
from corral._errors import InvalidArgumentError
from corral.persistence import Row, RunRecord, Suspension, WaitRecord, canonical_json

__all__ = [
    "Ack",
    "Delivery",
    "DeliveryStatus",
    "EntityDescription",
    "EntityProgress",
    "EntitySummary",
    "Page",
    "RunSummary",
    "SignalWaitInfo",
    "decode_cursor",
    "decode_value",
    "encode_cursor",
    "encode_value",
]

M = TypeVar("M")
T = TypeVar("T")

DeliveryStatus = Literal["delivered", "duplicate", "already_delivered", "stale", "buffered",
                         "not_waiting"]


@dataclass(frozen=True, slots=True)
class Ack:
    """The answer to a send, given only after the message is durably committed.

    Attributes:
        status: `"accepted"` for a new message, `"duplicate"` when its message id was
            accepted before (then `run_id` and `seq` are the original acceptance's),
            `"dead_lettered"` when the signal was over its entity's `max_backlog` and
            the type declares `overflow = "dead_letter"`: it was kept as dead letter
            `dead_letter_id` of run `run_id`, not journaled (`seq` is 0).
        run_id: the run the message was delivered to.
        seq: the message's position in the entity's journal.
        started: whether this call started the run.
        dead_letter_id: the dead letter's id when `status` is `"dead_lettered"`.
    """

    status: Literal["accepted", "duplicate", "dead_lettered"]
    run_id: int
    seq: int
    started: bool
    dead_letter_id: int | None = field(default=None, repr=False)  # reprs stay as they were


@dataclass(frozen=True, slots=True)
class Delivery(Generic[M]):
    """The answer to `EntityRef.deliver`, given only once the decision is durable.

    Attributes:
        status: what happened:
            `"delivered"`: this call closed the wait; `run()` resumes with its payload.
            `"duplicate"`: this key was delivered before with the same payload and
            sender; the retained delivery is returned and nothing changes.
            `"already_delivered"`: another key closed (or buffered for) the wait first;
            its payload and sender are returned; nothing changes.
            `"stale"`: the wait timed out, or its run ended; nothing changes.
            `"buffered"`: `run()` has not reached the wait yet; this delivery is kept
            and wins when it does (`early_signals = "buffer"`, the default).
            `"not_waiting"`: `run()` has not reached the wait and the type rejects early
            deliveries (`early_signals = "reject"`); nothing is kept.
        payload: the retained delivery's payload (this call's, or the winner's), or None.
        sender: the retained delivery's recorded (authenticated) sender.
        delivered_at: when the retained delivery was made (seconds since the epoch).
        run_id: the run whose wait this was (None for `"not_waiting"`).

    Built from the store's `DeliveryResult` and the `WaitRecord` it retains, with the
    payload decoded to the wait's model and the status narrowed to `DeliveryStatus`.
    """

    status: DeliveryStatus
    payload: M | None
    sender: str | None
    delivered_at: float | None
    run_id: int | None


@dataclass(frozen=True, slots=True)
class SignalWaitInfo:
    """One open durable signal wait, as operators list it (never with a payload).

    Attributes:
        entity_type, key, run_id: whose wait it is.
        name: the wait's name.
        waiting_since: when `run()` first reached it (seconds since the epoch).
        deadline: when it times out, or None.

    Not `corral.persistence.WaitRecord`, the stored row it is built from (`of`): an
    operator's list of open waits shows neither a delivery nor its payload.
    """

    entity_type: str
    key: str
    run_id: int
    name: str
    waiting_since: float
    deadline: float | None

    @classmethod
    def of(cls, w: WaitRecord) -> SignalWaitInfo:
        """The open wait `w` as operators list it."""
        return cls(w.entity_type, w.key, w.run_id, w.name, w.opened_at or 0.0, w.deadline)


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing. Pass `next_cursor` as `after=` for the next page; it is
    None on the last page.

    `unreadable` names each row of this page's stretch that does not decode (a row
    damaged or written by hand into the store: see `CorruptRowError`), by its entity and
    why; such a row is left out of `items`, so one bad row never breaks a listing.
    """

    items: list[T]
    next_cursor: str | None
    unreadable: tuple[str, ...] = ()


def encode_cursor(position: Sequence[object]) -> str:
    """An opaque cursor for a listing position (a row's sort key)."""
    return base64.urlsafe_b64encode(canonical_json(list(position)).encode()).decode()


def decode_cursor(cursor: object, shape: tuple[type, ...]) -> tuple[Any, ...] | None:
    """The position of a cursor from `encode_cursor` whose fields have the types of
    `shape` (None for None); `InvalidArgumentError` for anything else."""
    if cursor is None:
        return None
    try:
        if not isinstance(cursor, str) or len(cursor) > 4096:
            raise ValueError(cursor)
        fields = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        if not isinstance(fields, list) or len(fields) != len(shape):
            raise ValueError(cursor)
        for value, kind in zip(fields, shape, strict=True):
            if not _fits(value, kind):
                raise ValueError(cursor)
        return tuple(float(v) if k is float else v for v, k in zip(fields, shape, strict=True))
    except (ValueError, TypeError, OverflowError, binascii.Error, UnicodeError):
        raise InvalidArgumentError(f"not a cursor of this listing: {cursor!r:.80}") from None


_SURROGATE = re.compile(r"[\x00\ud800-\udfff]")


def _fits(value: object, kind: type) -> bool:
    """Whether a decoded cursor field is a `kind` that both stores can bind: text without
    NUL or lone surrogates (neither store takes them), integers of 64 bits, finite
    floats. A forged cursor is refused here, before it reaches the store as a driver
    error (a `StoreError`, which would say that retrying may work)."""
    if isinstance(value, bool):
        return False
    if kind is str:
        return isinstance(value, str) and _SURROGATE.search(value) is None
    if kind is int:
        return isinstance(value, int) and -(2**63) <= value < 2**63
    if kind is float:
        return isinstance(value, int | float) and math.isfinite(value)
    return isinstance(value, kind)


@dataclass(frozen=True, slots=True)
class EntityProgress:
    """Which entity, its latest run and how far it got: the fields a listing's
    `EntitySummary` and `describe()`'s `EntityDescription` share, declared once here
    (each adds its own; see theirs for what the fields mean).
    """

    entity_type: str
    key: str
    shard: int
    status: RunStatus
    run_id: int
    accepted_seq: int
    applied_seq: int | None
    mailbox_depth: int | None


@dataclass(frozen=True, slots=True)
class EntitySummary(EntityProgress):
    """One entity in a listing (`Runtime.entities`).

    Attributes:
        entity_type, key, shard: which entity, and the shard that hosts it.
        status: its latest run's status.
        run_id: its latest run.
        accepted_seq: the last journal position accepted.
        applied_seq: the last applied: from the live activation when the answering
            process hosts it, else as its host last recorded it in the store (at most
            `PROGRESS_INTERVAL` behind), or the seq it was passivated at.
        mailbox_depth: payloads waiting for `run()`: live, or as last recorded (None:
            never recorded).
        passivated: snapshotted and evicted from memory (its run still running).
        updated_at: when it last accepted a message or changed status.
        suspended: its running run is suspended (`run()` raised, or its activation
            could not be built; `describe()` says why): retried, messages kept.
        backlog: messages accepted and not applied yet (`accepted_seq - applied_seq`
            while its run is running; 0 once closed: what a closed run never applied
            is dead-lettered).
        oldest_unapplied_age: seconds since the oldest of those was accepted (None:
            no backlog).

    Built from the store's `EntityRecord` and, for an entity the answering process
    hosts, its live activation; the stored row's `passivated_seq` and `progress` are
    what `passivated`, `applied_seq`, `mailbox_depth` and `backlog` are decided from.
    """

    passivated: bool
    updated_at: float | None
    suspended: bool = False
    backlog: int | None = None
    oldest_unapplied_age: float | None = None


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run of an entity, as `EntityDescription.runs` lists it (oldest first).

    `start_input` is the run's start input and `result` what a completed `run()`
    returned, both as the JSON data stored (None: none).

    Not `corral.persistence.RunRecord`, the stored row it is built from (`of`): that
    row holds the start input and the result as JSON text, and names the entity, which
    the description listing its runs already does.
    """

    run_id: int
    status: RunStatus
    started_at: float
    closed_at: float | None
    error: str | None
    continued_from: int | None = None
    start_input: Any = None
    result: Any = None

    @classmethod
    def of(cls, r: RunRecord) -> RunSummary:
        """The summary of a stored run (`CorruptRowError` if its start input or result
        is not JSON)."""
        row = Row("runs", r.entity_type, r.key, r.run_id)
        return cls(r.run_id, r.status, r.started_at, r.closed_at, r.error, r.continued_from,
                   row.json("start_input", r.start_input), row.json("result", r.result))


@dataclass(frozen=True, slots=True)
class EntityDescription(EntityProgress):
    """A snapshot of an entity's state as the store and (if hosted here) its host see it.

    `status` is `RunStatus.NEVER_STARTED` (with `run_id` 0 and no runs) for an entity
    that never ran. `hosted_here` says whether the process answering holds a live
    activation of the entity: this process on the local backend, the entity's shard (or
    dedicated) actor on the Ray backend, which answers `describe`. `applied_seq` and
    `mailbox_depth` come from that live activation, else from the store, where the
    entity's host records them at most `PROGRESS_INTERVAL` seconds late
    (`progress_age` says how long ago; a passivated entity's watermark is the seq it
    was passivated at). `backlog` is what it accepted and has not applied while its
    run is running (0 once closed), `oldest_unapplied_age` how long the oldest of it
    has waited.
    """

    hosted_here: bool
    runs: tuple[RunSummary, ...]
    snapshot_seq: int | None = None
    """The applied watermark of the current run's latest snapshot (None: none yet)."""
    snapshot_age: float | None = None
    """Seconds since that snapshot was taken."""
    timers: tuple[float, ...] = ()
    """Due times of the entity's pending durable timers (seconds since the epoch)."""
    open_waits: tuple[SignalWaitInfo, ...] = ()
    """The current run's signal waits that `run()` is waiting on."""
    dead_letters: int = 0
    """How many of the entity's signals are dead-lettered."""
    suspension: Suspension | None = None
    """Set while the running run is suspended (its `run()` raised, or its activation
    could not be built): the error with its traceback, the failed attempts, since when,
    and when the host tries next. The status stays `running`; nothing is lost."""
    backlog: int | None = None
    """Messages accepted and not applied yet (None: never started)."""
    oldest_unapplied_age: float | None = None
    """Seconds since the oldest of those was accepted (None: no backlog)."""
    progress_age: float | None = None
    """Seconds since its host last recorded its progress in the store (None: never)."""


def encode_value(value: Any) -> str:
    """JSON for a handler's return value (models anywhere inside, by their JSON dump)."""
    if isinstance(value, BaseModel):
        return value.model_dump_json(by_alias=True)
    return canonical_json(to_jsonable_python(value, by_alias=True))


@functools.lru_cache(maxsize=256)
def _adapter(expected: Any) -> TypeAdapter[Any]:
    return TypeAdapter(expected)


def decode_value(text: str | None, expected: Any) -> Any:
    """Inverse of `encode_value`: rebuild the annotated return type (models, lists of them)."""
    if text is None:
        return None
    if expected is None or expected is Any or expected is type(None):
        return json.loads(text)
    try:
        return _adapter(expected).validate_json(text)
    except TypeError:  # an annotation pydantic cannot adapt (or not hashable): plain JSON
        return json.loads(text)
