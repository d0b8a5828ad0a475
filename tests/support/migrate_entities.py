"""The entities of tests/persistence/test_migrate.py: a store left mid-life, to be moved.

`Ledger` records every tag its `add` signal applied (a second application would show
twice), and, by its start input's `mode`, keeps a run open on a durable timer, on a
signal wait with a deadline, after a durable step, suspended (its `run()` raises), or
closes at once; its `relay` sends to `Sink`. `Capped` takes at
most one signal in its mailbox and dead-letters the rest at acceptance.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

import corral

__all__ = ["SINK", "Add", "Capped", "Ledger", "LedgerInput", "LedgerState", "Note", "Relay",
           "Sink",
           "TallyR1", "TallyR2"]

SINK = {"down": False}
"""While `down`, every `Sink` run suspends: its mailbox stays full, so sends to it wait
in their senders' outbox."""


class LedgerInput(BaseModel):
    mode: Literal["idle", "timer", "wait", "step", "close", "boom"] = "idle"
    due: float = 0.0  # the timer's (mode "timer"), epoch s


class Add(BaseModel):
    tag: str


class Note(BaseModel):
    text: str


class Relay(BaseModel):
    sends: int


class LedgerState(BaseModel):
    applied: list[str]
    fired_at: float | None
    delivered: str | None
    stepped: int | None


def _answer() -> int:
    return 42


class Ledger(corral.Entity):
    """See the module docstring."""

    approval = corral.wait(Note)

    def __init__(self, init: LedgerInput) -> None:
        self.mode = init.mode
        self.due = init.due
        self.applied: list[str] = []
        self.fired_at: float | None = None
        self.delivered: str | None = None
        self.stepped: int | None = None

    @corral.signal
    def add(self, add: Add) -> None:
        self.applied.append(add.tag)

    @corral.signal
    def relay(self, relay: Relay) -> None:
        for n in range(relay.sends):
            self.send(Sink, "sink", Sink.take, Add(tag=f"r{n}"), start=Add(tag=""))

    @corral.query
    def state(self) -> LedgerState:
        return LedgerState(applied=self.applied, fired_at=self.fired_at,
                           delivered=self.delivered, stepped=self.stepped)

    async def run(self) -> None:
        if self.mode == "close":
            return
        if self.mode == "boom":  # suspended, retried: its messages are kept
            raise RuntimeError("boom")
        if self.mode == "timer" and self.fired_at is None:
            await self.sleep_until(self.due)
            self.fired_at = self.now()
        if self.mode == "wait" and self.delivered is None:
            note = await self.wait_for_signal(Ledger.approval, timeout=3600)
            self.delivered = note.text
        if self.mode == "step" and self.stepped is None:
            self.stepped = await self.step(_answer, name="answer")
        await self.wait_for(lambda: False)


class Capped(corral.Entity):
    """One signal in the mailbox at most; the rest are dead letters at once."""

    max_backlog = 1
    overflow = "dead_letter"

    def __init__(self) -> None:
        self.applied: list[str] = []

    @corral.signal
    def add(self, add: Add) -> None:
        self.applied.append(add.tag)


class Sink(corral.Entity):
    """Takes one signal at a time into its mailbox; its run suspends while `SINK` is down."""

    max_backlog = 1

    def __init__(self, init: Add) -> None:
        self.got: list[str] = []

    @corral.signal
    def take(self, add: Add) -> None:
        self.got.append(add.tag)

    @corral.query
    def seen(self) -> list[str]:
        return self.got

    async def run(self) -> None:
        if SINK["down"]:
            raise RuntimeError("the sink is down")
        await self.wait_for(lambda: False)


class TallyR1(corral.Entity):
    """Two builds of one type (`Tally`): release 2 adds a signal, compatibly."""

    name = "Tally"

    def __init__(self) -> None:
        self.n = 0

    @corral.signal
    def bump(self) -> None:
        self.n += 1


class TallyR2(TallyR1):
    name = "Tally"

    @corral.signal
    def reset(self) -> None:
        self.n = 0

