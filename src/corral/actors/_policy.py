"""Per-type policies."""

from __future__ import annotations

import enum

__all__ = ["IdReusePolicy", "RunStatus"]


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
