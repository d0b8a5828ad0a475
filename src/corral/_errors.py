"""The error hierarchy: every error corral raises on purpose derives from `CorralError`.

A leaf of the package (it imports nothing of corral): the programming model, the
store and the host all raise and catch these.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BatchRefusedError",
    "CorralError",
    "CorruptRowError",
    "DeadLetterNotFoundError",
    "DefinitionMismatchError",
    "DeploymentNotFoundError",
    "DuplicateStepError",
    "EntityClosedError",
    "EntityDefinitionError",
    "EntityFailedError",
    "EntityNotRunningError",
    "EntityOverloadedError",
    "EntityTerminatedError",
    "FailRun",
    "HandlerNotHostedError",
    "IdempotencyConflictError",
    "IncompatibleBuildError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "InvalidPayloadError",
    "LeaseLostError",
    "PayloadTooLargeError",
    "PickledSnapshotError",
    "QueryResultError",
    "QueryTimeoutError",
    "ScheduleExistsError",
    "ScheduleNotFoundError",
    "ShardCountError",
    "ShardMovedError",
    "SignalTimeoutError",
    "SnapshotCaptureError",
    "SnapshotRestoreError",
    "SnapshotVersionError",
    "StepFailedError",
    "StoreError",
    "StoreHostedElsewhereError",
    "StoreUnavailableError",
    "UnauthorizedError",
    "UnknownEntityTypeError",
    "UnknownHandlerError",
    "UpdateFailedError",
    "WaitTimeoutError",
]


class CorralError(Exception):
    """Base class of every error corral raises deliberately.

    Besides its message, an error carries what a program can act on, where it applies
    (None where it does not): the entity's `entity_type` and `key`, the `run_id` it is
    about, and the `message_id` (or update id) of the message concerned.

    Example:
        try:
            await ref.signal(Ticket.reply, reply, message_id=mid)
        except corral.EntityNotRunningError as err:
            log.info("%s %s is not running; starting it", err.entity_type, err.key)
    """

    def __init__(self, message: str = "", *, entity_type: str | None = None,
                 key: str | None = None, run_id: int | None = None,
                 message_id: str | None = None) -> None:
        super().__init__(message)
        self.entity_type = entity_type
        self.key = key
        self.run_id = run_id
        self.message_id = message_id

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the fields across pickling (the Ray backend carries errors between
        # processes): rebuild from the message, then restore the attributes.
        return (type(self), self.args, self.__dict__)


class EntityDefinitionError(CorralError, TypeError):
    """An `Entity` subclass or one of its handlers is declared wrongly.

    Raised when the class is defined, never at run time; the message says what to fix.
    """


class InvalidPayloadError(CorralError, ValueError):
    """A payload or start input failed validation at the client boundary.

    Raised before anything is stored: wrong model type, missing or unknown fields,
    values that are not JSON. Nothing was written.
    """


class PayloadTooLargeError(InvalidPayloadError):
    """A payload's canonical JSON is larger than the runtime's `max_payload_bytes`."""


class InvalidKeyError(CorralError, ValueError):
    """An entity key, message id, update id or sender is not a usable identifier.

    Empty, too long, not a str, or holding control characters, lone surrogates or (for
    entity keys) characters outside `Limits.key_pattern`; or a message, update or start
    id beginning as the ids corral derives do (`send:`, `replay:`). Nothing was written.
    """


class InvalidArgumentError(CorralError, ValueError):
    """An argument that is neither a payload nor an identifier is of the wrong type or
    out of range: a `limit`, a dead letter id, a `timeout`, a termination reason, an
    option of `open_runtime` that does not fit (`backend`, `shards`, `entities`), or a
    malformed PostgreSQL URL (`open_store`)."""


class ShardCountError(InvalidArgumentError):
    """A shard count that is not the store's: `open_runtime(..., shards=)` or
    `open_store(..., shards=)` naming another count than the one the store was created
    with (whether the store is given as a path, a URL or a `Store` object), or, as a
    last line of defence, a host asking a store for the lease of a shard past its count.
    Routing by another count would put one key on two shards, run by two hosts at once;
    nothing was opened, taken or stored. Pass the store's count (`store_shards`), or
    none with a `Store` object (the store's is used).
    """

    def __init__(self, message: str = "", *, store_shards: int = 0,
                 shards: int | None = None, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.store_shards = store_shards
        self.shards = shards  # the count asked for (None: a lease op saw only a shard)


class UnknownEntityTypeError(CorralError, LookupError):
    """The entity type was not registered with the runtime (`open_runtime(entities=...)`)."""


class UnknownHandlerError(CorralError, LookupError):
    """The entity type declares no signal, update or query of that name and kind."""


class UnauthorizedError(CorralError, PermissionError):
    """The runtime's `authorize` hook rejected the sender. Nothing was stored."""


class IdempotencyConflictError(CorralError):
    """A message id was reused with a different payload or sender.

    Same id and same payload is a harmless duplicate (answered `"duplicate"`); a changed
    payload under a known id is a caller bug, so it is refused loudly.
    """


class EntityNotRunningError(CorralError):
    """A plain `signal` or `update` reached an entity with no running run.

    Use `signal_with_start` / `update_with_start` to start it; a message never vanishes.
    """


class EntityOverloadedError(CorralError):
    """A signal would have taken the entity's backlog (messages accepted but not yet
    applied) past its type's `max_backlog`. Nothing was stored.

    Retryable: send the same message again (with the same message id) after about
    `retry_after` seconds. A sender that cannot wait declares `overflow = "dead_letter"`
    on the entity type instead, and such sends are kept as dead letters.

    Attributes:
        backlog: the backlog the store counted (accepted seq minus the applied
            watermark it knew, which may lag: see `Entity.max_backlog`).
        max_backlog: the type's bound.
        retry_after: a suggested delay in seconds before sending again.

    Example:
        try:
            await ref.signal_with_start(Ticket.reply, reply, start=start, message_id=mid)
        except corral.EntityOverloadedError as err:
            return Response(status_code=429, headers={"Retry-After": str(err.retry_after)})
    """

    retryable = True

    def __init__(self, message: str = "", *, backlog: int = 0, max_backlog: int = 0,
                 retry_after: float = 1.0, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.backlog = backlog
        self.max_backlog = max_backlog
        self.retry_after = retry_after


class BatchRefusedError(CorralError):
    """A batch of signals (`Runtime.signal_many`) was refused as a whole because of one
    item: nothing of the batch was stored (on Ray: nothing of that item's shard; see
    `signal_many`).

    Attributes:
        index: the refused item's position in the batch (0-based).
        error: that item's own error (also the `__cause__`): an `InvalidPayloadError`,
            `IdempotencyConflictError`, `EntityNotRunningError`, `EntityOverloadedError`...
            `entity_type`, `key` and `message_id` are the item's.

    Example:
        try:
            acks = await rt.signal_many(items)
        except corral.BatchRefusedError as err:
            log.warning("event %d refused: %s", err.index, err.error)
            acks = await rt.signal_many(items[:err.index] + items[err.index + 1:])
    """

    def __init__(self, message: str = "", *, index: int = 0,
                 error: CorralError | None = None, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.index = index
        self.error = error

    @classmethod
    def of(cls, index: int, error: CorralError) -> BatchRefusedError:
        """The batch's refusal for its item `index` refused with `error`."""
        return cls(f"item {index} of the batch was refused, so the batch was: "
                   f"{type(error).__name__}: {error}", index=index, error=error,
                   entity_type=error.entity_type, key=error.key, run_id=error.run_id,
                   message_id=error.message_id)


class EntityClosedError(CorralError):
    """`*_with_start` found the entity closed and its `IdReusePolicy` forbids a new run."""


class EntityFailedError(CorralError):
    """`result()` of a run whose `run()` raised; the message carries the error text."""


class FailRun(CorralError):
    """Raised by an entity's own code to fail its run for good.

    Any other exception escaping `run()` (or the building of an activation) suspends the
    run instead: it stays running, keeps accepting messages, and is retried under the
    class's `run_retry` until a fix is deployed. `FailRun` (or an exception type listed
    in the class's `fail_on`) closes the run as failed with the message as its error;
    `result()` then raises `EntityFailedError`.

    Example:
        async def run(self) -> Outcome:
            if self.budget < 0:
                raise corral.FailRun("budget exhausted")
    """


class EntityTerminatedError(CorralError):
    """`result()` of a run that was terminated; the message carries the reason."""


class UpdateFailedError(CorralError):
    """The update handler raised; the error text was recorded and is returned to every retry."""


class QueryResultError(CorralError):
    """A query handler's answer does not validate against its return annotation: the
    state it read holds a value of another type (an attribute without an annotation,
    restored from a snapshot as plain JSON, where the code kept a model). Raised by
    `EntityRef.query` (`corral query`, the dashboard's query form), naming the entity
    and the query; nothing changed. Annotate the attribute on the class (then a restore
    rebuilds the model), or return what the annotation says.
    """


class WaitTimeoutError(CorralError, TimeoutError):
    """`result(timeout=...)` or `update(..., timeout=...)` ran out of time.

    Nothing was lost: an update stays accepted and is applied; ask again (the same
    update id returns its recorded result) or wait longer. A `TimeoutError`, too.
    """


class QueryTimeoutError(WaitTimeoutError):
    """`query(..., timeout=...)` ran out of time before the entity had applied the
    messages this process had accepted for it (a query reads its own writes), or before
    its host answered: a handler is blocked, the entity is suspended, or its host is
    slow. Nothing changed; `waited` says how long it waited (seconds).

    Retryable: ask again (later, or with a longer timeout).
    """

    retryable = True

    def __init__(self, message: str = "", *, waited: float = 0.0, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.waited = waited


class SignalTimeoutError(CorralError, TimeoutError):
    """`wait_for_signal(..., timeout=...)` ran out of time: the boundary is closed for
    good in this run (waiting on it again raises again; a late `deliver` is `stale`)."""


class StepFailedError(CorralError):
    """`await self.step(...)` ran out of attempts: its function raised (or timed out)
    on every attempt its `retry` policy allows. Raised in `run()`.

    The failure is recorded like a result: after a restart the same step raises this
    again without calling its function. `step` is the step's name, `attempts` how many
    calls were made, `error` the last one's error text; `__cause__` is the last error
    itself when it was raised in this activation.
    """

    def __init__(self, message: str = "", *, step: str = "", attempts: int = 0, error: str = "",
                 **fields: Any) -> None:
        super().__init__(message, **fields)
        self.step = step
        self.attempts = attempts
        self.error = error


class DuplicateStepError(CorralError):
    """A step name was used twice by one activation before a `checkpoint()` covered the
    first: the second call would silently return the first one's recorded result.
    Raised in `run()`; give each step of a run its own name (`name=f"model:{n}"`)."""


class DefinitionMismatchError(CorralError):
    """A shard host runs a definition of an entity type this client cannot work with.

    Raised by the Ray backend before anything is accepted, when the detached shard
    actors run entity code that is neither a compatible successor of this client's nor
    a compatible predecessor of it (the rules of `corral builds`: a field's type
    changed, a required field added, an upgrade path missing), or another version of
    corral's calls; the message names the differences. `client_fingerprint` and
    `host_fingerprint` tell the two apart. The fix: `corral.runtime.stop_ray_hosts
    (namespace)`; the next call starts actors with the client's code, which recover
    every entity from the store. (A compatible new release rolls instead:
    `corral.runtime.roll_ray_hosts`.)
    """

    def __init__(self, message: str = "", *, client_fingerprint: str = "",
                 host_fingerprint: str = "", **fields: Any) -> None:
        super().__init__(message, **fields)
        self.client_fingerprint = client_fingerprint
        self.host_fingerprint = host_fingerprint


class ShardMovedError(CorralError):
    """The Ray host actor a call reached does not host the shard: a rolling deploy
    (`corral.runtime.roll_ray_hosts`), a rebalance or a drain moved it to the actor
    named `actor` ("" while the placer has not placed it again).

    Retryable, and retried by the Ray client itself (it re-routes the call to `actor`,
    a bounded number of times), so callers see it only if shards keep moving under one
    call. Nothing was accepted by the call that got it.
    """

    retryable = True

    def __init__(self, message: str = "", *, shard: int = -1, actor: str = "",
                 **fields: Any) -> None:
        super().__init__(message, **fields)
        self.shard = shard
        self.actor = actor


class HandlerNotHostedError(CorralError):
    """The Ray deployment has no handler of this name for the entity: its current
    release lacks it (a client of a newer build, before that build is deployed; or of
    a build rolled back), and the message names the release. Raised at once.

    While a roll to a release that has the handler is under way, the Ray client itself
    retries the call until the shard moves (for up to its `retry_timeout`), so callers
    see it only when the current release lacks the handler. Retryable; nothing was
    stored. Deploy the release that has the handler (`corral deploy`).
    """

    retryable = True


class ScheduleNotFoundError(CorralError, LookupError):
    """No schedule has this id (`rt.schedules.*`, `corral schedule ...`): it was never
    created or was deleted. `schedule_id` names it."""

    def __init__(self, message: str = "", *, schedule_id: str = "", **fields: Any) -> None:
        super().__init__(message, **fields)
        self.schedule_id = schedule_id


class ScheduleExistsError(CorralError):
    """`rt.schedules.create` for an id a schedule already has; unlike
    `ScheduleNotFoundError`, the schedule is there: update it, or delete it first."""

    def __init__(self, message: str = "", *, schedule_id: str = "", **fields: Any) -> None:
        super().__init__(message, **fields)
        self.schedule_id = schedule_id


class DeploymentNotFoundError(InvalidArgumentError, LookupError):
    """No Ray deployment of this namespace runs (or it has no release yet): a client
    (`open_runtime(backend="ray")`) never starts one. Declare a release first with
    `corral deploy --namespace NS --app pkg.module:APP --store URL`
    (`corral.runtime.deploy`), or open with `deploy=True` for a single-process start.
    """


class IncompatibleBuildError(CorralError):
    """`open_runtime` refused this process: its build of an entity type cannot run beside
    the newest build registered in the store (`corral builds` lists them).

    Raised before the process registers or hosts anything. The message names each
    incompatible difference and its fix (a handler removed while messages or senders of
    it remain, a required payload field added, a state version with no upgrade path);
    `differences` holds them one by one, `fingerprint` is this build's and
    `newest_fingerprint` the newest registered one's (of `entity_type`).
    """

    def __init__(self, message: str = "", *, differences: tuple[str, ...] = (),
                 fingerprint: str = "", newest_fingerprint: str = "",
                 **fields: Any) -> None:
        super().__init__(message, **fields)
        self.differences = differences
        self.fingerprint = fingerprint
        self.newest_fingerprint = newest_fingerprint


class StoreHostedElsewhereError(CorralError):
    """`open_runtime` (or a Ray host actor starting) refused to host a store that live
    hosts of another cluster host already: another Ray instance, or local hosts beside
    a Ray deployment. Two clusters' hosts would take the same shards' leases from each
    other (`LeaseLostError`, effects repeated), so the second is refused before it
    creates an actor or takes a lease; nothing is stored and the running deployment
    is untouched.

    `holder` describes the other cluster's host (its Ray GCS address and session, or
    "local host", with host name and pid), `cluster` is its identity (`ray:<session>`
    or `local`), `address` its Ray GCS address (None for local hosts), `expires_at`
    (epoch s) when its claim lapses unless renewed (a live host renews it). The message names
    the fix: join that Ray instance (`address=`/`RAY_ADDRESS`; `ray start --head` once
    and `address="auto"` in every process), or open the local process with
    `host=False` (a pure client).
    """

    def __init__(self, message: str = "", *, holder: str = "", cluster: str = "",
                 address: str | None = None, expires_at: float = 0.0,
                 **fields: Any) -> None:
        super().__init__(message, **fields)
        self.holder = holder
        self.cluster = cluster
        self.address = address
        self.expires_at = expires_at


class StoreError(CorralError):
    """The store failed (I/O, corruption, lock timeout). The operation was not committed."""


class StoreUnavailableError(StoreError):
    """The store could not be reached, or the connection was lost or timed out while
    serving the call (PostgreSQL restarted, a connection killed, the network down).

    Retryable: the store reconnects by itself, so the same call may simply be made
    again; a send retried with the same message id is answered `duplicate` if the first
    attempt did commit. `committed` is False when nothing can have been written and
    None when the commit itself was in flight (its outcome unknown).
    """

    retryable = True

    def __init__(self, message: str = "", *, committed: bool | None = False,
                 **fields: Any) -> None:
        super().__init__(message, **fields)
        self.committed = committed


class CorruptRowError(CorralError):
    """A row read from the store does not decode: stored JSON that does not parse (or is
    nested deeper than the parser reads), a value outside its column's domain (a run
    status, a journal entry's kind), a time or a number of another type, a snapshot
    that is not bytes, a build's manifest without its fields. No corral writes such a
    row: it was damaged or written by hand.

    Not a `StoreError`: the store answered, and asking again gives the same row, so
    nothing retries it. Raised by the reads of one entity (`describe`, `history`,
    `state`, `query`, `corral show`/`history`, the entity's page), naming it
    (`entity_type`, `key`, `run_id` where known) with `table` and `column`; a host
    that cannot read an entity's rows suspends its run with this error (visible in
    `describe().suspension` and `corral ls`), retried with backoff, never failed.
    Deployment-wide views never raise it for one row: listings leave the row out and
    name it in `Page.unreadable`, and a build whose manifest is unreadable is ignored
    by the compatibility check (with a warning) and listed as incompatible.
    Fix or delete the row (the message names it); nothing else changes.
    """

    def __init__(self, message: str = "", *, table: str = "", column: str = "",
                 **fields: Any) -> None:
        super().__init__(message, **fields)
        self.table = table
        self.column = column


class LeaseLostError(StoreError):
    """A shard host lost its lease (a newer epoch exists); its write was refused (fencing)."""


class SnapshotRestoreError(CorralError):
    """A stored snapshot could not be restored; the entity is not activated.

    Never a silent reset and never a failed run: the host leaves the entity unapplied
    and retries with backoff (messages are still accepted and journaled), and the
    snapshot stays in the store until a host with code that restores it comes.
    `applied_seq` is the journal seq the snapshot covers; `attribute` names the state
    attribute that does not validate against today's annotation, where one does.
    """

    def __init__(self, message: str = "", *, applied_seq: int | None = None,
                 attribute: str | None = None, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.applied_seq = applied_seq
        self.attribute = attribute


class SnapshotVersionError(SnapshotRestoreError):
    """The snapshot's `state_version` cannot be brought to this code's: it is newer (a
    rollback to older code) or an `@corral.upgrade` step is missing. Nothing is reset:
    deploy code with `state_version >= stored_version` (or add the hook from
    `missing_from`), and the entity carries on from where it was.
    """

    def __init__(self, message: str = "", *, stored_version: int = 0, code_version: int = 0,
                 missing_from: int | None = None, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.stored_version = stored_version
        self.code_version = code_version
        self.missing_from = missing_from


class PickledSnapshotError(SnapshotRestoreError):
    """The snapshot was written as a pickle by a corral release before snapshots were
    JSON. corral never unpickles what it reads from a store (a crafted row would run
    code), so it is refused as it is and left untouched in the store; the entity is
    not activated (retried with backoff, never failed, never reset). No converter ships
    yet: keep such a store on the release that wrote it.
    """


class SnapshotCaptureError(CorralError):
    """The entity's state cannot be written as JSON: `attribute` names what does not
    encode (a value its annotation refuses, or an unannotated attribute that is not
    plain JSON). Annotate it on the class (`inbox: list[Reply]`) with a pydantic model
    or JSON types. The previous snapshot stays the latest, so nothing is lost.
    """

    def __init__(self, message: str = "", *, attribute: str | None = None,
                 **fields: Any) -> None:
        super().__init__(message, **fields)
        self.attribute = attribute


class DeadLetterNotFoundError(CorralError, LookupError):
    """No dead letter with that id exists for the entity (discarded, or never there)."""
