"""`Runtime.signal_many`: a batch of signals, mixed types and keys, in one call.

Each item is checked at the boundary as `signal` / `signal_with_start` check theirs (a
bad one refuses the batch before anything is sent), then the batch goes to the backend
as one `SignalBatch`: the local backend commits it in one transaction, all or nothing;
the Ray backend splits it by shard, all or nothing per shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral._errors import BatchRefusedError, CorralError, InvalidArgumentError
from corral._tracing import tracer
from corral.persistence import Acceptance

from ._backend import Backend
from ._ref import EntityRef, ack, annotate_refusal
from ._requests import SignalBatch
from ._results import Ack
from ._traces import accept_batch_traced

__all__ = ["MAX_BATCH", "SignalItem", "signal_many"]

MAX_BATCH = 10_000
"""Items one `signal_many` call takes at most (one transaction holds them all)."""


class _NoStart:
    """`SignalItem.start` left out: the item is a plain `signal`."""

    def __repr__(self) -> str:
        return "NO_START"


NO_START: Any = _NoStart()


@dataclass(frozen=True, slots=True)
class SignalItem:
    """One signal of a `Runtime.signal_many` batch.

    Attributes:
        ref: the entity (`rt.ref(Type, key)`, of the runtime that sends the batch).
        handler: the signal handler (`Type.handler`).
        payload: its model instance, or a dict of its fields (None for none).
        message_id: the idempotency key, as for `signal` (None: a fresh one).
        start: the start input: given (even None, for a type whose `__init__` takes
            none), the item is a `signal_with_start`; left out, a plain `signal`.
        sender: the sender claimed, as for `signal`.

    Example:
        item = corral.SignalItem(rt.ref(Ticket, "t-1"), Ticket.reply, reply,
                                 message_id=event.id, start=TicketInput(tenant="acme"))
    """

    ref: EntityRef[Any, Any]
    handler: Any
    payload: Any = None
    message_id: str | None = None
    start: Any = NO_START
    sender: str | None = None


async def signal_many(backend: Backend, items: Sequence[SignalItem]) -> list[Ack]:
    """Check each item, accept the batch, answer one `Ack` per item in batch order."""
    if not isinstance(items, Sequence) or isinstance(items, str | bytes):
        raise InvalidArgumentError(f"signal_many takes a sequence of SignalItem, got "
                                   f"{type(items).__name__}")
    if len(items) > MAX_BATCH:
        raise InvalidArgumentError(f"a batch holds at most {MAX_BATCH} signals, got "
                                   f"{len(items)}: split it")
    accs: list[Acceptance] = []
    for index, item in enumerate(items):
        try:
            accs.append(await _acceptance(backend, index, item))
        except CorralError as err:
            if isinstance(item, SignalItem):
                annotate_refusal(err, item.ref, item.message_id)
            raise BatchRefusedError.of(index, err) from err
    if not accs:
        return []
    traced = tracer()
    try:
        results = await (backend.handle(SignalBatch(accs)) if traced is None
                         else accept_batch_traced(traced, backend, accs))
    except BatchRefusedError as err:
        refused = items[err.index]
        if err.error is not None:
            annotate_refusal(err.error, refused.ref, refused.message_id)
        raise
    return [ack(r) for r in results]


async def _acceptance(backend: Backend, index: int, item: object) -> Acceptance:
    if not isinstance(item, SignalItem):
        raise InvalidArgumentError(f"item {index} is a {type(item).__name__}, not a "
                                   "corral.SignalItem")
    if not isinstance(item.ref, EntityRef) or item.ref._backend is not backend:
        raise InvalidArgumentError(f"item {index}: its ref is not one of this runtime's "
                                   "(rt.ref(Type, key))")
    with_start = item.start is not NO_START
    return await item.ref.signal_acceptance(
        item.handler, item.payload, item.start if with_start else None, with_start,
        item.message_id, item.sender)
