"""Entity-to-entity messages (`Entity.send`): validated when sent, written with the
sender's progress, delivered by the sender's host.

`outgoing` checks a send at the call (the target type, its key, its signal handler,
the payload and start input, as a client's `signal_with_start` would) and makes the
`Send` the activation keeps until its next step record, snapshot or close writes it to
the outbox in that same transaction (`persistence._ops_outbox`). After that commit the
host's `Postman` accepts each written send into its target, in order, with its message
id (derived from (sender, run, send number) for `run()`'s sends, from (sender, run,
journal entry, place in the call) for a handler's: `_run_context`), so a delivery
repeated after a crash is a duplicate at the target; then it marks them sent. A host
taking a shard delivers what its senders left (`Postman.recover`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from corral._common import IdReusePolicy
from corral._errors import CorralError, InvalidArgumentError, LeaseLostError, StoreError
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

from ._boundary import Boundary, Limits
from ._clock import Clock
from ._router import Router

__all__ = ["Postman", "outgoing"]

log = logging.getLogger("corral.outbox")
_CHECKS = Boundary({}, Limits(), None)
_SIGNAL = (HandlerKind.SIGNAL,)
_RETRY = 1.0  # seconds before a delivery that met a store error is tried again


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
    """What delivering needs of a shard this host holds: taking an accepted entry."""

    def take_accepted(self, result: AcceptResult, start_input: str | None) -> None: ...


class Postman:
    """Delivers the outboxes of one host's entities (one task per sender run at a time)."""

    def __init__(self, store: Store, router: Router,
                 hosted: Callable[[int], HostedShard | None], clock: Clock) -> None:
        self._store = store
        self._router = router
        self._hosted = hosted
        self._clock = clock
        self._busy: dict[tuple[str, str, int], bool] = {}  # sender run -> posted again
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

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
                    rows = await self._store.pending_sends(*sender)
                    if rows:
                        await self._deliver_rows(fence, sender, rows)
                except LeaseLostError:
                    return  # the shard's next holder delivers them (`recover`)
                except StoreError as err:
                    log.warning("%s %r run %d: delivering its sends failed (%s); retrying "
                                "in %.1fs", *sender, err, _RETRY)
                    await asyncio.sleep(_RETRY)
                    continue
                if not self._busy[sender]:
                    return
        finally:
            self._busy.pop(sender, None)

    async def _deliver_rows(self, fence: Fence, sender: tuple[str, str, int],
                            rows: list[OutboxRow]) -> None:
        """Accept each row into its target, in order; then mark them sent."""
        errors: list[tuple[int, str]] = []
        for row in rows:
            s = row.send
            acc = _acceptance(row, self._router.shard_of(s.target_type, s.target_key),
                              self._clock.time())
            try:
                result = await self._store.accept(acc)
            except StoreError:
                raise
            except CorralError as err:  # not running, closed, a conflicting id
                log.warning("%s %r run %d: send %d to %s %r refused: %s", *sender, row.seq,
                            s.target_type, s.target_key, err)
                errors.append((row.seq, f"{type(err).__name__}: {err}"))
                continue
            shard = self._hosted(acc.shard)
            if shard is not None:
                shard.take_accepted(result, acc.start)
        await self._store.mark_sent(fence, *sender, upto=rows[-1].seq, errors=errors)


def _acceptance(row: OutboxRow, shard: int, now: float) -> Acceptance:
    s = row.send
    return Acceptance(s.target_type, s.target_key, shard, EntryKind.SIGNAL, s.name,
                      row.message_id, s.payload, payload_hash(s.name, s.payload),
                      f"{row.entity_type}/{row.key}", s.start, IdReusePolicy(s.id_reuse), now)
