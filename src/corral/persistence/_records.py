"""Plain records that cross the `Store` boundary. Payloads are canonical JSON text.

The three made for every message (`Acceptance`, `JournalEntry`, `AcceptResult`) are
named tuples: as immutable as a frozen dataclass, built in a third of the time."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from corral._common import (
    IdReusePolicy,
    RunStatus,
    WaitStatus,
)

__all__ = [
    "DERIVED_ID_PREFIXES",
    "AcceptResult",
    "Acceptance",
    "DeadLetter",
    "DeliveryRequest",
    "DeliveryResult",
    "EntityDetails",
    "EntityRecord",
    "EntryKind",
    "JournalEntry",
    "MessageRecord",
    "Progress",
    "RunRecord",
    "Suspension",
    "TimerRecord",
    "UnreadableRow",
    "UpdateOutcome",
    "WaitRecord",
]


DERIVED_ID_PREFIXES = ("send:", "replay:", "schedule:")
"""How the message ids corral derives begin: an entity's send
(`_ops_outbox.send_message_id`, `handler_send_id`), a dead letter's replay
(`_ops_dead_letters.replay_message_id`) and a schedule's tick or trigger
(`_ops_schedules.tick_message_id`, `trigger_message_id`). The client boundary refuses a caller's id
that begins so, or a caller could take the id first and the real send or replay would
meet an `IdempotencyConflictError` (a delivery's id cannot be typed: it begins with a
control character, `_waits.delivery_message_id`)."""


class EntryKind(str, enum.Enum):
    """What a journal entry is. `START` is the mark `EntityRef.start` leaves: applied as
    nothing, it holds the start id in the dedupe window like any message. `DELIVER`
    carries the delivery that closed an open signal wait (`name` is the wait's) to the
    run waiting on it."""

    SIGNAL = "signal"
    UPDATE = "update"
    TERMINATE = "terminate"
    START = "start"
    DELIVER = "deliver"
    RESUME = "resume"
    """`EntityRef.resume()`: applied as nothing; a host holding the run suspended
    retries it at once when it receives this entry."""


class Acceptance(NamedTuple):
    """One message to accept durably: start the run if needed, dedupe, append to the journal.

    `start` is the canonical JSON start input for `*_with_start` calls and None for plain
    sends, which require a running run. `fresh_id`: the runtime made `message_id` for
    this call just now (the caller gave none), so no earlier acceptance holds it and the
    store skips the dedupe lookup (the dedupe table's primary key still refuses a repeat).
    A call that may be retried with the same id (through Ray) must not say so.

    `max_backlog` and `overflow` are the type's backpressure (`Entity.max_backlog`);
    `applied` is the entity's applied seq as the accepting process knows it (its hosted
    activation's; 0 when it does not host it): the store counts the backlog from the
    higher of it and the latest snapshot's.
    """

    entity_type: str
    key: str
    shard: int
    kind: EntryKind
    name: str
    message_id: str
    payload: str
    payload_hash: bytes
    sender: str | None
    start: str | None
    id_reuse: IdReusePolicy
    accepted_at: float
    fresh_id: bool = False
    max_backlog: int | None = None
    overflow: str = "refuse"
    applied: int = 0
    # The W3C traceparent of the span that accepted it (`corral._tracing`), stored with
    # its journal entry; checked before it is (`AcceptOp`). None: no trace.
    trace: str | None = None

    def to_wire(self) -> tuple[Any, ...]:
        """Plain values only, enums by value: how a Ray call carries it (cloudpickle
        pickles a named tuple of enums ~8x slower than a tuple of str and numbers)."""
        return (*self[:3], self.kind._value_, *self[4:10], self.id_reuse._value_,
                *self[11:])

    @classmethod
    def from_wire(cls, t: Sequence[Any]) -> Acceptance:
        # `trace` last, and optional: a caller of a release before traces sends none.
        return cls(t[0], t[1], t[2], _KINDS[t[3]], t[4], t[5], t[6], t[7], t[8], t[9],
                   _ID_REUSE[t[10]], t[11], t[12], t[13], t[14], t[15],
                   t[16] if len(t) > 16 else None)


class JournalEntry(NamedTuple):
    """An accepted message, numbered `seq` (1, 2, ...) within its entity across runs."""

    entity_type: str
    key: str
    seq: int
    run_id: int
    kind: EntryKind
    name: str
    message_id: str
    payload: str
    sender: str | None
    accepted_at: float
    trace: str | None = None  # the accepting span's W3C traceparent (`corral._tracing`)


class AcceptResult(NamedTuple):
    """What the store decided. `entry` is the journal entry (the original one for
    duplicates). `dead_letter_id`: the signal was over its entity's `max_backlog` with
    `overflow="dead_letter"` and was kept as this dead letter instead (`entry.seq` is 0:
    it is in no journal)."""

    duplicate: bool
    started: bool
    entry: JournalEntry
    dead_letter_id: int | None = None

    def to_wire(self) -> tuple[Any, ...]:
        """As `Acceptance.to_wire`: plain values, the entry's kind by value."""
        e = self.entry
        # The entry's `trace` after `dead_letter_id`: the tuple a release before traces
        # reads and writes, and one more item that it ignores (and does not send).
        return (self.duplicate, self.started, *e[:4], e.kind._value_, *e[5:10],
                self.dead_letter_id, e.trace)

    @classmethod
    def from_wire(cls, t: Sequence[Any]) -> AcceptResult:
        return cls(t[0], t[1], JournalEntry(t[2], t[3], t[4], t[5], _KINDS[t[6]], t[7], t[8],
                                            t[9], t[10], t[11], t[13] if len(t) > 13 else None),
                   t[12])


_KINDS = {k.value: k for k in EntryKind}
_ID_REUSE = {p.value: p for p in IdReusePolicy}


@dataclass(frozen=True, slots=True)
class RunRecord:
    entity_type: str
    key: str
    run_id: int
    status: RunStatus
    start_input: str | None
    result: str | None
    error: str | None
    started_at: float
    closed_at: float | None
    continued_from: int | None = None
    first_seq: int = 1


@dataclass(frozen=True, slots=True)
class UpdateOutcome:
    """The recorded outcome of an applied update: JSON result or the handler's error text."""

    result: str | None
    error: str | None

    def to_json(self) -> str:
        return json.dumps({"result": self.result, "error": self.error})


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A signal whose handler kept raising, moved out of the way after its last retry.

    The entity went on with its next message; this record keeps what is needed to
    replay the signal after a fix (`EntityRef.replay_dead_letter`) or to drop it
    (`EntityRef.discard_dead_letter`).

    Attributes:
        id: the dead letter's id (unique in the store).
        entity_type: the entity's type name.
        key: the entity's key.
        run_id: the run the signal was delivered to.
        seq: the signal's position in the entity's journal.
        message_id: the signal's idempotency key.
        name: the signal handler's name.
        payload: the payload as canonical JSON text (as accepted; never unpickled).
        sender: the recorded (authenticated) sender, or None.
        error: the last exception, as `Type: message` (a NUL in it stored as the
            escape `\\u0000`, a lone surrogate as U+FFFD: see `storable_text`).
        traceback: the last exception's formatted traceback (stored alike).
        attempts: how many times the handler was called.
        failed_at: when the last attempt failed (seconds since the epoch).
    """

    id: int
    entity_type: str
    key: str
    run_id: int
    seq: int
    message_id: str
    name: str
    payload: str
    sender: str | None
    error: str
    traceback: str
    attempts: int
    failed_at: float


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """One message of an entity, with what the store still keeps of it (`_entity_history`).

    Attributes:
        seq, run_id: its position in the entity's journal, and the run it went to.
        message_id, sender: its idempotency key and recorded sender.
        accepted_at: when it was accepted (None: only its dead letter is left).
        kind, name, payload: the journal entry's, while the journal holds it (until a
            snapshot covers it) or a dead letter does; None after that.
        dead_letter_id, error, failed_at: its dead letter, if its handler kept raising.
    """

    seq: int
    run_id: int
    message_id: str
    sender: str | None
    accepted_at: float | None
    kind: EntryKind | None = None
    name: str | None = None
    payload: str | None = None
    dead_letter_id: int | None = None
    error: str | None = None
    failed_at: float | None = None


@dataclass(frozen=True, slots=True)
class TimerRecord:
    """A pending durable timer of an entity's run (`sleep`, `wait_for(timeout=)`)."""

    run_id: int
    timer_id: str
    due_at: float


@dataclass(frozen=True, slots=True)
class WaitRecord:
    """One durable signal wait of one run, as stored.

    `opened_at` is when `run()` first reached it (None while a delivery is buffered),
    `deadline` when it times out (None: never). The delivery fields are those of the
    one delivery the wait retains (the winner), or None.
    """

    entity_type: str
    key: str
    run_id: int
    name: str
    status: WaitStatus
    opened_at: float | None = None
    deadline: float | None = None
    delivery_key: str | None = None
    payload: str | None = None
    sender: str | None = None
    delivered_at: float | None = None


@dataclass(frozen=True, slots=True)
class DeliveryRequest:
    """A `deliver` call, validated: close the wait `name` of the entity's current run
    (or of run `run_id`) with `payload`, idempotently by `delivery_key`.

    `early` is the type's `early_signals` ("buffer" or "reject"). It carries no time:
    the store judges the wait's deadline, and stamps the delivery, on its own clock.
    """

    entity_type: str
    key: str
    shard: int
    name: str
    delivery_key: str
    payload: str
    sender: str | None
    early: str
    run_id: int | None = None
    aliases: tuple[str, ...] = ()
    """The wait's old names (`renamed_from`): where no wait of `name` is there yet, a
    wait the old code opened, or a delivery it buffered, under one of them is this one."""


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """What the store decided about a delivery.

    `status` is one of "delivered", "duplicate", "already_delivered", "stale",
    "buffered", "not_waiting". `wait` is the wait as it stands after the decision (None
    for "not_waiting"); `entry` the journal entry that wakes the waiting run (only for
    "delivered").
    """

    status: str
    wait: WaitRecord | None
    entry: JournalEntry | None = None


@dataclass(frozen=True, slots=True)
class EntityRecord:
    """One entity as the store lists it: its latest run and journal position.

    `passivated_seq` is the applied watermark of an entity snapshotted and evicted from
    memory (None while resident, or closed); `updated_at` when it last accepted a
    message or changed status.
    """

    entity_type: str
    key: str
    shard: int
    run_id: int
    status: RunStatus
    accepted_seq: int
    passivated_seq: int | None
    updated_at: float | None
    suspended: bool = False
    """Its running run is suspended (see `Suspension`)."""
    progress: Progress | None = None
    """How far its host applied, as recorded in the store (see `Progress`)."""


@dataclass(frozen=True, slots=True)
class UnreadableRow:
    """An entity's row in a listing that does not decode (see `CorruptRowError`): a
    listing keeps its place (the next page's cursor may be past it) and leaves it out
    of its items, naming it (`Page.unreadable`), so one bad row never breaks a
    deployment-wide view.

    Attributes:
        entity_type, key: whose row.
        error: the `CorruptRowError`'s message: the column and why it does not decode.
    """

    entity_type: str
    key: str
    error: str


@dataclass(frozen=True, slots=True)
class Progress:
    """How far an entity's host applied, as the store knows it (any process reads it).

    Attributes:
        applied_seq: the applied watermark: the highest of what its host recorded, the
            seq it was passivated at, and the seq before its run's first entry.
        mailbox_depth: payloads waiting for `run()` when its host last recorded (None:
            never recorded).
        recorded_at: when its host last recorded (None: never).
        oldest_unapplied_at: when its oldest unapplied message was accepted (None:
            none, or its run is not running).
    """

    applied_seq: int
    mailbox_depth: int | None
    recorded_at: float | None
    oldest_unapplied_at: float | None


@dataclass(frozen=True, slots=True)
class EntityDetails:
    """What an operator inspects beyond the run: the latest snapshot of the current run,
    pending durable timers (due times), the run's signal waits and the dead letters."""

    snapshot_seq: int | None
    snapshot_at: float | None
    timers: tuple[float, ...]
    waits: tuple[WaitRecord, ...]
    dead_letters: int
    suspension: Suspension | None = None
    progress: Progress | None = None


@dataclass(frozen=True, slots=True)
class Suspension:
    """A running run that is suspended: its `run()` raised (or its activation could not
    be built), and the host retries it after a backoff until it gets past the point.

    Attributes:
        entity_type, key, run_id: whose run.
        error: the last failure: the exception with its traceback.
        attempts: failed attempts in a row.
        since: when the first of them failed (seconds since the epoch).
        next_attempt_at: when the host tries again (seconds since the epoch); a host
            started with other code, or `EntityRef.resume()`, tries at once.
    """

    entity_type: str
    key: str
    run_id: int
    error: str
    attempts: int
    since: float
    next_attempt_at: float
