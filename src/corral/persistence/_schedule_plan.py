"""What a schedule does when its holder looks at it: a pure decision both engines'
transactions call (`_ops_schedules.FireOp`), written once and tested without a store.

`decide` walks the ticks from the schedule's next unhandled one up to now: a tick older
than the catch-up window is skipped (missed), one inside it is a candidate; then the
overlap policy picks which candidates fire (`Overlap`): with the previous tick's signal
still unapplied, `skip` skips them all and `buffer_one` keeps the newest to fire once
it is applied; otherwise the first fires, and the rest overlap it (skipped, or the
newest buffered). `allow` fires them all. The end (`end_at`, `max_ticks`) stops it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from corral._schedule_spec import Overlap, Schedule, jitter_of, next_tick

__all__ = ["BUFFER_RECHECK", "ROUND_TICKS", "Decision", "decide", "due_at"]

ROUND_TICKS = 10_000
"""Ticks one decision walks at most; a schedule with more to catch up is looked at again
at once (its `due_at` stays due)."""

BUFFER_RECHECK = 1.0
"""Seconds between looks at a schedule whose buffered tick waits for the previous one."""


@dataclass(frozen=True, slots=True)
class Decision:
    """Ticks to fire (in order), ticks skipped (missed: outside the catch-up window;
    overlapped: by the policy), and the schedule's progress after them."""

    fire: tuple[int, ...]
    missed: int
    overlapped: int
    next_tick: int | None  # the next tick not handled yet (None: ended)
    buffered: int | None
    due_at: float | None


def decide(sid: str, s: Schedule, *, next_: int | None, buffered: int | None, fired: int,
           now: float, pending: bool) -> Decision:
    """The ticks due at `now` of schedule `sid` and what becomes of them; `pending`:
    the previous tick's signal is not applied yet."""
    limit = now - s.catchup_window
    remaining = math.inf if s.max_ticks is None else s.max_ticks - fired
    candidates = [] if buffered is None else [buffered]
    missed = walked = 0
    t = next_
    while t is not None and t <= now and walked < ROUND_TICKS:
        if s.end_at is not None and t > s.end_at:
            t = None
            break
        if t < limit:
            missed += 1
        else:
            candidates.append(t)
        walked += 1
        t = next_tick(s.spec, t)
    if t is not None and s.end_at is not None and t > s.end_at:
        t = None
    fire, keep = _overlap(s.overlap, candidates, pending)
    overlapped = len(candidates) - len(fire) - (keep is not None)
    if len(fire) > remaining:
        overlapped += len(fire) - int(remaining)
        fire = fire[:int(remaining)]
    if s.max_ticks is not None and fired + len(fire) >= s.max_ticks:
        t, keep = None, None  # the last tick it may fire fires now
    busy = walked >= ROUND_TICKS and t is not None and t <= now
    return Decision(tuple(fire), missed, overlapped, t, keep,
                    now if busy else due_at(sid, s, t, keep, now))


def _overlap(policy: Overlap, candidates: list[int], pending: bool
             ) -> tuple[list[int], int | None]:
    """(the ticks that fire, the tick buffered) of the candidates."""
    if not candidates or policy is Overlap.ALLOW:
        return candidates, None
    if pending:
        return [], candidates[-1] if policy is Overlap.BUFFER_ONE else None
    rest = candidates[1:]
    return candidates[:1], rest[-1] if rest and policy is Overlap.BUFFER_ONE else None


def due_at(sid: str, s: Schedule, next_: int | None, buffered: int | None,
           now: float) -> float | None:
    """When the holder looks at the schedule next: its next tick (plus jitter), sooner
    while a buffered tick waits; None when paused or ended."""
    if s.paused:
        return None
    times = [] if next_ is None else [next_ + jitter_of(sid, next_, s.jitter)]
    if buffered is not None:
        times.append(now + BUFFER_RECHECK)
    return min(times) if times else None
