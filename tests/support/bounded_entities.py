"""Entity types for the bounded-entity tests (continue-as-new, passivation, timers, faults).

Shared by the pytest process and the `mp_bounded_worker.py` subprocesses, so every
process registers the same names, handlers and start types against a shared store.

What an entity applied is kept in its own state and carried to the next run through the
start input of `continue_as_new` (`Chain.applied`): the last run's state then holds the
whole history, each item tagged with the run that applied it.
"""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

from pydantic import BaseModel

import corral

__all__ = [
    "Applied",
    "Chain",
    "ChurnLedger",
    "ChurnMailbox",
    "Fired",
    "Job",
    "Note",
    "Patient",
    "Reminder",
    "Rollover",
    "Sink",
    "SinkInit",
    "Sleepy",
    "SleepyReminder",
    "Start",
    "StormLedger",
    "StormMailbox",
    "Tick",
    "Wake",
]


class Note(BaseModel):
    """A signal payload carrying the sender's message id."""

    mid: str


class Job(BaseModel):
    """A mailbox payload."""

    mid: str


class Applied(BaseModel):
    """One applied (or, for mailbox entities, taken) message and the run that did it."""

    run: int
    mid: str


class Chain(BaseModel):
    """Start input of a run: the history carried over from the previous runs.

    Attributes:
        applied: what earlier runs applied, in order.
        expect: the run completes (returning `applied`) once this many are applied;
            0: never completes.
        every: mailbox entities take this many payloads per run before continuing.
        carried: per continue-as-new so far, how many mailbox payloads were not taken.
    """

    applied: list[Applied] = []
    expect: int = 0
    every: int = 100
    carried: list[int] = []


class Start(BaseModel):
    """An empty start input."""

    origin: str = ""


class StormLedger(corral.Entity):
    """Handler signals; continues as new whenever its policy suggests it (100 signals)."""

    continue_as_new_policy = corral.ContinueAsNewPolicy(
        max_signals=100, max_journal_entries=None, max_journal_bytes=None)

    applied: list[Applied]
    carried: list[int]

    def __init__(self, init: Chain) -> None:
        self.applied = list(init.applied)
        self.expect = init.expect
        self.carried = list(init.carried)

    @corral.signal
    def note(self, n: Note) -> None:
        self.applied.append(Applied(run=self.run_id, mid=n.mid))

    @corral.query
    def history(self) -> list[Applied]:
        return list(self.applied)

    def _complete(self) -> bool:
        return 0 < self.expect <= len(self.applied)

    async def run(self) -> list[Applied]:
        await self.wait_for(lambda: self._complete() or self.continue_as_new_suggested)
        if self._complete():
            return self.applied
        self.continue_as_new(Chain(applied=self.applied, expect=self.expect))


class StormMailbox(corral.Entity):
    """Mailbox signals; each run takes `every` payloads, then continues as new.

    It first waits until more than `every` payloads are waiting (10 more, or all that
    are still to come), so every continue-as-new leaves payloads untaken in the mailbox:
    those must be carried to the next run, in order.
    """

    notes = corral.signal(Note)

    applied: list[Applied]
    carried: list[int]

    def __init__(self, init: Chain) -> None:
        self.applied = list(init.applied)
        self.expect = init.expect
        self.every = init.every
        self.carried = list(init.carried)

    @corral.query
    def history(self) -> list[Applied]:
        return list(self.applied)

    async def run(self) -> Chain:
        remaining = self.expect - len(self.applied)
        want = min(self.every + 10, remaining)
        await self.wait_for(lambda: len(self.mailbox) >= want)
        for _ in range(min(self.every, remaining)):
            note = await self.mailbox.get()
            self.applied.append(Applied(run=self.run_id, mid=note.mid))
        if len(self.applied) >= self.expect:
            return Chain(applied=self.applied, expect=self.expect, carried=self.carried)
        self.continue_as_new(Chain(applied=self.applied, expect=self.expect, every=self.every,
                                   carried=[*self.carried, len(self.mailbox)]))


class Rollover(corral.Entity):
    """Snapshots every 10 signals (keeping one); continues as new when told to `roll`."""

    snapshots = corral.SnapshotPolicy(every=10, keep=1)

    applied: list[Applied]

    def __init__(self, init: Chain) -> None:
        self.applied = list(init.applied)
        self.rolls = 0

    @corral.signal
    def note(self, n: Note) -> None:
        self.applied.append(Applied(run=self.run_id, mid=n.mid))

    @corral.signal
    def roll(self) -> None:
        self.rolls += 1

    @corral.query
    def history(self) -> list[Applied]:
        return list(self.applied)

    async def run(self) -> None:
        await self.wait_for(lambda: self.rolls > 0)
        self.continue_as_new(Chain(applied=self.applied))


class ChurnLedger(corral.Entity):
    """Fault tests: snapshots every 5 signals, continues as new every 40 (by policy)."""

    snapshots = corral.SnapshotPolicy(every=5, keep=2)
    continue_as_new_policy = corral.ContinueAsNewPolicy(
        max_signals=40, max_journal_entries=None, max_journal_bytes=None)

    applied: list[Applied]

    def __init__(self, init: Chain) -> None:
        self.applied = list(init.applied)

    @corral.signal
    def note(self, n: Note) -> None:
        self.applied.append(Applied(run=self.run_id, mid=n.mid))

    @corral.query
    def history(self) -> list[Applied]:
        return list(self.applied)

    async def run(self) -> None:
        await self.wait_for(lambda: self.continue_as_new_suggested)
        self.continue_as_new(Chain(applied=self.applied))


class ChurnMailbox(corral.Entity):
    """Fault tests: mailbox signals, snapshots every 5 (untaken payloads included, so the
    journal entries behind them get truncated); after taking 40 payloads it continues as
    new as soon as some are still untaken, carrying them."""

    snapshots = corral.SnapshotPolicy(every=5, keep=2)
    notes = corral.signal(Note)

    applied: list[Applied]
    carried: list[int]

    def __init__(self, init: Chain) -> None:
        self.applied = list(init.applied)
        self.carried = list(init.carried)
        self.taken = 0

    @corral.query
    def history(self) -> list[Applied]:
        return list(self.applied)

    @corral.query
    def carried_counts(self) -> list[int]:
        return list(self.carried)

    async def run(self) -> None:
        while True:
            note = await self.mailbox.get()
            self.applied.append(Applied(run=self.run_id, mid=note.mid))
            self.taken += 1
            if self.taken >= 40 and self.mailbox:
                self.continue_as_new(Chain(applied=self.applied,
                                           carried=[*self.carried, len(self.mailbox)]))


class SinkInit(BaseModel):
    owner: str = "bench"


class Tick(BaseModel):
    v: int


class Sink(corral.Entity):
    """Counts signals; `handler_calls` (process-wide, outside snapshots) counts replays.

    Remembers the last 5,000 message ids (the dedupe window), so its whole store
    plateaus within a test's first 12,000 signals (twice the bounded rows)."""

    snapshots = corral.SnapshotPolicy(every=500, keep=2)
    dedupe_window = corral.DedupeWindow(max_count=5_000, max_age=None)
    handler_calls: ClassVar[int] = 0

    def __init__(self, init: SinkInit) -> None:
        self.count = 0
        self.total = 0

    @corral.signal
    def tick(self, t: Tick) -> None:
        type(self).handler_calls += 1
        self.count += 1
        self.total += t.v

    @corral.query
    def totals(self) -> list[int]:
        return [self.count, self.total]


class Sleepy(corral.Entity):
    """Passivates after 0.2 s idle. `notes` are applied by a handler, `jobs` are taken by
    `run()` (state only `run()` changes). Class counters see inits, restores, replays."""

    idle_timeout = 0.2
    jobs = corral.signal(Job)
    inits: ClassVar[int] = 0
    handler_calls: ClassVar[int] = 0

    def __init__(self, init: Start) -> None:
        type(self).inits += 1
        self.notes: list[str] = []
        self.processed: list[str] = []

    @corral.signal
    def note(self, n: Note) -> None:
        type(self).handler_calls += 1
        self.notes.append(n.mid)

    @corral.query
    def state(self) -> dict[str, list[str]]:
        return {"notes": list(self.notes), "processed": list(self.processed)}

    async def run(self) -> None:
        async for job in self.mailbox:
            self.processed.append(job.mid)


class Wake(BaseModel):
    """When a `Reminder` should fire (wall clock, seconds since the epoch)."""

    at: float


class Fired(BaseModel):
    """A `Reminder`'s result."""

    due: float
    fired_at: float
    starts: int


class Reminder(corral.Entity):
    """Sleeps until a deadline kept in state, then completes.

    `run()` restarts from the top after a restart or passivation: the deadline is state
    (set by the `wake` signal and kept in snapshots), so it sleeps only the remainder.
    `starts` counts how often `run()` began in this process (test instrumentation).
    """

    starts: ClassVar[int] = 0

    def __init__(self, init: Start) -> None:
        self.due: float | None = None

    @corral.signal
    def wake(self, w: Wake) -> None:
        self.due = w.at

    @corral.query
    def deadline(self) -> float | None:
        return self.due

    async def run(self) -> Fired:
        type(self).starts += 1
        await self.wait_for(lambda: self.due is not None)
        assert self.due is not None
        await self.sleep_until(self.due)
        return Fired(due=self.due, fired_at=time.time(), starts=type(self).starts)


class Patient(corral.Entity):
    """Waits for a `reply` until a deadline (`wait_for` with a timeout), passivating
    after 0.2 s idle meanwhile; returns the reply or `"timed out"`."""

    idle_timeout = 0.2

    def __init__(self, init: Wake) -> None:
        self.until = init.at
        self.answer: str | None = None

    @corral.signal
    def poke(self) -> None:
        pass

    @corral.signal
    def reply(self, n: Note) -> None:
        self.answer = n.mid

    async def run(self) -> str:
        got = await self.wait_for(lambda: self.answer is not None,
                                  timeout=max(0.0, self.until - time.time()))
        return self.answer if got and self.answer is not None else "timed out"


class SleepyReminder(Reminder):
    """A `Reminder` that passivates after 0.2 s idle (sleeping counts as idle)."""

    idle_timeout = 0.2
    starts: ClassVar[int] = 0


class RollIn(BaseModel):
    """What a counter run hands the next: its running total."""

    total: int = 0
    generation: int = 0


class Bump(BaseModel):
    pass


class Count(BaseModel):
    count: int
    generation: int


class RollingCounter(corral.Entity):
    """An update counter that continues as new every 5 updates, carrying its total."""

    def __init__(self, init: RollIn) -> None:
        self.total = init.total
        self.generation = init.generation
        self.since = 0

    @corral.update
    def bump(self, req: Bump) -> Count:
        self.total += 1
        self.since += 1
        return Count(count=self.total, generation=self.generation)

    @corral.query
    def count(self) -> int:
        return self.total

    async def run(self) -> None:
        while True:
            await self.wait_for(lambda: self.since >= 5)
            self.continue_as_new(RollIn(total=self.total, generation=self.generation + 1))


class ParkedCounter(corral.Entity):
    """Generation 0's update handler parks in an await; run() continues as new meanwhile.

    The parked handler must be abandoned with run 1 and its update applied, once, by
    run 2 (where it does not park).
    """

    def __init__(self, init: RollIn) -> None:
        self.total = init.total
        self.generation = init.generation
        self.parked = False

    @corral.update
    async def bump(self, req: Bump) -> Count:
        if self.generation == 0:
            self.parked = True
            await asyncio.Event().wait()  # never set: only continue-as-new ends this
        self.total += 1
        return Count(count=self.total, generation=self.generation)

    async def run(self) -> None:
        if self.generation == 0:
            while not self.parked:  # wakes on its timer: no message marks the parking
                await self.wait_for(lambda: self.parked, timeout=0.01)
            self.continue_as_new(RollIn(total=self.total, generation=1))
        await self.wait_for(lambda: False)
