"""The `Store` protocol: everything the runtime asks of durable storage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from corral.actors import RunStatus

from ._records import Acceptance, AcceptResult, JournalEntry, RunRecord, UpdateOutcome
from ._writes import Fence

__all__ = ["Store"]


class Store(Protocol):
    """Durable storage for runs, journals, dedupe windows, snapshots and shard leases.

    Acceptance (`accept`) is open to any process; the writes a shard host makes while
    applying (`record_update`, `close_run`) carry its `Fence` and are refused once a
    newer epoch holds the shard.
    """

    durable: bool

    async def accept(self, acc: Acceptance) -> AcceptResult:
        """Start the run if needed (per the id reuse policy), dedupe, append: one transaction.

        Returns only after commit. Raises `IdempotencyConflictError`,
        `EntityNotRunningError`, `EntityClosedError` or `StoreError`.
        """
        ...

    async def record_update(self, fence: Fence, etype: str, key: str, message_id: str,
                            outcome: UpdateOutcome) -> None: ...

    async def close_run(self, fence: Fence, etype: str, key: str, run_id: int, *,
                        applied_seq: int, status: RunStatus, result: str | None,
                        error: str | None) -> bool:
        """Close the run unless messages after `applied_seq` exist (then return False)."""
        ...

    async def acquire_leases(self, owner: str, shards: Sequence[int], ttl: float
                             ) -> dict[int, int]: ...
    async def renew_leases(self, owner: str, held: dict[int, int], ttl: float) -> set[int]: ...
    async def release_leases(self, owner: str) -> None: ...

    async def write_snapshot(self, fence: Fence, etype: str, key: str, run_id: int, *,
                             applied_seq: int, state: bytes, keep: int) -> int:
        """Store a snapshot, keep the newest `keep`, delete the journal they cover.

        Returns the number of journal entries deleted.
        """
        ...

    async def latest_snapshot(self, etype: str, key: str, run_id: int
                              ) -> tuple[int, bytes] | None: ...

    async def journal(self, etype: str, key: str, *, run_id: int, after_seq: int
                      ) -> list[JournalEntry]: ...
    async def journal_tail(self, after_pos: int, shards: frozenset[int], limit: int = ...
                           ) -> tuple[int, list[JournalEntry]]: ...
    async def journal_end(self) -> int: ...
    async def latest_run(self, etype: str, key: str) -> tuple[RunRecord, int] | None: ...
    async def runs(self, etype: str, key: str) -> list[RunRecord]: ...
    async def running_entities(self, shard: int) -> list[tuple[str, str]]: ...
    async def update_outcome(self, etype: str, key: str, message_id: str
                             ) -> UpdateOutcome | None: ...
    async def foreign_commit_seen(self) -> bool: ...
    async def close(self) -> None: ...
