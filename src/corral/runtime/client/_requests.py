"""Request records: what a client asks of the host, one record per call.

`EntityRef` and `Runtime` validate at the boundary, then build one record per call and
pass it to `Backend.handle(request)`; the local backend hands it to the method named
after its kind, the Ray backend sends it to the owning shard actor's
`ShardHost.handle(request)`, which does the same there. Every record names the shard
that answers it (`shard`), as `persistence.Acceptance` and `persistence.DeliveryRequest`
already do (those two are the records of an accept and of a delivery to a signal wait);
the store-wide reads (`SignalWaits`, `Entities`, `DeadLetters` without a key,
`TakeCensus`) carry `shard=None`: any host answers them, since all of a deployment's
hosts share one store.

A leaf of `runtime`: records of plain str, int, float and persistence records, so they
cross a process boundary (Ray pickles them) unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from corral._common import RunStatus
from corral.persistence import (
    Acceptance,
    AcceptResult,
    Census,
    DeadLetter,
    DeliveryRequest,
    RunRecord,
    UnreadableRow,
    UpdateOutcome,
    WaitPosition,
    WaitRecord,
)

from ._inspection import EntityHistory, EntityState
from ._results import EntityDescription, EntitySummary

__all__ = [
    "SCHEDULE_METHODS",
    "AcceptBatch",
    "AnyRequest",
    "DeadLetters",
    "Describe",
    "DiscardDeadLetter",
    "Entities",
    "History",
    "LatestRun",
    "MessagesRead",
    "Query",
    "ReplayDeadLetter",
    "Request",
    "ScheduleCall",
    "SignalBatch",
    "SignalWaits",
    "State",
    "TakeCensus",
    "WaitUpdate",
]

R = TypeVar("R")


class Request(Generic[R]):
    """A request answered with an `R` (the base of every record here)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class AcceptBatch(Request[list[AcceptResult | Exception]]):
    """Accept several messages of one shard in one group commit (how a Ray client sends
    the acceptances queued for a shard); each one's result, or the error refusing it
    alone. On Ray it travels as `Acceptance.to_wire` tuples (`__reduce__`): cloudpickle
    takes ~2 us per record, ~0.2 us per tuple of str and numbers. `shards`: the shard
    count of the router that routed them (a shard actor routing with the same count
    need not hash each key again)."""

    shard: int
    accs: Sequence[Acceptance]
    shards: int | None = None
    atomic: bool = False
    """Every acceptance or none (`Store.accept_all`): one shard's part of a
    `SignalBatch`, answered with a result for each or `BatchRefusedError`."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_batch_from_wire,
                (self.shard, [acc.to_wire() for acc in self.accs], self.shards, self.atomic))


def _batch_from_wire(shard: int, wires: Sequence[Sequence[Any]], shards: int | None = None,
                     atomic: bool = False) -> AcceptBatch:
    return AcceptBatch(shard, [Acceptance.from_wire(w) for w in wires], shards, atomic)


@dataclass(frozen=True, slots=True)
class SignalBatch(Request[list[AcceptResult]]):
    """`Runtime.signal_many`: accept every signal or none, answered in order. The local
    backend commits it in one transaction; the Ray backend splits it by shard, each part
    an atomic `AcceptBatch` to its shard's actor."""

    accs: Sequence[Acceptance]


@dataclass(frozen=True, slots=True)
class WaitUpdate(Request[UpdateOutcome]):
    """The recorded outcome of the update `message_id`, once applied (a shard actor
    answers None after `ray._shard_host.WAIT_SLICE` seconds instead; its client asks again)."""

    entity_type: str
    key: str
    shard: int
    message_id: str


@dataclass(frozen=True, slots=True)
class Query(Request[str]):
    """Run the query handler `name`; JSON of its result. `activate` brings a passivated
    entity back into memory instead of answering from its latest snapshot."""

    entity_type: str
    key: str
    shard: int
    name: str
    payload: str | None
    activate: bool = False


@dataclass(frozen=True, slots=True)
class Describe(Request[EntityDescription]):
    """What the store and the hosting shard know of one entity."""

    entity_type: str
    key: str
    shard: int


@dataclass(frozen=True, slots=True)
class MessagesRead(Request[R]):
    """A read of one entity whose answer holds a page of `limit` of its messages after
    seq `after`: the fields of `History` and `State`, which differ only in the answer
    (a record type each, so that each is dispatched by its kind and typed by its `R`)."""

    entity_type: str
    key: str
    shard: int
    limit: int
    after: int


class History(MessagesRead[EntityHistory]):
    """The entity's runs, waits, timers and a page of its messages after seq `after`."""

    __slots__ = ()


class State(MessagesRead[EntityState]):
    """The latest snapshot's state and a page of the messages after it (and `after`)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class LatestRun(Request[RunRecord | None]):
    """The entity's latest run, or None if it was never started."""

    entity_type: str
    key: str
    shard: int


@dataclass(frozen=True, slots=True)
class ReplayDeadLetter(Request[AcceptResult]):
    """Accept the dead letter's payload again as a new signal of the running run and
    delete the dead letter (one transaction), then hand the entry to its host."""

    entity_type: str
    key: str
    shard: int
    dead_letter_id: int


@dataclass(frozen=True, slots=True)
class DiscardDeadLetter(Request[bool]):
    """Delete a dead letter; whether it existed."""

    entity_type: str
    key: str
    shard: int
    dead_letter_id: int


@dataclass(frozen=True, slots=True)
class DeadLetters(Request[list[DeadLetter]]):
    """Dead letters with an id above `after`, oldest first, optionally of one entity
    type and/or key (`shard`: the key's owner when both are given, else None)."""

    entity_type: str | None
    key: str | None
    limit: int
    after: int
    shard: int | None = None


@dataclass(frozen=True, slots=True)
class SignalWaits(Request[list[WaitRecord]]):
    """Open signal waits, oldest first, after position `after`."""

    entity_type: str | None
    limit: int
    after: WaitPosition | None
    shard: None = None


@dataclass(frozen=True, slots=True)
class Entities(Request[list[EntitySummary | UnreadableRow]]):
    """Entities in (type, key) order after `after`, with what the answering host knows
    live of those it hosts."""

    entity_type: str | None
    status: RunStatus | None
    limit: int
    after: tuple[str, str] | None
    shard: None = None
    key_prefix: str | None = None


@dataclass(frozen=True, slots=True)
class TakeCensus(Request[Census]):
    """The deployment's numbers for a metrics scrape (`persistence.Census`)."""

    entity_type: None = None
    shard: None = None


@dataclass(frozen=True, slots=True)
class ScheduleCall(Request[Any]):
    """One call of `Runtime.schedules` on the store (`persistence.ScheduleStore`):
    `method` (one of `SCHEDULE_METHODS`) with `args`, checked at the boundary before.
    A trigger or backfill names the target's `shard` (its holder routes what it
    accepts to the entity at once); the rest carry `shard=None`: any host answers."""

    method: str
    args: tuple[Any, ...]
    shard: int | None = None
    entity_type: str | None = None
    key: str | None = None


SCHEDULE_METHODS = frozenset({"put_schedule", "pause_schedule", "delete_schedule",
                              "trigger_schedule", "backfill_schedule", "schedule",
                              "schedules"})
"""The `ScheduleStore` methods a `ScheduleCall` may name."""


AnyRequest = (Acceptance | DeliveryRequest | AcceptBatch | WaitUpdate | Query | Describe
              | History | State | LatestRun | ReplayDeadLetter | DiscardDeadLetter
              | DeadLetters | SignalWaits | Entities | TakeCensus | ScheduleCall)
"""Every record a shard host runs (a `SignalBatch` reaches it as atomic `AcceptBatch`es)."""
