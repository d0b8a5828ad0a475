"""Release 2 of the ticket desk. Against release 1: `comment` is renamed `reply`
(`renamed_from=`), a new state field `labels`, a new signal `label` (its notes are
recorded as `label:<id>`), and a body-only change (`history` says "r2").
"""

from __future__ import annotations

import os

from pydantic import BaseModel

import corral


class Opened(BaseModel):
    customer: str


class Note(BaseModel):
    id: str


class History(BaseModel):
    notes: list[str]
    release: str
    """Which release's code answered (a body that changes every release)."""
    pid: int


class Ticket(corral.Entity):
    notes: list[str]
    labels: list[str]  # new in release 2 (restored from release 1: its __init__ value)

    def __init__(self, init: Opened) -> None:
        self.customer = init.customer
        self.notes = []
        self.labels = []

    @corral.signal(renamed_from="comment")
    def reply(self, note: Note) -> None:
        self.notes.append(note.id)

    @corral.signal
    def label(self, note: Note) -> None:  # new in release 2
        self.labels.append(note.id)
        self.notes.append(f"label:{note.id}")

    @corral.query
    def history(self) -> History:
        return History(notes=self.notes, release="r2", pid=os.getpid())


app = corral.App(entities=[Ticket])
