"""Recording a host's progress in the store, off the path of a message.

Each `PROGRESS_INTERVAL` a host looks at the entities resident in its shards and, per
shard, records in one fenced write those whose applied watermark or mailbox depth moved
since it last recorded them (`Store.record_progress`); a shard with nothing new writes
nothing. Applying a message does no work for it at all. A round writes at most
`PROGRESS_ROWS` rows in all, shared out among the shards; each shard walks its entities
from where its last round stopped, so with more entities moving than that every one is
still recorded in turn, every `moving / PROGRESS_ROWS` intervals (10,000 rows cost the
SQLite writer ~100 ms, so the cap keeps recording to a few per cent of it). What
operators see may therefore lag the host by an interval or a few (see
`persistence/_progress`).

With the same write each shard records its backlog by type (`Shard.backlog`) when it
changed since the shard's last write at its lease's epoch (`persistence/_backlog`):
the census sums these summaries instead of seeking every running entity. A shard whose
summary moved and no row did writes the summary alone; an idle shard writes nothing.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from corral._errors import LeaseLostError
from corral.persistence import ShardBacklog

from ._shard import Shard

__all__ = ["PROGRESS_INTERVAL", "PROGRESS_ROWS", "ProgressLog", "share"]

PROGRESS_INTERVAL: float | None = 1.0
"""Seconds between two recordings of a host's progress (None: never record; for
measuring what recording costs, `benchmarks/accept.py --progress`)."""

PROGRESS_ROWS = 2048
"""The most rows a host records in one round, all its shards together."""

_Ident = tuple[str, str]
_Row = tuple[str, str, int, int]
_Types = dict[str, tuple[int, int, float | None]]


def share(wanted: Sequence[int], budget: int) -> list[int]:
    """How many of `budget` rows each shard records, given how many it `wanted`: all of
    them where they fit, the rest split evenly among those that want more."""
    given = [0] * len(wanted)
    left, open_ = budget, sorted(range(len(wanted)), key=lambda i: wanted[i])
    while open_:
        i = open_.pop(0)
        given[i] = min(wanted[i], left // (len(open_) + 1))
        left -= given[i]
    return given


class ProgressLog:
    """What a host last recorded of each shard's resident entities, and where each
    shard's next round starts."""

    def __init__(self) -> None:
        self._recorded: dict[int, dict[_Ident, tuple[int, int]]] = {}
        self._cursor: dict[int, int] = {}
        # shard -> (lease epoch, its backlog summary as last written (None: unknown),
        # the types whose rows at that epoch are not zero).
        self._summaries: dict[int, tuple[int, _Types | None, frozenset[str]]] = {}

    async def record(self, shards: Sequence[Shard], at: float) -> int:
        """Record the entities of `shards` whose progress moved (at most
        `PROGRESS_ROWS`); how many rows were written."""
        held = {shard.index for shard in shards}
        self._summaries = {i: v for i, v in self._summaries.items() if i in held}
        moved = [self._moved(shard) for shard in shards]
        quota = share([len(rows) for rows, _ in moved], PROGRESS_ROWS)
        summaries = [self._summary(shard) for shard in shards]
        batches = [(shard, rows[:n], ends[:n], summary)
                   for shard, (rows, ends), n, summary
                   in zip(shards, moved, quota, summaries, strict=True)
                   if n or summary is not None]
        outcomes = await asyncio.gather(
            *(shard.store.record_progress(
                shard.fence, rows, at=at,
                backlog=None if summary is None else ShardBacklog(*summary))
              for shard, rows, _, summary in batches), return_exceptions=True)
        written = 0
        for (shard, rows, ends, summary), outcome in zip(batches, outcomes, strict=True):
            if isinstance(outcome, LeaseLostError):
                self._recorded.pop(shard.index, None)  # no longer ours to record
                self._summaries.pop(shard.index, None)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                seen = self._recorded.setdefault(shard.index, {})
                seen.update(((etype, key), (applied, depth))
                            for etype, key, applied, depth in rows)
                if ends:
                    self._cursor[shard.index] = ends[-1]
                if summary is not None:
                    types = summary[0]
                    was = self._summaries.get(shard.index)
                    nonzero = was[2] if was is not None and was[0] == shard.fence.epoch \
                        else frozenset()
                    if types is not None:
                        nonzero = frozenset(types)
                    self._summaries[shard.index] = (shard.fence.epoch, types, nonzero)
                written += len(rows)
        return written

    def _summary(self, shard: Shard) -> tuple[_Types | None, tuple[str, ...]] | None:
        """The shard's backlog summary and the types gone from it since last written at
        its lease's epoch, or None when unchanged."""
        types = shard.backlog()
        last = self._summaries.get(shard.index)
        if last is None or last[0] != shard.fence.epoch:
            return types, ()  # rows of an earlier epoch are never read
        if last[1] == types:
            return None
        return types, tuple(sorted(last[2] - set(types or ())))

    def _moved(self, shard: Shard) -> tuple[list[_Row], list[int]]:
        """The resident entities of `shard` whose progress moved since recorded (loading
        ones too: a replay blocked in a handler is what an operator looks for), from
        where its last round stopped, each with the position after it; what was recorded
        of entities no longer resident is dropped."""
        acts = [a for a in shard.activations() if a.has_progress]
        resident = {(a.entity_type, a.key) for a in acts}
        self._recorded[shard.index] = seen = {
            k: v for k, v in self._recorded.get(shard.index, {}).items() if k in resident}
        start = self._cursor.get(shard.index, 0) % max(len(acts), 1)
        rows: list[_Row] = []
        ends: list[int] = []
        for at, act in zip(itertools.count(start + 1), acts[start:] + acts[:start]):
            mark = (act.applied_seq, act.mailbox_depth)
            if seen.get((act.entity_type, act.key)) != mark:
                rows.append((act.entity_type, act.key, *mark))
                ends.append(at)
        return rows, ends
