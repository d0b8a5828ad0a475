"""Suspended runs: a bug in `run()` (or an activation that cannot be built) suspends the
run; it never fails it.

The host evicts the activation (its in-memory state is dropped: the bug may have
half-changed it), records the suspension in the store (error with traceback, attempts,
since, next attempt) and holds the entity in its shard until the next attempt under
the type's `run_retry`: messages go on being accepted and journaled, but do not bring
it back early. The next attempt rebuilds the entity from its latest snapshot and
journal (applying every kept signal and update through its handler: an update is
answered then, its outcome recorded once, and applied again only to rebuild the state
at a later attempt) and calls `run()` again; a host that takes the shard (a restart with fixed
code) and `EntityRef.resume()` (a `RESUME` journal entry) try at once.

The suspension is over (the record is dropped) when the retried `run()` first parks in
a wait (`wait_for`, `sleep`, the mailbox, `wait_for_signal`) or ends, or, for a type
without `run()`, when its activation is built: the run got past the point that failed.
A run fails only by `corral.FailRun`, a type in the class's `fail_on`, or a finite
`run_retry.max_attempts` running out.
"""

from __future__ import annotations

import logging
import traceback

import corral.metrics as metrics
from corral._errors import StoreError
from corral.persistence import Suspension

from ._events import lifecycle
from ._residence import Residence, retrying

__all__ = ["end_suspension", "next_suspension", "record_suspension"]

log = logging.getLogger("corral.activation")


def next_suspension(home: Residence, run_id: int, err: BaseException, during: str
                    ) -> Suspension | None:
    """The suspension `err` makes of run `run_id`, or None when the run fails instead:
    the code says so (`FailRun`, `fail_on`) or `run_retry.max_attempts` ran out."""
    definition = home.definition
    if definition.fails_run(err):
        return None
    held = home.suspended()
    same = held is not None and held.run_id == run_id
    attempts = (held.attempts if held is not None and same else 0) + 1
    policy = definition.run_retry
    if policy.max_attempts is not None and attempts >= policy.max_attempts:
        return None
    now = home.clock.time()
    text = "".join(traceback.format_exception(err))
    return Suspension(home.entity_type, home.key, run_id, f"{during}: {text}", attempts,
                      held.since if held is not None and same else now,
                      now + policy.backoff(attempts))


async def record_suspension(home: Residence, record: Suspension) -> None:
    """Hold the (already evicted) entity until its next attempt, and record why."""
    delay = max(0.0, record.next_attempt_at - home.clock.time())
    home.hold(record, delay)
    metrics.suspended(record.entity_type)
    lifecycle("run suspended", record.entity_type, record.key, record.run_id,
              attempts=record.attempts, retry_in=round(delay, 3))
    log.warning("%s %r run %d suspended (attempt %d; next in %.3fs); its messages are kept:"
                "\n%s", record.entity_type, record.key, record.run_id, record.attempts, delay,
                record.error)
    try:
        await home.store.suspend_run(home.fence, record)
    except StoreError as err:  # held all the same; describe() shows it once written
        log.warning("%s %r: the suspension was not recorded (%s)", record.entity_type,
                    record.key, err)


async def end_suspension(home: Residence, run_id: int) -> None:
    """The retried run got past the point: drop the record (retried while the store fails)."""
    home.release(run_id)
    lifecycle("run resumed", home.entity_type, home.key, run_id)
    store, fence, etype, key = home.store, home.fence, home.entity_type, home.key
    await retrying(home, run_id, "suspension",
                   lambda: store.clear_suspension(fence, etype, key, run_id))
