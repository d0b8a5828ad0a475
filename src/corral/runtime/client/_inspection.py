"""What operators read of one entity beyond `describe()`: its history and its state.

`EntityRef.history()` lists the entity's runs, its messages (each accepted, applied or
dead-lettered, with ids, senders and times), its signal waits, its timers and its
durable steps (attempts, outcome, where they ran);
`EntityRef.state()` shows the latest snapshot's state as JSON data and the messages
accepted after it, with their payloads. Both read the store (`Store.messages`,
`timers`, `waits`, `latest_snapshot`, `journal`) and never activate the entity; what
the store no longer keeps (a message's payload once a snapshot covers it) is None.

A message counts as applied when its run has closed, or when its seq is at or below the
applied watermark known: the latest snapshot's, and the live activation's when the
answering process hosts the entity, else the progress its host records in the store
(`Progress`, at most about a second behind).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from corral._common import RunStatus, WaitStatus
from corral.persistence import (
    STEP_HISTORY_PER_RUN,
    JournalEntry,
    MessageRecord,
    Row,
    RunRecord,
    StepAttempts,
    StepStatus,
    Store,
    TimerRecord,
    WaitRecord,
)

from ._results import Page, RunSummary

__all__ = ["EntityHistory", "EntityState", "MessageInfo", "MessageStatus", "StepInfo",
           "TimerInfo", "WaitSummary", "read_history", "read_state"]

MessageStatus = Literal["accepted", "applied", "dead_lettered"]


@dataclass(frozen=True, slots=True)
class MessageInfo:
    """One message of an entity, as `history()` and `state()` list it.

    Attributes:
        seq, run_id: its position in the entity's journal, and its run.
        message_id, sender: its idempotency key and the recorded sender.
        accepted_at: when it was accepted (None: only its dead letter is left).
        status: "accepted" (not applied yet), "applied", or "dead_lettered".
        kind, name, payload: the entry's kind ("signal", "update", "start", ...),
            handler name and payload (JSON data), while the store keeps them; None once
            a snapshot covers the message.
        dead_letter_id, error: its dead letter (replay or discard it by this id).

    Not `corral.persistence.MessageRecord`, the stored row it is built from (`of`): a
    reader gets the payload as JSON data and the kind as text, and a `status` the store
    does not keep (decided against the applied watermark); the dead letter's
    `failed_at` is `dead_letters()`'s to show.
    """

    seq: int
    run_id: int
    message_id: str
    sender: str | None
    accepted_at: float | None
    status: MessageStatus
    kind: str | None = None
    name: str | None = None
    payload: Any = None
    dead_letter_id: int | None = None
    error: str | None = None

    @classmethod
    def of(cls, entity_type: str, key: str, m: MessageRecord | JournalEntry,
           status: MessageStatus) -> MessageInfo:
        """The message `m` (a stored message, or a journal entry: no dead letter) of the
        entity `entity_type` `key` (`CorruptRowError` if its payload is not JSON)."""
        letter, error = (m.dead_letter_id, m.error) if isinstance(m, MessageRecord) \
            else (None, None)
        row = Row("journal", entity_type, key, m.run_id, what=f"seq {m.seq}") \
            if letter is None else \
            Row("dead_letters", entity_type, key, m.run_id, what=f"dead letter {letter}")
        return cls(m.seq, m.run_id, m.message_id, m.sender, m.accepted_at, status,
                   None if m.kind is None else m.kind.value, m.name,
                   row.json("payload", m.payload), letter, error)


@dataclass(frozen=True, slots=True)
class TimerInfo:
    """A pending durable timer: `sleep`, `wait_for(timeout=)`, a wait's deadline.

    Built from the stored `corral.persistence.TimerRecord` (`of`), whose fields it has
    today; kept apart so that what `history()` returns stays as it is when the store's
    row changes (the store's records are the `Store` protocol's, not the client's).
    """

    run_id: int
    timer_id: str
    due_at: float

    @classmethod
    def of(cls, t: TimerRecord) -> TimerInfo:
        """The stored timer `t` as `history()` lists it."""
        return cls(t.run_id, t.timer_id, t.due_at)


@dataclass(frozen=True, slots=True)
class WaitSummary:
    """One signal wait of a run (open, buffered, delivered or timed out), without its
    payload: who decided it, with which delivery key, when.

    Not `corral.persistence.WaitRecord`, the stored row it is built from (`of`): a
    history shows no payload, and names the entity once, not in each wait.
    """

    run_id: int
    name: str
    status: WaitStatus
    opened_at: float | None
    deadline: float | None
    delivery_key: str | None
    sender: str | None
    delivered_at: float | None

    @classmethod
    def of(cls, w: WaitRecord) -> WaitSummary:
        """The stored wait `w` as a history lists it."""
        return cls(w.run_id, w.name, w.status, w.opened_at, w.deadline, w.delivery_key,
                   w.sender, w.delivered_at)


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One durable step of a run (`Entity.step`), as `history()` lists it.

    Attributes:
        run_id, name: its run and its name in the run.
        status: "retrying" (an attempt failed and another follows: the step is still
            running), "completed", "failed" (its last attempt failed too), or
            "interrupted" (its run ended while it retried: terminated, say).
        attempts: the attempts made (so far, while retrying).
        started_at: when its first attempt began; duration: seconds from then to its
            outcome (while retrying: to its last failed attempt), backoffs included.
        result: the start of its result's JSON text, once completed (a summary, cut
            at `corral.persistence.STEP_RESULT_CHARS` characters with a note).
        error, traceback: its last failed attempt's error ("Type: message") and the
            end of that attempt's traceback (cut, with a note); None if none failed.
        ray_task: its last attempt ran as a Ray task (`ray_options`); node: the Ray node
            id it ran on (None: not a task, or one that never answered).

    Not `corral.persistence.StepAttempts`, the stored row it is built from (`of`): a
    history gives a duration, not the time the row was last written.
    """

    run_id: int
    name: str
    status: StepStatus
    attempts: int
    started_at: float
    duration: float
    result: str | None = None
    error: str | None = None
    traceback: str | None = None
    ray_task: bool = False
    node: str | None = None

    @classmethod
    def of(cls, h: StepAttempts) -> StepInfo:
        """The stored step `h` as a history lists it."""
        return cls(h.run_id, h.name, h.status, h.attempts, h.started_at,
                   max(0.0, h.updated_at - h.started_at), h.result, h.error, h.traceback,
                   h.ray_task, h.node)


@dataclass(frozen=True, slots=True)
class EntityHistory:
    """An entity's runs, one page of its messages (oldest first: pass
    `messages.next_cursor` as `after=`), its waits and pending timers, and its durable
    steps (the newest `corral.persistence.STEP_HISTORY_PER_RUN`, by run then start).

    `applied_seq` is the watermark the message statuses were decided by (None: no
    snapshot and not hosted by the answering process).
    """

    entity_type: str
    key: str
    status: RunStatus
    run_id: int
    applied_seq: int | None
    runs: tuple[RunSummary, ...]
    messages: Page[MessageInfo]
    waits: tuple[WaitSummary, ...]
    timers: tuple[TimerInfo, ...]
    steps: tuple[StepInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class EntityState:
    """The latest snapshot of the current run and the messages accepted after it.

    Attributes:
        snapshot_seq: the snapshot's applied watermark (None: no snapshot yet, then
            `state` is None and `pending` starts at the run's first message).
        state_version: the state version the snapshot was written at.
        state: the entity's attributes as the snapshot holds them (JSON data).
        mailbox: mailbox payloads applied but not yet taken by `run()`, as snapshotted.
        pending: one page of the current run's messages after the snapshot, with their
            payloads (`after=` the previous page's `next_cursor`).
    """

    entity_type: str
    key: str
    status: RunStatus
    run_id: int
    snapshot_seq: int | None
    state_version: int | None
    state: Any
    mailbox: tuple[Any, ...]
    pending: Page[MessageInfo]


def _status(m: MessageRecord, run: RunRecord, applied: int | None) -> MessageStatus:
    if m.dead_letter_id is not None:
        return "dead_lettered"
    if m.run_id != run.run_id or run.status is not RunStatus.RUNNING:
        return "applied"
    return "applied" if applied is not None and m.seq <= applied else "accepted"


def _payload(where: Row, text: object) -> Any:
    """A snapshot's mailbox payload (JSON text) as data."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise where.corrupt("state", "holds a mailbox payload that is not JSON text")
    return where.json("state", text)


def _cursor(items: list[MessageInfo], limit: int, more: bool) -> str | None:
    return str(items[limit - 1].seq) if more else None


async def read_history(store: Store, run: RunRecord, applied_seq: int | None, *,
                       limit: int, after: int) -> EntityHistory:
    """The history of `run`'s entity (its latest run), a page of `limit` messages;
    `applied_seq`: its host's applied watermark, if known (live or recorded)."""
    etype, key = run.entity_type, run.key
    snap = await store.latest_snapshot(etype, key, run.run_id)
    known = [seq for seq in (applied_seq, None if snap is None else snap[0])
             if seq is not None]
    applied = max(known) if known else None
    rows = await store.messages(etype, key, after_seq=after, limit=limit + 1)
    items = [MessageInfo.of(etype, key, m, _status(m, run, applied)) for m in rows]
    runs = tuple(RunSummary.of(r) for r in await store.runs(etype, key))
    waits = tuple(WaitSummary.of(w) for w in await store.waits(etype, key))
    timers = tuple(TimerInfo.of(t) for t in await store.timers(etype, key))
    steps = tuple(StepInfo.of(h) for h in await store.step_history(
        etype, key, limit=STEP_HISTORY_PER_RUN))
    page = Page(items[:limit], _cursor(items, limit, len(items) > limit))
    return EntityHistory(etype, key, run.status, run.run_id, applied, runs, page, waits,
                         timers, steps)


async def read_state(store: Store, run: RunRecord, envelope: dict[str, Any] | None,
                     snapshot_seq: int | None, *, limit: int, after: int) -> EntityState:
    """The state of `run`'s latest snapshot (`envelope`, decoded) and a page of the
    run's messages after it."""
    entries = await store.journal(run.entity_type, run.key, run_id=run.run_id,
                                  after_seq=max(after, snapshot_seq or 0), limit=limit + 1)
    status: MessageStatus = "accepted" if run.status is RunStatus.RUNNING else "applied"
    items = [MessageInfo.of(e.entity_type, e.key, e, status) for e in entries]
    page = Page(items[:limit], _cursor(items, limit, len(items) > limit))
    if envelope is None:
        return EntityState(run.entity_type, run.key, run.status, run.run_id, None, None,
                           None, (), page)
    where = Row("snapshots", run.entity_type, run.key, run.run_id,
                what=f"snapshot at seq {snapshot_seq}")
    mailbox = tuple({**m, "payload": _payload(where, m.get("payload"))}
                    if isinstance(m, dict) else m for m in envelope.get("mailbox") or ())
    return EntityState(run.entity_type, run.key, run.status, run.run_id, snapshot_seq,
                       envelope.get("state_version"), envelope.get("state"), mailbox, page)
