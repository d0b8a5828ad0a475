"""Per-type policies."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["IdReusePolicy", "RunStatus", "SnapshotPolicy"]


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

    @property
    def is_closed(self) -> bool:
        return self is not RunStatus.RUNNING


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    """When the host snapshots an entity's state, and how many snapshots it keeps.

    A snapshot is written in the same transaction as the applied-sequence watermark it
    covers; journal entries covered by the oldest kept snapshot are then deleted, so an
    entity's store rows stay bounded however many messages it receives.

    Attributes:
        every: snapshot after this many applied messages (None: never by count).
        keep: how many snapshots to keep (>= 1); older ones and the journal they cover go.
    """

    every: int | None = 1000
    keep: int = 2

    def __post_init__(self) -> None:
        if self.every is not None and self.every < 1:
            raise ValueError(f"SnapshotPolicy.every must be >= 1 or None, got {self.every}")
        if self.keep < 1:
            raise ValueError(f"SnapshotPolicy.keep must be >= 1, got {self.keep}")
