"""A host's schedule round: fire the due schedules of the shards it holds.

A schedule belongs to its target entity's shard, so the host that fires it is the one
that hosts the entity (it knows whether the previous tick's signal is applied). A round
is one read of `schedules_due` per shard (nothing due: nothing more), then one fenced
`FireOp` per due schedule, all in one group commit (`Store.fire_schedules`), at most
`ROUND` at a time. Each op decides and fires its ticks inside its transaction; what it
accepted is routed to the entity at once, as an entity's send is (`Postman`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import corral.metrics as metrics
from corral._errors import LeaseLostError
from corral.persistence import Fired, FireOp, Store

from .._clock import Clock
from ._shard import Shard

__all__ = ["ROUND", "ScheduleRound"]

log = logging.getLogger("corral.schedules")

ROUND = 1000
"""Due schedules read, and fired in one group commit, at a time."""


class ScheduleRound:
    """Fires the due schedules of one host's shards."""

    def __init__(self, store: Store, shards: Callable[[], dict[int, Shard]], clock: Clock,
                 polling: asyncio.Lock) -> None:
        self._store = store
        self._shards = shards
        self._clock = clock
        self._polling = polling  # shared with the host's other polls: one at a time

    async def fire_due(self) -> int:
        """Fire what is due now; the ticks fired (a round repeats while a full one was read)."""
        fired = 0
        while True:
            shards = self._shards()
            now = self._clock.time()
            async with self._polling:
                due = await self._store.due_schedules(frozenset(shards), now, limit=ROUND)
            ops = [FireOp(shard.fence, d.id, d.version, d.entity_type, d.key,
                          shard.known_applied(d.entity_type, d.key), now)
                   for d in due if (shard := shards.get(d.shard)) is not None]
            if not ops:
                return fired
            results = await self._store.fire_schedules(ops)
            for op, result in zip(ops, results, strict=True):
                fired += self._took(shards, op, result)
            if len(due) < ROUND:
                return fired

    def _took(self, shards: dict[int, Shard], op: FireOp, result: Fired | Exception) -> int:
        """Route what `op` accepted and count it; the ticks it fired."""
        if isinstance(result, LeaseLostError):
            return 0  # the shard's next holder fires it
        if isinstance(result, Exception):
            log.warning("schedule %r: its round failed (%s); it is looked at again next "
                        "round", op.sid, result)
            return 0
        shard = shards.get(op.fence.shard)
        for accepted, start in result.accepted:
            if shard is not None:
                shard.take_accepted(accepted, start)
        for outcome, late in zip(result.outcomes, result.late, strict=True):
            metrics.schedule_fired(op.entity_type, outcome, late)
        if result.missed:
            metrics.schedule_skipped(op.entity_type, "missed", result.missed)
        if result.overlapped:
            metrics.schedule_skipped(op.entity_type, "overlap", result.overlapped)
        return len(result.outcomes)
