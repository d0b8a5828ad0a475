"""Entity-to-entity messages (`Entity.send`): validated when sent, written with the
sender's progress, delivered by the sender's host.

`outgoing` checks a send at the call (the target type, its key, its signal handler,
the payload and start input, as a client's `signal_with_start` would) and makes the
`Send` the activation keeps until its next step record, snapshot or close writes it to
the outbox in that same transaction (`persistence._ops_outbox`). After that commit the
host's `Postman` accepts the written sends into their targets, in order, up to 256 in
one transaction (`Store.accept_all`), each with its message id (derived from (sender,
run, send number) for `run()`'s sends, from (sender, run, journal entry, place in the
call) for a handler's: `_run_context`), so a delivery repeated after a crash is a
duplicate at the target; then it marks them sent. A target over its type's
`max_backlog` (as this host defines it) holds the sender's sends from that one on until
it has room; a target that refuses one for good (not running, closed) gets the rest.
A host taking a shard delivers what its senders left (`Postman.recover`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from corral._common import IdReusePolicy
from corral._errors import (
    BatchRefusedError,
    EntityOverloadedError,
    InvalidArgumentError,
    LeaseLostError,
    StoreError,
)
from corral.actors import EntityDefinition, HandlerKind
from corral.persistence import (
    Acceptance,
    AcceptResult,
    EntryKind,
    Fence,
    OutboxRow,
    Send,
    Store,
    payload_hash,
)

from .._clock import Clock
from ..client._boundary import Boundary, Limits
from ..client._router import Router

__all__ = ["Postman", "outgoing"]

log = logging.getLogger("corral.outbox")
_CHECKS = Boundary({}, Limits(), None)
_SIGNAL = (HandlerKind.SIGNAL,)
_RETRY = 1.0  # seconds before a delivery that met a store error is tried again
_ROWS = 256  # a sender's sends read, and accepted in one transaction, at a time


def outgoing(entity_type: object, key: object, handler: object, payload: object,
             start: object, with_start: bool) -> Send:
    """A send, checked as a client's `signal` / `signal_with_start` would check it.

    Raises `InvalidArgumentError` (not an entity class), `InvalidKeyError`,
    `UnknownHandlerError` or `InvalidPayloadError`; nothing is kept then."""
    definition = getattr(entity_type, "_corral_definition", None)
    if not isinstance(entity_type, type) or not isinstance(definition, EntityDefinition):
        raise InvalidArgumentError(
            f"send() takes an entity class first, got {entity_type!r:.80}")
    checked_key = _CHECKS.check_key(key)
    h = _CHECKS.handler(definition, handler, _SIGNAL)
    text = _CHECKS.payload(h, payload)
    start_text = _CHECKS.start_input(definition, start) if with_start else None
    return Send(definition.name, checked_key, h.name, text, start_text,
                definition.id_reuse.value)


class HostedShard(Protocol):
    """What delivering needs of a shard this host holds: the applied seq of an entity it
    hosts (None: not hosted), and taking an accepted entry."""

    def applied_seq(self, etype: str, key: str) -> int | None: ...

    def take_accepted(self, result: AcceptResult, start_input: str | None) -> None: ...


class Postman:
    """Delivers the outboxes of one host's entities (one task per sender run at a time)."""

    def __init__(self, store: Store, router: Router,
                 definitions: Mapping[str, EntityDefinition],
                 hosted: Callable[[int], HostedShard | None], clock: Clock) -> None:
        self._store = store
        self._router = router
        self._definitions = definitions  # a target's backpressure: this host's definition
        self._hosted = hosted
        self._clock = clock
        self._busy: dict[tuple[str, str, int], bool] = {}  # sender run -> posted again
        self._resting: set[tuple[str, str, int]] = set()  # waiting out an overloaded target
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def busy(self) -> bool:
        """Whether a delivery is under way (posted and not done, nor waiting out an
        overloaded target's delay): a test runtime settles only once none is."""
        return len(self._busy) > len(self._resting)

    def post(self, fence: Fence, etype: str, key: str, run_id: int) -> None:
        """Deliver the run's written sends soon (after the commit that wrote them)."""
        sender = (etype, key, run_id)
        if self._closed:
            return  # the shard's next holder delivers them (`recover`)
        if sender in self._busy:
            self._busy[sender] = True  # the running delivery reads the outbox again
            return
        self._busy[sender] = False
        task = asyncio.create_task(self._deliver(fence, sender), name="corral-outbox")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def recover(self, fence: Fence) -> None:
        """Deliver what the senders of the shard `fence` holds left undelivered."""
        for etype, key, run_id in await self._store.pending_senders(fence.shard):
            self.post(fence, etype, key, run_id)

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _deliver(self, fence: Fence, sender: tuple[str, str, int]) -> None:
        try:
            while True:
                self._busy[sender] = False
                try:
                    rows = await self._store.pending_sends(*sender, limit=_ROWS)
                    wait = await self._deliver_rows(fence, sender, rows) if rows else None
                except LeaseLostError:
                    return  # the shard's next holder delivers them (`recover`)
                except StoreError as err:
                    log.warning("%s %r run %d: delivering its sends failed (%s); retrying "
                                "in %.1fs", *sender, err, _RETRY)
                    wait = _RETRY
                if wait is not None:
                    self._resting.add(sender)
                    try:
                        await asyncio.sleep(wait)
                    finally:
                        self._resting.discard(sender)
                elif len(rows) < _ROWS and not self._busy[sender]:
                    return
        finally:
            self._busy.pop(sender, None)

    async def _deliver_rows(self, fence: Fence, sender: tuple[str, str, int],
                            rows: list[OutboxRow]) -> float | None:
        """Accept the rows into their targets, in order, all in one transaction unless a
        target refuses one; then mark them sent. A refused row is kept with the reason
        (not running, closed, a conflicting id), except an overloaded target's: the
        rows from it on wait for the returned delay (`EntityOverloadedError.retry_after`)
        and are sent again then, in order."""
        errors: list[tuple[int, str]] = []
        now = self._clock.time()
        done, end, wait = 0, len(rows), None  # rows[:done] accepted or refused for good
        while done < len(rows):
            accs = [self._acceptance(row, now) for row in rows[done:end]]
            try:
                results = await self._store.accept_all(accs)
            except BatchRefusedError as refused:
                if refused.index:  # accept the rows before it first, then it alone
                    end = done + refused.index
                    continue
                err, row = refused.error or refused, rows[done]
                if isinstance(err, EntityOverloadedError):
                    wait = err.retry_after
                    break
                log.warning("%s %r run %d: send %d to %s %r refused: %s", *sender, row.seq,
                            row.send.target_type, row.send.target_key, err)
                errors.append((row.seq, f"{type(err).__name__}: {err}"))
                done, end = done + 1, len(rows)
                continue
            for acc, result in zip(accs, results, strict=True):
                shard = self._hosted(acc.shard)
                if shard is not None:
                    shard.take_accepted(result, acc.start)
            done, end = end, len(rows)
        if done:
            await self._store.mark_sent(fence, *sender, upto=rows[done - 1].seq,
                                        errors=errors)
        return wait


    def _acceptance(self, row: OutboxRow, now: float) -> Acceptance:
        """The row's acceptance into its target, bounded by the target type's
        `max_backlog` (counted from this host's activation of it, if it hosts it)."""
        s = row.send
        shard = self._router.shard_of(s.target_type, s.target_key)
        acc = Acceptance(s.target_type, s.target_key, shard, EntryKind.SIGNAL, s.name,
                         row.message_id, s.payload, payload_hash(s.name, s.payload),
                         f"{row.entity_type}/{row.key}", s.start, IdReusePolicy(s.id_reuse),
                         now, trace=s.trace)
        definition = self._definitions.get(s.target_type)
        if definition is None or definition.max_backlog is None:
            return acc
        hosted = self._hosted(shard)
        applied = hosted.applied_seq(s.target_type, s.target_key) if hosted else None
        return acc._replace(max_backlog=definition.max_backlog,
                            overflow=definition.overflow, applied=applied or 0)
