"""The `Store` protocol: everything the runtime asks of durable storage, by role.

`AcceptStore` is what any client process calls, `HostStore` what a shard host calls
(its writes fenced), `ReadStore` what operators and tools read; `Store` is all three
with the store's own lifecycle. Both engines implement `Store`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from corral._common import PURGE_ROWS, RunStatus

from ._backlog import ShardBacklog
from ._build_registry import BuildRegistry
from ._census import Census
from ._hosting import HostingRegistry
from ._ops_outbox import OutboxRow, Send
from ._ops_retention import Purged
from ._ops_steps import StepAttempts, StepRecord
from ._records import (
    Acceptance,
    AcceptResult,
    DeadLetter,
    DeliveryRequest,
    DeliveryResult,
    EntityDetails,
    EntityRecord,
    JournalEntry,
    MessageRecord,
    RunRecord,
    Suspension,
    TimerRecord,
    UnreadableRow,
    UpdateOutcome,
    WaitRecord,
)
from ._releases import ReleaseRegistry
from ._schedule_store import ScheduleStore
from ._txn import Fence
from ._waits import WaitPosition

__all__ = ["AcceptStore", "HostStore", "ReadStore", "Store"]


class AcceptStore(Protocol):
    """What any client process calls: acceptance, deliveries to signal waits, and an
    operator's replay or discard of a dead letter. Open to every process at once."""

    async def accept(self, acc: Acceptance) -> AcceptResult:
        """Start the run if needed (per the id reuse policy), dedupe, append: one transaction.

        Returns only after commit. Raises `IdempotencyConflictError`,
        `EntityNotRunningError`, `EntityClosedError` or `StoreError`.
        """
        ...

    async def accept_many(self, accs: Sequence[Acceptance]) -> list[AcceptResult | Exception]:
        """`accept` for each acceptance, in one group commit: each one's result, or the
        error refusing it (another's refusal never affects it)."""
        ...

    async def accept_all(self, accs: Sequence[Acceptance]) -> list[AcceptResult]:
        """Every acceptance, in order, in one transaction, or none: each one's result
        (duplicates answered as alone). Raises `BatchRefusedError` naming the first
        refused one (its own error as `error`); nothing of the batch was written."""
        ...

    async def deliver(self, req: DeliveryRequest) -> DeliveryResult:
        """Decide a delivery to a durable signal wait and record it, in one transaction
        (see `_waits`); a delivery that closes an open wait also appends the `DELIVER`
        entry that wakes the run. Raises `EntityNotRunningError`,
        `IdempotencyConflictError` or `StoreError`."""
        ...

    async def replay_dead_letter(self, etype: str, key: str, shard: int, dead_letter_id: int,
                                 *, accepted_at: float) -> AcceptResult:
        """Accept the dead letter's payload again as a new signal of the running run
        (message id `replay:<id>:<original id>`) and delete the dead letter, in one
        transaction. A replay retried after it succeeded is answered as a duplicate.

        Raises `DeadLetterNotFoundError`, `EntityNotRunningError` or `StoreError`.
        """
        ...

    async def discard_dead_letter(self, etype: str, key: str, dead_letter_id: int) -> bool:
        """Delete a dead letter; whether it existed."""
        ...


class HostStore(Protocol):
    """What a shard host calls: its writes (each carrying its `Fence`, refused once a
    newer epoch holds the shard), its leases, the reads it recovers and runs from,
    durable timers, and the wait for other processes' commits."""

    async def open_wait(self, fence: Fence, etype: str, key: str, run_id: int, name: str, *,
                        deadline: float | None, now: float,
                        aliases: tuple[str, ...] = ()) -> WaitRecord:
        """`run()` reached the wait: open it with `deadline` (kept from the first time it
        was opened) and arm its durable timer, or take its buffered delivery (fenced).
        `aliases` are the wait's old names: what this run holds under them is adopted,
        and later deliveries by them are decided against this wait (see `_waits`)."""
        ...

    async def expire_wait(self, fence: Fence, etype: str, key: str, run_id: int, name: str,
                          *, now: float) -> WaitRecord:
        """Time the wait out if it is still open and its deadline passed (fenced)."""
        ...

    async def record_update(self, fence: Fence, etype: str, key: str, message_id: str,
                            outcome: UpdateOutcome) -> None: ...

    async def close_run(self, fence: Fence, etype: str, key: str, run_id: int, *,
                        applied_seq: int, status: RunStatus, result: str | None,
                        error: str | None, force: bool = False,
                        pending: Sequence[JournalEntry] = (), sends: Sequence[Send] = (),
                        state: bytes | None = None) -> bool:
        """Close the run unless messages after `applied_seq` exist (then return False);
        with `force`, close it regardless (a run failed because it cannot activate).
        Its messages after `applied_seq` (with `force`) and the `pending` mailbox entries
        `run()` never took become dead letters of the run, its last `sends` go to its
        outbox, its `state` as of the close becomes its snapshot at `applied_seq` (None:
        its latest snapshot stays) and `applied_seq` its recorded progress, in the same
        transaction."""
        ...

    async def settle_run(self, fence: Fence, etype: str, key: str, run_id: int, *,
                         applied_seq: int | None, pending: Sequence[JournalEntry] = (),
                         failed_at: float) -> int:
        """Dead-letter what closed run `run_id` never applied: its messages after
        `applied_seq` (None: after its latest snapshot) and the `pending` mailbox
        entries, each with the reason; nothing for a running run. Returns the count."""
        ...

    async def acquire_leases(self, owner: str, shards: Sequence[int], ttl: float, *,
                             force: bool = False) -> dict[int, int]:
        """Take the free or expired `shards` (all of them with `force`); {shard: epoch}.

        `ttl` is the new lease's term, and on SQLite also the term another holder's
        lease must be seen unrenewed before it counts as expired (`_sightings`). A shard
        past the store's count (`shards`, but for Ray's dedicated pseudo-shards) is
        refused, `ShardCountError`, nothing taken and no lease row made."""
        ...

    async def renew_leases(self, owner: str, held: dict[int, int], ttl: float) -> set[int]: ...

    async def release_leases(self, owner: str) -> None: ...

    async def request_leases(self, requester: str, shards: Sequence[int], ttl: float
                             ) -> None:
        """Ask the holders of `shards` to hand them to `requester` (valid `ttl` seconds:
        renew it while waiting). See `_ops_handoff`."""
        ...

    async def lease_requests(self, owner: str) -> dict[int, str]:
        """The live requests for the shards `owner` holds, {shard: requester}."""
        ...

    async def live_hosts(self, owner: str) -> list[str]:
        """The other hosts alive to receive shards (registered as hosts, see
        `register_builds`), `owner` left out."""
        ...

    async def lease_offers(self, heir: str) -> set[int]:
        """The shards released to `heir` that it has not taken yet."""
        ...

    async def lease_holders(self) -> dict[int, str]:
        """{shard: owner} of the leases held now (not expired, not handed off)."""
        ...

    async def hand_off_leases(self, heirs: Mapping[Fence, str], ttl: float) -> set[int]:
        """Release each shard a fence holds to its heir, reserved for it for `ttl`
        seconds (the holder's writes are refused from now on), in one transaction; the
        shards handed (not those whose fence was stale)."""
        ...

    async def write_snapshot(self, fence: Fence, etype: str, key: str, run_id: int, *,
                             applied_seq: int, state: bytes, keep: int,
                             passivate: bool = False, forget_seq: int = 0,
                             forget_before: float = 0.0,
                             forget_steps: Sequence[str] = (),
                             sends: Sequence[Send] = ()) -> int:
        """Store a snapshot, keep the newest `keep`, delete the journal they cover.

        With `passivate`, also mark the entity as evicted from memory. Message ids of
        applied entries with seq <= `forget_seq` or accepted before `forget_before`
        leave the dedupe window; the run's step records named in `forget_steps` (a
        checkpoint covers them) are deleted; `sends` go to the outbox. One transaction.
        Returns the journal floor: entries up to it were deleted.
        """
        ...

    async def record_step(self, fence: Fence, etype: str, key: str, run_id: int,
                          record: StepRecord, *, sends: Sequence[Send] = (),
                          history: StepAttempts | None = None) -> None:
        """Record the outcome of a completed step of run `run_id`, and the `sends` made
        before it to the outbox, and its row in history (`history`) (fenced, one
        transaction); the first record of a name wins."""
        ...

    async def record_step_attempt(self, fence: Fence, etype: str, key: str,
                                  history: StepAttempts) -> None:
        """A step's attempt failed and another follows: write its row in history
        (`_ops_steps`; fenced)."""
        ...

    async def mark_sent(self, fence: Fence, etype: str, key: str, run_id: int, *,
                        upto: int, errors: Sequence[tuple[int, str]] = ()) -> None:
        """The run's sends up to seq `upto` reached their targets (`errors`: those
        refused, by seq, kept with the reason); fenced."""
        ...

    async def pending_sends(self, etype: str, key: str, run_id: int, *,
                            limit: int) -> list[OutboxRow]:
        """The run's first `limit` sends not delivered yet, in order."""
        ...

    async def pending_senders(self, shard: int) -> list[tuple[str, str, int]]:
        """The runs of `shard` with sends not delivered yet."""
        ...

    async def last_send(self, etype: str, key: str, run_id: int) -> int:
        """The number of the run's last written send (0: none yet)."""
        ...

    async def steps(self, etype: str, key: str, run_id: int) -> dict[str, StepRecord]:
        """The recorded steps of run `run_id`, by name."""
        ...

    async def continue_as_new(self, fence: Fence, etype: str, key: str, run_id: int, *,
                              applied_seq: int, next_input: str,
                              carried: Sequence[JournalEntry],
                              sends: Sequence[Send] = ()) -> int:
        """Close run `run_id` as continued (its last `sends` to its outbox) and open the
        next in one transaction.

        Returns the new run id; raises `EntityNotRunningError` if the run closed first.
        """
        ...

    async def mark_activated(self, fence: Fence, etype: str, key: str) -> list[str]:
        """The entity is in memory again (no longer passivated); the ids of its durable
        timers, which stay until the activation replaces them (`set_timer`)."""
        ...

    async def set_timer(self, fence: Fence, etype: str, key: str, run_id: int,
                        timer_id: str, due_at: float | None, *,
                        replacing: Sequence[str] = ()) -> None:
        """Set (`due_at` given) or clear one durable timer, and clear the timers in
        `replacing` (an earlier activation's), in one transaction (fenced)."""
        ...

    async def due_timers(self, shards: frozenset[int], now: float) -> list[tuple[str, str]]: ...

    async def next_timer(self, shards: frozenset[int]) -> float | None:
        """When the earliest durable timer of `shards` is due (None: no timer)."""
        ...

    async def latest_snapshot(self, etype: str, key: str, run_id: int
                              ) -> tuple[int, bytes] | None: ...

    async def journal(self, etype: str, key: str, *, run_id: int, after_seq: int,
                      limit: int | None = None) -> list[JournalEntry]:
        """The run's journal entries after `after_seq`, in order (at most `limit`)."""
        ...

    async def journal_tail(self, after_pos: int, shards: frozenset[int], limit: int = ...
                           ) -> tuple[int, list[JournalEntry]]:
        """Entries of `shards` committed after `after_pos`, and the new position. A
        store may leave out those it committed itself (its process had them then)."""
        ...

    async def journal_end(self) -> int: ...

    async def latest_run(self, etype: str, key: str) -> tuple[RunRecord, int] | None: ...

    async def running_entities(self, shards: Sequence[int]
                               ) -> dict[int, list[tuple[str, str]]]:
        """Running entities of `shards` to activate on recovery (not the passivated ones
        with nothing new to apply), by shard (every one of `shards` a key): (type, key)
        each. One read: a seek per shard."""
        ...

    async def urgent_entities(self, shards: Sequence[int], now: float
                              ) -> dict[int, list[tuple[str, str]]]:
        """Those of `running_entities` that are urgent, by shard likewise: a backlog, a
        durable timer due at `now` or a step recorded (see `_reads.URGENT`). A recovery
        reads them first: few rows, however many entities are running."""
        ...

    async def count_running(self, shard: int) -> int:
        """Entities of `shard` whose run is running, passivated ones included."""
        ...

    async def wait_foreign_commit(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for another process to commit entries for this
        store's shards; whether one did (or may have: a safety-net poll says yes).
        PostgreSQL wakes at once on NOTIFY; SQLite sleeps and checks."""
        ...

    async def record_dead_letter(self, fence: Fence, entry: JournalEntry, *, error: str,
                                 traceback: str, attempts: int, failed_at: float) -> int:
        """Record a signal whose handler kept raising (fenced; idempotent per run and seq).

        Returns the dead letter's id.
        """
        ...

    async def dead_letter_seqs(self, etype: str, key: str, run_id: int) -> frozenset[int]: ...

    async def record_progress(self, fence: Fence,
                              rows: Sequence[tuple[str, str, int, int]], *, at: float,
                              backlog: ShardBacklog | None = None) -> None:
        """Record (etype, key, applied seq, mailbox depth) of entities of the fence's
        shard, as of `at` (fenced); a watermark below the recorded one is left out, so
        progress never moves back (see `_progress`). `backlog`: the holder's summary
        of the shard's backlog, when it changed (None: unchanged; see `_backlog`)."""
    async def purge_closed(self, etype: str, closed_before: float, *, limit: int,
                           fences: Sequence[Fence] = (), rows: int = PURGE_ROWS) -> Purged:
        """Retention: purge at most `limit` runs of `etype` closed before
        `closed_before`, with their rows, in one transaction that deletes at most `rows`
        rows (a run with more goes over several calls; see `_ops_retention`).
        With `fences` (a host's) only those shards' entities, refused with
        `LeaseLostError` once one is not current; without (an operator's) every shard."""
        ...

    async def purgeable(self, etype: str, closed_before: float) -> Purged:
        """What `purge_closed` would purge of `etype`, without a limit (a dry run)."""
        ...

    async def suspend_run(self, fence: Fence, record: Suspension) -> None:
        """Record that the run is suspended (its `run()` raised, or its activation could
        not be built), replacing the entity's earlier record (fenced)."""
        ...

    async def clear_suspension(self, fence: Fence, etype: str, key: str, run_id: int
                               ) -> None:
        """The run got past the point that suspended it: drop its record (fenced)."""
        ...

    async def suspensions(self, shards: Sequence[int]) -> dict[int, list[Suspension]]:
        """The suspended running runs of `shards`, by shard (every one of `shards` a
        key), in one read: a host taking them continues their count."""
        ...


class ReadStore(Protocol):
    """What operators and tools read: listings, one entity's details, runs, update
    outcomes, dead letters and the census."""

    async def signal_waits(self, etype: str | None, *, limit: int,
                           after: WaitPosition | None = None) -> list[WaitRecord]:
        """Open waits (of one type, or all), oldest first, after position `after`."""
        ...

    async def entities(self, etype: str | None, status: RunStatus | None, *, limit: int,
                       after: tuple[str, str] | None = None, key_prefix: str | None = None
                       ) -> list[EntityRecord | UnreadableRow]:
        """Entities in (type, key) order after `after`, optionally of one type and/or
        status; indexed, so a page costs the same in a store of any size. `key_prefix`
        keeps only keys that start with it (a filter on that walk)."""
        ...

    async def messages(self, etype: str, key: str, *, after_seq: int = 0, limit: int = 100
                       ) -> list[MessageRecord]:
        """The entity's messages with a seq above `after_seq`, oldest first: each with
        what the journal, the dedupe window and the dead letters still keep of it."""
        ...

    async def step_history(self, etype: str, key: str, *, limit: int
                           ) -> list[StepAttempts]:
        """The entity's newest `limit` steps in history, oldest first (by run, then
        first start; see `_ops_steps`)."""
        ...

    async def timers(self, etype: str, key: str) -> list[TimerRecord]:
        """The entity's pending durable timers, the earliest due first."""
        ...

    async def waits(self, etype: str, key: str) -> list[WaitRecord]:
        """Every signal wait of the entity's retained runs, by run and name."""
        ...

    async def replayed_to(self, dead_letter_id: int) -> tuple[str, str] | None:
        """The entity (type, key) that dead letter `dead_letter_id` was replayed to,
        while the replay is in its dedupe window; None otherwise."""
        ...

    async def entity_details(self, etype: str, key: str, run_id: int) -> EntityDetails:
        """The run's latest snapshot, the entity's pending timers, the run's signal
        waits and the entity's dead-letter count."""
        ...

    async def runs(self, etype: str, key: str) -> list[RunRecord]: ...

    async def census(self) -> Census:
        """The deployment's numbers for a metrics scrape, aggregated in SQL (see
        `_census`)."""
        ...

    async def update_outcome(self, etype: str, key: str, message_id: str
                             ) -> UpdateOutcome | None: ...

    async def dead_letters(self, etype: str | None = None, key: str | None = None, *,
                           limit: int = 100, after: int = 0) -> list[DeadLetter]: ...


class Store(AcceptStore, HostStore, ReadStore, BuildRegistry, HostingRegistry,
            ReleaseRegistry, ScheduleStore, Protocol):
    """Durable storage for runs, journals, dedupe windows, snapshots and shard leases.

    Acceptance (`accept`) is open to any process; the writes a shard host makes while
    applying (`record_update`, `close_run`) carry its `Fence` and are refused once a
    newer epoch holds the shard.
    """

    durable: bool
    shards: int  # the shard count the store was created with (checked at open)

    @property
    def idle(self) -> bool:
        """No write is queued or committing (`corral.testing` waits for this)."""
        ...

    @property
    def commits(self) -> int:
        """Transactions the writer committed (one per batch when all goes well)."""
        ...

    @property
    def ops_committed(self) -> int:
        """Write ops those transactions carried (`commits` apart: the mean batch)."""
        ...

    async def close(self) -> None: ...
