"""The application `tests/operators/test_cli.py` points the `corral` command at
(`--app cli_app:app`).

`Board` takes notes by signal and has signals that raise while `Board.broken` is set
(one attempt: a dead letter at once); `Approval` waits, durably, for one decision.
`Flare` fails its run with its start input as the error. `Desk` keeps notes and waits an
hour for a decision (a wait and its timer, for `corral history`). `limited` is the same
application with limits of its own (`--app cli_app:limited`); `guarded` the same with an
`authorize` hook that lets the sender "intruder" read nothing (`--app cli_app:guarded`).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, Field

import corral

__all__ = ["LIMITS", "Approval", "Blob", "Board", "BoardInput", "Bulk", "Decision", "Desk",
           "Flare", "Hoard", "Note", "app", "guarded", "limited"]


class BoardInput(BaseModel):
    """A board's start input."""

    title: str


class Note(BaseModel):
    """One note: 1 to 40 characters."""

    text: str = Field(min_length=1, max_length=40)


class Decision(BaseModel):
    """The payload of `Approval.decision`."""

    approved: bool


class Board(corral.Entity):
    """Notes, in order; `fragile` raises while `Board.broken` is set."""

    retry = corral.RetryPolicy(max_attempts=1)
    broken: ClassVar[bool] = True  # process-wide: the test "fixes the handler" by clearing it

    def __init__(self, init: BoardInput) -> None:
        self.title = init.title
        self.notes: list[str] = []

    @corral.signal
    def post(self, note: Note) -> None:
        self.notes.append(note.text)

    @corral.signal
    def clear(self) -> None:
        self.notes.clear()

    @corral.signal
    def fragile(self, note: Note) -> None:
        if type(self).broken:
            raise RuntimeError(f"cannot take {note.text!r}")
        self.notes.append(note.text)

    @corral.signal
    def shout(self, note: Note) -> None:
        if type(self).broken:
            raise RuntimeError(note.text)  # the note as it is: control characters and all
        self.notes.append(note.text)

    @corral.update
    def count(self) -> int:
        return len(self.notes)

    @corral.query
    def read(self) -> list[str]:
        return self.notes


class Approval(corral.Entity):
    """Waits for `decision`, then returns whether it approved."""

    decision = corral.wait(Decision)

    async def run(self) -> bool:
        return (await self.wait_for_signal(Approval.decision)).approved


class Flare(corral.Entity):
    """A run that fails at once, with its start input (as it is) for the error (a type in
    `fail_on`: any other exception would suspend the run, not fail it)."""

    fail_on = (RuntimeError,)

    def __init__(self, init: Note) -> None:
        self.text = init.text

    async def run(self) -> None:
        raise RuntimeError(self.text)


class Stuck(corral.Entity):
    """A run with a bug: `run()` raises, so the run is suspended (retried an hour later)."""

    run_retry = corral.RetryPolicy(max_attempts=None, initial_backoff=3600, max_backoff=3600)

    def __init__(self, init: Note) -> None:
        self.text = init.text

    async def run(self) -> None:
        raise KeyError(self.text)


class Desk(corral.Entity):
    """Notes by signal (`fragile` always raises: a dead letter at once); `run()` waits up
    to an hour for `decision` and returns how many notes it holds then."""

    retry = corral.RetryPolicy(max_attempts=1)
    decision = corral.wait(Decision)

    def __init__(self, init: BoardInput) -> None:
        self.title = init.title
        self.notes: list[str] = []

    @corral.signal
    def post(self, note: Note) -> None:
        self.notes.append(note.text)

    @corral.signal
    def fragile(self, note: Note) -> None:
        raise RuntimeError(f"cannot take {note.text!r}")

    @corral.update
    def rename(self, init: BoardInput) -> str:
        old, self.title = self.title, init.title
        return old

    @corral.query
    def read(self) -> list[str]:
        return self.notes

    async def run(self) -> int:
        await self.wait_for_signal(Desk.decision, timeout=3600)
        return len(self.notes)


class Bulk(BaseModel):
    """The payload of `Hoard.fill`: how many items, each of how many characters more."""

    items: int = Field(ge=0, le=1_000_000)
    size: int = Field(ge=0, le=10_000)


class Blob(BaseModel):
    """The payload of `Hoard.keep`: one large text."""

    text: str


class Hoard(corral.Entity):
    """A state as large as asked (`fill`), and messages as large as allowed (`keep`): for
    `show --state` of a big entity (`--app cli_app:Hoard`). A snapshot after each message."""

    snapshots = corral.SnapshotPolicy(every=1)

    def __init__(self) -> None:
        self.items: list[str] = []

    @corral.signal
    def fill(self, bulk: Bulk) -> None:
        self.items += [f"{i:08d}" + "x" * bulk.size for i in range(bulk.items)]

    @corral.signal
    def keep(self, blob: Blob) -> None:
        self.items.append(blob.text)


app = corral.App(entities=[Board, Approval, Flare, Stuck, Desk])

LIMITS = corral.Limits(max_payload_bytes=1024, key_pattern=r"[a-z0-9-]+(~[a-z0-9-]+)?")
"""Payloads up to 1 KiB, and keys that may hold one `~` (the default pattern refuses it)."""

limited = corral.App(entities=[Board, Approval, Flare], limits=LIMITS)


def no_intruder_reads(request: corral.AuthRequest) -> str | bool | None:
    """Every call as claimed, but no read (kind "read") by "intruder"."""
    return not (request.kind == "read" and request.sender == "intruder") and request.sender


guarded = corral.App(entities=[Board, Approval, Flare, Stuck, Desk],
                     authorize=no_intruder_reads)
