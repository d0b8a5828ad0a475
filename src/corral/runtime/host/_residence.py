"""`Residence`: one entity's place in its shard, the only seam between an `Activation`
and the shard that hosts it.

The shard implements it (`_shard.ShardResidence`, one per activation), bound once to
the entity's definition and key and to the shard's fence; the activation and what it
is made of (`_run_context`, `_signal_waits`, `_suspension`, `_recovery`) see nothing
else of the host (temporalio's `_Runtime` in `workflow/_context.py` is the model). This
module is a leaf of the runtime: it names the activation only as `object`, so nothing
here imports `_activation` or `_shard`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from corral._errors import CorralError, LeaseLostError, StoreError
from corral.actors import EntityDefinition
from corral.persistence import Fence, JournalEntry, Store, Suspension, UpdateOutcome

from .._clock import Clock

__all__ = ["HeldRun", "Residence", "retrying"]

log = logging.getLogger("corral.activation")
T = TypeVar("T")


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


class Residence(Protocol):
    """What the shard provides one resident entity, whichever activation holds it.

    `store` and `fence`: the host-writes role (every write is fenced by the shard's
    lease) and the reads a recovery needs. Everything else is the shard's own state:
    routing entries, holding suspended runs, the callers waiting on updates.
    """

    @property
    def definition(self) -> EntityDefinition: ...
    @property
    def entity_type(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def store(self) -> Store: ...
    @property
    def fence(self) -> Fence: ...
    @property
    def clock(self) -> Clock: ...

    # -- routing ---------------------------------------------------------------------------

    def route(self, entry: JournalEntry) -> None:
        """Hand an entry to whichever activation of the entity the shard holds now."""
        ...

    def route_to_successor(self, act: object, entry: JournalEntry) -> None:
        """`act` met an entry of a newer run: the newer run gets its own activation."""
        ...

    def activate(self) -> None:
        """Bring the entity into memory again (the next run after continue-as-new)."""
        ...

    def activate_later(self, delay: float) -> None:
        """Activate the entity after `delay` seconds unless it is in memory by then."""
        ...

    def forget(self, act: object) -> None:
        """`act` finished: the shard drops it, unless a successor replaced it already."""
        ...

    def post(self, run_id: int) -> None:
        """Deliver the sends run `run_id` wrote to its outbox (after their commit)."""
        ...

    # -- suspended runs --------------------------------------------------------------------

    def suspended(self) -> HeldRun | None:
        """The entity's suspended run, if it has one (waiting, or being retried)."""
        ...

    def hold(self, record: Suspension, delay: float) -> None:
        """Keep the (evicted) entity out of memory for `delay` seconds, then retry it."""
        ...

    def release(self, run_id: int) -> None:
        """Forget the suspension of run `run_id` (or an older one)."""
        ...

    # -- what applying entries leaves behind -------------------------------------------------

    async def record_update(self, entry: JournalEntry, outcome: UpdateOutcome, *,
                            replaying: bool) -> None:
        """Record an update's outcome (the first recorded one wins on a replay) and
        answer the callers waiting on it here."""
        ...

    async def record_dead_letter(self, entry: JournalEntry, *, error: str, traceback: str,
                                 attempts: int) -> None:
        """Move `entry` to the dead letters (fenced) and remember its seq for replays."""
        ...

    async def dead_letter_seqs(self, run_id: int) -> frozenset[int]:
        """The seqs of run `run_id` with a dead letter (read once per lease epoch)."""
        ...

    def fail_waiters(self, run_id: int, error: type[CorralError], message: str) -> None:
        """Fail every update waiting on the entity, each with its own `error`."""
        ...


async def retrying(home: Residence, run_id: int, what: str,
                   call: Callable[[], Awaitable[T]]) -> T:
    """A store call `run()` made through the context (a timer, a snapshot, a signal
    wait), repeated with the type's backoff while the store fails: an outage or a full
    disk never reaches `run()`, which waits it out where it is. A lost lease does reach
    it (the next holder runs `run()` again); a closing host cancels the wait."""
    failures = 0
    while True:
        try:
            return await call()
        except LeaseLostError:
            raise
        except StoreError as err:
            failures += 1
            delay = home.definition.retry.backoff(failures)
            log.warning("%s %r run %d: %s failed (%s); run() waits, retrying in %.3fs",
                        home.entity_type, home.key, run_id, what, err, delay)
            await asyncio.sleep(delay)
