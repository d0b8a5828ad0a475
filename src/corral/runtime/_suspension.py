"""Suspended runs: a bug in `run()` (or an activation that cannot be built) suspends the
run; it never fails it.

The host evicts the activation (its in-memory state is dropped: the bug may have
half-changed it), records the suspension in the store (error with traceback, attempts,
since, next attempt) and holds the entity in its shard until the next attempt under
the type's `run_retry`: messages go on being accepted and journaled, but do not bring
it back early. The next attempt rebuilds the entity from its latest snapshot and
journal and calls `run()` again; a host that takes the shard (a restart with fixed
code) and `EntityRef.resume()` (a `RESUME` journal entry) try at once.

The suspension is over (the record is dropped) when the retried `run()` first parks in
a wait (`wait_for`, `sleep`, the mailbox, `wait_for_signal`) or ends, or, for a type
without `run()`, when its activation is built: the run got past the point that failed.
A run fails only by `corral.FailRun`, a type in the class's `fail_on`, or a finite
`run_retry.max_attempts` running out.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from typing import TYPE_CHECKING

import corral.metrics as metrics
from corral._errors import StoreError
from corral.persistence import Suspension

from ._events import lifecycle

if TYPE_CHECKING:
    from ._activation import Activation

__all__ = ["HeldRun", "end_suspension", "next_suspension", "record_suspension"]

log = logging.getLogger("corral.activation")


class HeldRun:
    """A shard's note of a suspended run: its count and, while it waits for its next
    attempt, the timer that brings it back (None once an attempt is under way)."""

    __slots__ = ("attempts", "handle", "run_id", "since")

    def __init__(self, run_id: int, attempts: int, since: float) -> None:
        self.run_id = run_id
        self.attempts = attempts
        self.since = since
        self.handle: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> bool:
        """Held out of memory until its next attempt."""
        return self.handle is not None


def next_suspension(act: Activation, err: BaseException, during: str) -> Suspension | None:
    """The suspension `err` makes of `act`'s run, or None when `run_retry.max_attempts`
    ran out (the run is then failed)."""
    held = act.shard.suspended(act.entity_type, act.key)
    same = held is not None and held.run_id == act.run_id
    attempts = (held.attempts if held is not None and same else 0) + 1
    policy = act.definition.run_retry
    if policy.max_attempts is not None and attempts >= policy.max_attempts:
        return None
    now = act.now()
    text = "".join(traceback.format_exception(err))
    return Suspension(act.entity_type, act.key, act.run_id, f"{during}: {text}", attempts,
                      held.since if held is not None and same else now,
                      now + policy.backoff(attempts))


async def record_suspension(act: Activation, record: Suspension) -> None:
    """Hold the (already evicted) entity until its next attempt, and record why."""
    delay = max(0.0, record.next_attempt_at - act.now())
    act.shard.hold(record, delay)
    metrics.suspended(act.entity_type)
    lifecycle("run suspended", act.entity_type, act.key, act.run_id,
              attempts=record.attempts, retry_in=round(delay, 3))
    log.warning("%s %r run %d suspended (attempt %d; next in %.3fs); its messages are kept:"
                "\n%s", act.entity_type, act.key, act.run_id, record.attempts, delay,
                record.error)
    try:
        await act.shard.store.suspend_run(act.shard.fence, record)
    except StoreError as err:  # held all the same; describe() shows it once written
        log.warning("%s %r: the suspension was not recorded (%s)", act.entity_type, act.key,
                    err)


async def end_suspension(act: Activation) -> None:
    """The retried run got past the point: drop the record (retried while the store fails)."""
    act.shard.release(act.entity_type, act.key, act.run_id)
    lifecycle("run resumed", act.entity_type, act.key, act.run_id)
    store, fence = act.shard.store, act.shard.fence
    etype, key, run_id = act.entity_type, act.key, act.run_id
    await act.retrying("suspension", lambda: store.clear_suspension(fence, etype, key, run_id))
