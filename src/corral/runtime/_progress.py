"""Recording a host's progress in the store, off the path of a message.

Each `PROGRESS_INTERVAL` a host looks at the entities resident in its shards and, per
shard, records in one fenced write those whose applied watermark or mailbox depth moved
since it last recorded them (`Store.record_progress`); a shard with nothing new writes
nothing. Applying a message does no work for it at all: the cost is one small write per
busy shard per interval, joined to whatever group commit is in flight. What operators
see may therefore lag the host by up to an interval (see `persistence/_progress`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from corral._errors import LeaseLostError

from ._shard import Shard

__all__ = ["PROGRESS_INTERVAL", "ProgressLog"]

PROGRESS_INTERVAL: float | None = 1.0
"""Seconds between two recordings of a host's progress (None: never record; for
measuring what recording costs, `benchmarks/accept.py --progress`)."""

_Row = tuple[str, str, int, int]


class ProgressLog:
    """What a host last recorded of each shard's resident entities."""

    def __init__(self) -> None:
        self._recorded: dict[int, dict[tuple[str, str], tuple[int, int]]] = {}

    async def record(self, shards: Iterable[Shard], at: float) -> int:
        """Record the entities of `shards` whose progress moved; how many rows were written."""
        moved = [(shard, self._moved(shard)) for shard in shards]
        moved = [(shard, rows) for shard, rows in moved if rows]
        outcomes = await asyncio.gather(
            *(shard.store.record_progress(shard.fence, rows, at=at) for shard, rows in moved),
            return_exceptions=True)
        written = 0
        for (shard, rows), outcome in zip(moved, outcomes, strict=True):
            if isinstance(outcome, LeaseLostError):
                self._recorded.pop(shard.index, None)  # no longer ours to record
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                seen = self._recorded.setdefault(shard.index, {})
                seen.update(((etype, key), (applied, depth)) for etype, key, applied, depth in rows)
                written += len(rows)
        return written

    def _moved(self, shard: Shard) -> list[_Row]:
        """The ready resident entities of `shard` whose progress moved since recorded;
        what it recorded of those no longer resident is dropped."""
        seen = self._recorded.get(shard.index, {})
        now: dict[tuple[str, str], tuple[int, int]] = {}
        rows: list[_Row] = []
        for act in shard.activations():
            if not act.is_ready:
                continue
            ident = (act.entity_type, act.key)
            now[ident] = mark = (act.applied_seq, act.mailbox_depth)
            if seen.get(ident) != mark:
                rows.append((*ident, *mark))
        self._recorded[shard.index] = {k: v for k, v in seen.items() if k in now}
        return rows
