"""Durable signal waits: what a delivery, `run()` reaching a wait, and a timeout decide.

Pure functions over the rows a store read (under its locks): both stores call them,
so SQLite and PostgreSQL decide exactly alike and differ only in how they read and
write. A wait row is per (entity, run, name) and retains one delivery at most, the
winner's; losers change nothing. The transitions:

    (none) --deliver, early_signals="buffer"--> buffered --run() reaches it--> delivered
    (none) --run() reaches it--> open --deliver--> delivered
                                 open --deadline passes--> timed_out
    buffered, open --the run ends (any way, continue-as-new included)--> closed
    buffered --the run continues as new--> its delivery buffered in the next run too

A buffered delivery is carried into the next run the way continue-as-new carries
signals that were accepted but not consumed: run N+1's wait of that name receives it.
A buffered delivery whose run ends otherwise (completed, failed, terminated) was never
used: its retry is answered `stale`, not `duplicate`, and no `stale` answer carries a
payload.

A delivery after an open wait's deadline is `stale` and times the wait out, whether
or not its host has done so yet (it may be down, or passivated with its timer not yet
due). The store judges that on its own clock, `now`, never on the caller's (which may
be another machine's, hours off): PostgreSQL on the database server's clock, as it
judges leases, SQLite on the machine's (virtual under `corral.testing`). A deadline is
set on the host's clock when `run()` reaches the wait, like every durable timer, so
hosts are expected to keep their clocks in step with the store's.

A delivery's key is checked first against every retained wait of that name (this
run's and the previous run's, see `close_waits`), so a retry that arrives after the
entity moved on to its next run is still a `duplicate`, never a second delivery.

A renamed wait (`corral.wait(..., renamed_from=...)`) is opened with its old names
(`aliases`). In the same transaction the open adopts what a process on the old code
left under an old name in this run (a buffered delivery, which then wins; or the wait
itself, opened, delivered or timed out under the old name, with its deadline) and
leaves one `renamed` row per old name, whose `payload` column holds today's name. A
later delivery by an old name is decided against today's wait (`wait_name`), so one
delivery wins across both names, and its `DELIVER` entry carries today's name:

    (none), buffered, open, delivered, timed_out under an old name
        --run() reaches the wait under today's name--> renamed (its state adopted)

One of three modules named for waits, one per layer: this is the store's side; the
declaration on the class is `corral.actors._waits`, and the operator's `corral waits`
and `corral deliver` are `corral._cli._waits`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from corral._common import RunStatus, WaitStatus
from corral._errors import EntityNotRunningError, IdempotencyConflictError

from ._records import DeliveryRequest, WaitRecord
from ._rows import Row
from ._txn import EntityRow

__all__ = [
    "WAIT_COLUMNS",
    "Decision",
    "WaitPosition",
    "decide_delivery",
    "decide_expiry",
    "decide_open",
    "delivery_message_id",
    "delivery_run",
    "timer_id",
    "under_old_name",
    "wait_from_row",
    "wait_name",
]

WaitPosition = tuple[float, str, str, int, str]
"""Where a listing of open waits goes on: (opened_at, etype, key, run_id, name)."""

WAIT_COLUMNS = ("etype, key, run_id, name, status, opened_at, deadline, delivery_key, "
                "payload, sender, delivered_at")
"""The `signal_waits` columns `wait_from_row` reads, in order."""


def wait_from_row(r: Sequence[Any]) -> WaitRecord:
    """A `WaitRecord` from a row of `WAIT_COLUMNS` (`CorruptRowError` if it does not
    decode)."""
    row = Row("signal_waits", r[0], r[1], r[2], what=f"wait {r[3]!r}")
    return WaitRecord(r[0], r[1], r[2], r[3], row.enum("status", WaitStatus, r[4]),
                      row.maybe_seconds("opened_at", r[5]),
                      row.maybe_seconds("deadline", r[6]), r[7], r[8], r[9],
                      row.maybe_seconds("delivered_at", r[10]))


def timer_id(name: str) -> str:
    """The durable timer of an open wait (`sleep`'s timers are `<run>.<seq>.<n>`)."""
    return f"wait:{name}"


def delivery_message_id(run_id: int, name: str, delivery_key: str) -> str:
    """The journal message id of the entry that wakes a run with its delivery.

    It starts with a control character, which no caller's message id may hold, so it
    never meets a signal's id in the dedupe window."""
    return f"\x1ddeliver\x1d{run_id}\x1d{name}\x1d{delivery_key}"


def delivery_run(message_id: str) -> int:
    """The run a `DELIVER` entry's delivery was for (continue-as-new may carry the
    entry into the next run, whose wait of the same name it did not close)."""
    return int(message_id.split("\x1d", 3)[2])


@dataclass(frozen=True, slots=True)
class Decision:
    """What to answer and what to write.

    `wait` is the wait as it stands afterwards; `write` says it must be stored;
    `wake` that a `DELIVER` journal entry must be appended for the waiting run.
    """

    status: str
    wait: WaitRecord | None
    write: bool = False
    wake: bool = False
    aliases: tuple[WaitRecord, ...] = ()
    """`renamed` rows of the wait's old names, to store with it (see `decide_open`)."""


def wait_name(name: str, found: WaitRecord | None) -> str:
    """The name a delivery to wait `name` is decided under: today's name, when `found`
    (this run's row of `name`) is an old name's `renamed` row; else `name` itself.

    Example:
        wait_name("decision", alias_row) == "approval"
    """
    if found is not None and found.status is WaitStatus.RENAMED and found.payload:
        return found.payload
    return name


def under_old_name(found: Sequence[WaitRecord | None]) -> WaitRecord | None:
    """Of this run's rows under a wait's old names (`DeliveryRequest.aliases`, in
    order), the wait the old code opened or buffered a delivery into, if any: a
    delivery from the new code is decided against it, so that one delivery wins across
    both names before the new code's `run()` reopens the wait under its new name."""
    return next((w for w in found if w is not None and w.status is not WaitStatus.RENAMED),
                None)


def decide_delivery(req: DeliveryRequest, row: EntityRow | None, target: WaitRecord | None,
                    keyed: WaitRecord | None, *, now: float) -> Decision:
    """Decide a delivery.

    `row` is the entity's (locked) row; `target` the wait `req.name` of the run the
    delivery addresses; `keyed` a retained wait of that name whose delivery has
    `req.delivery_key` (any retained run), if there is one; `now` the store's clock
    (what a deadline is judged by, and when a kept delivery was made).

    Raises `EntityNotRunningError` (no run, or the addressed run ended without ever
    reaching or buffering this wait) or `IdempotencyConflictError` (the key was used
    with another payload or sender).
    """
    ident: dict[str, Any] = {"entity_type": req.entity_type, "key": req.key,
                             "message_id": req.delivery_key}
    if row is None:
        raise EntityNotRunningError(
            f"{req.entity_type} {req.key!r} was never started; nothing waits for "
            f"{req.name!r}", **ident)
    run_id = row.run_id if req.run_id is None else req.run_id
    if not 1 <= run_id <= row.run_id:
        raise EntityNotRunningError(
            f"{req.entity_type} {req.key!r} has no run {run_id} (its latest is {row.run_id})",
            run_id=row.run_id, **ident)
    if keyed is not None:
        if keyed.payload != req.payload:
            raise IdempotencyConflictError(
                f"delivery key {req.delivery_key!r} of wait {req.name!r} was delivered "
                "before with a different payload", run_id=keyed.run_id, **ident)
        if keyed.sender != req.sender:
            raise IdempotencyConflictError(
                f"delivery key {req.delivery_key!r} of wait {req.name!r} was delivered "
                f"before by sender {keyed.sender!r}, not {req.sender!r}",
                run_id=keyed.run_id, **ident)
        if keyed.status is WaitStatus.CLOSED:  # buffered, and its run ended before waiting
            return Decision("stale", _unused(keyed))
        return Decision("duplicate", keyed)
    running = row.status is RunStatus.RUNNING and run_id == row.run_id
    if target is not None:
        if target.status.has_delivery:
            return Decision("already_delivered", target)
        if target.status is WaitStatus.OPEN and running and target.deadline is not None \
                and now >= target.deadline:  # its host has not timed it out yet
            return Decision("stale", replace(target, status=WaitStatus.TIMED_OUT), write=True)
        if target.status is WaitStatus.OPEN and running:
            won = replace(target, status=WaitStatus.DELIVERED, delivery_key=req.delivery_key,
                          payload=req.payload, sender=req.sender, delivered_at=now)
            return Decision("delivered", won, write=True, wake=True)
        return Decision("stale", _unused(target))  # timed out, or its run ended
    if run_id != row.run_id:
        return Decision("stale", None)  # an earlier run, ended (its waits may be pruned)
    if not running:
        raise EntityNotRunningError(
            f"{req.entity_type} {req.key!r} is {row.status.value}; nothing waits for "
            f"{req.name!r}", run_id=row.run_id, **ident)
    if req.early == "reject":
        return Decision("not_waiting", None)
    buffered = WaitRecord(req.entity_type, req.key, run_id, req.name, WaitStatus.BUFFERED,
                          delivery_key=req.delivery_key, payload=req.payload,
                          sender=req.sender, delivered_at=now)
    return Decision("buffered", buffered, write=True)


def _unused(wait: WaitRecord) -> WaitRecord:
    """A closed wait as a `stale` answer shows it: without the delivery it may keep (one
    buffered before its run ended), which was never used."""
    return replace(wait, delivery_key=None, payload=None, sender=None, delivered_at=None)


def decide_open(row: EntityRow | None, wait: WaitRecord | None, etype: str, key: str,
                run_id: int, name: str, *, deadline: float | None, now: float,
                olds: Sequence[WaitRecord] = (), aliases: Sequence[str] = ()) -> Decision:
    """`run()` reached the wait: open it (with its deadline, kept from the first time),
    or take the buffered delivery. Status "closed" if the run is no longer running.

    `aliases` are the wait's old names and `olds` this run's rows under them. Without a
    row of today's name, the wait adopts an old name's row (one holding a delivery
    first): a delivery buffered by a process on the old code wins, and a wait that code
    opened keeps its deadline. Every old name not yet one becomes a `renamed` row
    (`Decision.aliases`) pointing here."""
    if row is None or row.run_id != run_id or row.status is not RunStatus.RUNNING:
        return Decision("closed", wait or WaitRecord(etype, key, run_id, name,
                                                     WaitStatus.CLOSED))
    kept = [o for o in olds if o.status is not WaitStatus.RENAMED]
    adopted = wait is None and bool(kept)
    if wait is None and kept:
        chosen = next((o for o in kept if o.status.has_delivery), kept[0])
        wait = replace(chosen, name=name)
    done = {o.name for o in olds if o.status is WaitStatus.RENAMED and o.payload == name}
    renamed = tuple(WaitRecord(etype, key, run_id, old, WaitStatus.RENAMED, payload=name)
                    for old in aliases if old not in done)
    d = _open(wait, etype, key, run_id, name, deadline=deadline, now=now)
    return replace(d, write=d.write or adopted, aliases=renamed)


def _open(wait: WaitRecord | None, etype: str, key: str, run_id: int, name: str, *,
          deadline: float | None, now: float) -> Decision:
    if wait is None:
        return Decision("open", WaitRecord(etype, key, run_id, name, WaitStatus.OPEN,
                                           opened_at=now, deadline=deadline), write=True)
    if wait.status is WaitStatus.BUFFERED:
        return Decision("delivered", replace(wait, status=WaitStatus.DELIVERED, opened_at=now),
                        write=True)
    return Decision(wait.status.value, wait)


def decide_expiry(wait: WaitRecord | None, *, now: float) -> Decision:
    """The wait's deadline seems to have passed: time it out if it is still open."""
    if wait is not None and wait.status is WaitStatus.OPEN and wait.deadline is not None \
            and wait.deadline <= now:
        return Decision("timed_out", replace(wait, status=WaitStatus.TIMED_OUT), write=True)
    return Decision("unchanged", wait)
