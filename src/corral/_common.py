"""Run statuses and the per-type policies.

A leaf of the package (it imports nothing of corral): the programming model declares
these, the store records them and the host follows them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "DEFAULT_RUN_RETRY",
    "MAX_SHARDS",
    "PURGE_ROWS",
    "ContinueAsNewPolicy",
    "DedupeWindow",
    "IdReusePolicy",
    "Retention",
    "RetryPolicy",
    "RunStatus",
    "SnapshotPolicy",
    "WaitStatus",
]


class IdReusePolicy(enum.Enum):
    """What `*_with_start` does when the entity's latest run is closed.

    A running entity always just receives the message; the policy matters only after
    its run completed, failed or was terminated.
    """

    ALLOW_DUPLICATE = "allow_duplicate"
    """Start a new run (the default: the ticket was resolved, now it is reopened)."""
    ALLOW_DUPLICATE_FAILED_ONLY = "allow_duplicate_failed_only"
    """Start a new run only if the previous one failed or was terminated."""
    REJECT_DUPLICATE = "reject_duplicate"
    """Never start a second run: raise `EntityClosedError`."""

    def allows_after(self, status: RunStatus) -> bool:
        """Whether a new run may start after a run that closed with `status`."""
        if self is IdReusePolicy.ALLOW_DUPLICATE:
            return True
        if self is IdReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY:
            return status in (RunStatus.FAILED, RunStatus.TERMINATED)
        return False


class RunStatus(str, enum.Enum):
    """The state of one run of an entity."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TERMINATED = "terminated"
    CONTINUED = "continued"
    NEVER_STARTED = "never_started"
    """Only in `describe()` of an entity that has no run yet; never stored."""

    @property
    def is_closed(self) -> bool:
        """Whether a run with this status has ended."""
        return self not in (RunStatus.RUNNING, RunStatus.NEVER_STARTED)


class WaitStatus(str, enum.Enum):
    """The state of one durable signal wait (`Entity.wait_for_signal`) of one run."""

    BUFFERED = "buffered"
    """Delivered before `run()` reached the wait; it wins when `run()` gets there."""
    OPEN = "open"
    """`run()` is waiting; nothing was delivered yet."""
    DELIVERED = "delivered"
    """Closed by a delivery, whose payload `run()` gets (again after every restart)."""
    TIMED_OUT = "timed_out"
    """Closed by its timeout."""
    CLOSED = "closed"
    """Closed because its run ended (completed, failed, terminated, continued as new)."""
    RENAMED = "renamed"
    """An old name of a renamed wait (`corral.wait(..., renamed_from=...)`) in a run that
    reached the wait under today's name: a delivery by the old name is decided against
    today's wait. Never listed as an open wait."""

    @property
    def has_delivery(self) -> bool:
        return self in (WaitStatus.BUFFERED, WaitStatus.DELIVERED)


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    """When the host snapshots an entity's state, and how many snapshots it keeps.

    A snapshot is written in the same transaction as the applied-sequence watermark it
    covers; journal entries covered by the oldest kept snapshot are then deleted, so an
    entity's store rows stay bounded however many messages it receives.

    Attributes:
        every: snapshot after this many applied messages (None: never by count).
            Recovery replays the journal after the latest snapshot without snapshotting
            every `every` entries (they are durable already) and writes one at its end.
        keep: how many snapshots to keep (>= 1); older ones and the journal they cover go.
    """

    every: int | None = 1000
    keep: int = 2

    def __post_init__(self) -> None:
        if self.every is not None and self.every < 1:
            raise ValueError(f"SnapshotPolicy.every must be >= 1 or None, got {self.every}")
        if self.keep < 1:
            raise ValueError(f"SnapshotPolicy.keep must be >= 1, got {self.keep}")


@dataclass(frozen=True, slots=True)
class ContinueAsNewPolicy:
    """Thresholds at which `Entity.continue_as_new_suggested` becomes true.

    Any one crossed is enough; None disables that threshold.

    Attributes:
        max_signals: messages received by this run.
        max_journal_entries: entries of this run still in the journal (not yet covered
            by a kept snapshot).
        max_journal_bytes: payload bytes of this run's entries applied since the run's
            host activated it (a per-activation estimate of journal growth).
    """

    max_signals: int | None = 100_000
    max_journal_entries: int | None = 10_000
    max_journal_bytes: int | None = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How the host retries a signal whose handler raises, before dead-lettering it.

    The host calls the handler up to `max_attempts` times in all, sleeping
    `initial_backoff * multiplier ** (n - 1)` seconds (at most `max_backoff`) after the
    n-th failure; later messages of the entity wait, so order is kept. After the last
    attempt the message moves to the dead-letter table with the error and traceback
    text, counts as applied, and the entity goes on with the next message. Operators
    list, replay or discard dead letters (`EntityRef.dead_letters`,
    `replay_dead_letter`, `discard_dead_letter`). Update handlers are not retried:
    their caller receives `UpdateFailedError`.

    A retry runs on whatever state the failed attempt left, so check inputs before
    changing state. Right after dead-lettering, the host snapshots the entity (whatever
    its `SnapshotPolicy`), so recovery never applies the dead-lettered message again;
    replaying it is an operator's decision. A crash during the retries loses nothing:
    the message is retried from the first attempt after recovery.

    The same policy, as `run_retry`, paces the retries of a run whose `run()` raised or
    whose activation could not be built (the run is suspended, not failed; see
    `Entity.run_retry`): there `max_attempts=None`, the default, retries forever.

    Attributes:
        max_attempts: handler calls before the message is dead-lettered (>= 1); for
            `run_retry`, attempts before the run is failed (None: never).
        initial_backoff: seconds to wait after the first failure.
        max_backoff: the longest wait between two attempts.
        multiplier: growth of the wait from one attempt to the next (>= 1).

    Example:
        class Ticket(corral.Entity):
            retry = corral.RetryPolicy(max_attempts=5, initial_backoff=0.1)
    """

    max_attempts: int | None = 3
    initial_backoff: float = 0.05
    max_backoff: float = 5.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if self.max_attempts is not None and (
                isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int)
                or self.max_attempts < 1):
            raise ValueError(f"RetryPolicy.max_attempts must be an int >= 1 or None (retry "
                             f"forever), got {self.max_attempts!r}")
        for name in ("initial_backoff", "max_backoff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"RetryPolicy.{name} must be a number >= 0, got {value!r}")
        if isinstance(self.multiplier, bool) or not isinstance(self.multiplier, int | float) \
                or self.multiplier < 1:
            raise ValueError(f"RetryPolicy.multiplier must be a number >= 1, "
                             f"got {self.multiplier!r}")

    def backoff(self, failures: int) -> float:
        """Seconds to wait after the `failures`-th failed attempt (1 for the first)."""
        try:
            delay = self.initial_backoff * self.multiplier ** (max(failures, 1) - 1)
        except OverflowError:
            delay = self.max_backoff
        return float(min(delay, self.max_backoff))


DEFAULT_RUN_RETRY = RetryPolicy(max_attempts=None, initial_backoff=1.0, max_backoff=60.0,
                                multiplier=2.0)
"""`Entity.run_retry` by default: like Temporal's workflow-task retries, forever, 1 s
after the first failure, doubling up to a minute."""


@dataclass(frozen=True, slots=True)
class DedupeWindow:
    """How long message ids are remembered per entity for deduplication.

    An id is remembered while it is among the entity's last `max_count` applied
    messages AND younger than `max_age` seconds; None lifts that bound. The window lives
    in its own table: it survives snapshots, journal truncation and continue-as-new.
    Ids are forgotten only when the host snapshots the entity, and never before their
    message was applied.

    Example:
        class Cart(corral.Entity):
            dedupe_window = corral.DedupeWindow(max_count=10_000, max_age=7 * 86400)
    """

    max_count: int | None = 100_000
    max_age: float | None = 30 * 86400.0

    def __post_init__(self) -> None:
        if self.max_count is not None and self.max_count < 1:
            raise ValueError(f"DedupeWindow.max_count must be >= 1 or None, got {self.max_count}")
        if self.max_age is not None and self.max_age <= 0:
            raise ValueError(f"DedupeWindow.max_age must be > 0 or None, got {self.max_age}")


MAX_SHARDS = 4096
"""The most shards a store may have: shards are what moves between hosts, so a few per
host is enough (the Ray default of 256 serves ~25 hosts at 10 each); each is a lease, a
lock file on SQLite and a round of the housekeeping loop, so more only costs. A Ray
dedicated entity's pseudo-shard lies at least this far past the store's count, so a
lease asked for in between can only come from a router of another shard count."""

PURGE_ROWS = 10_000
"""Rows one retention transaction deletes at most, by default (`Retention.rows`)."""


@dataclass(frozen=True, slots=True)
class Retention:
    """How long an entity's closed run is kept before the hosts purge it.

    An entity whose latest run closed (completed, failed or terminated) more than
    `closed_for` seconds ago is purged with every row it has: its runs, journal, dedupe
    ids, snapshots, waits, timers and dead letters; so are the runs an entity left
    behind by continuing as new or being restarted, once closed that long (their
    dedupe ids stay until the dedupe window forgets them). A closed run with a send not
    delivered yet (`Entity.send`) is kept until it is. The hosts holding the
    entity's shard purge in the background, one transaction per type per round, which
    takes at most `batch` closed runs and deletes at most `rows` rows (a run with more,
    such as a full dedupe window, goes over several rounds), fenced by their leases.
    A signal-with-start to a purged key then starts run 1, as for a key never seen,
    whatever the `IdReusePolicy` (which decides only while the closed run is retained);
    a message id seen only by a purged run is not recognised as a duplicate any more.

    Example:
        class Cart(corral.Entity):
            retention = corral.Retention(closed_for=7 * 86400)
    """

    closed_for: float
    batch: int = 500
    rows: int = PURGE_ROWS

    def __post_init__(self) -> None:
        if isinstance(self.closed_for, bool) or not isinstance(self.closed_for, int | float) \
                or not self.closed_for > 0:
            raise ValueError(f"Retention.closed_for must be seconds > 0, got "
                             f"{self.closed_for!r}")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) \
                or not 1 <= self.batch <= 100_000:
            raise ValueError(f"Retention.batch must be an int in [1, 100000], got "
                             f"{self.batch!r}")
        if isinstance(self.rows, bool) or not isinstance(self.rows, int) \
                or not 2 <= self.rows <= 1_000_000:
            raise ValueError(f"Retention.rows must be an int in [2, 1000000], got "
                             f"{self.rows!r}")
