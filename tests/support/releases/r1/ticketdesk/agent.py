"""Release 1 of the ticket desk: a `Ticket` that records every note it applies.

`notes` is the entity's own record of what it applied, in order: the acceptance tests
check exactly-once on it.
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

    def __init__(self, init: Opened) -> None:
        self.customer = init.customer
        self.notes = []

    @corral.signal
    def comment(self, note: Note) -> None:
        self.notes.append(note.id)

    @corral.query
    def history(self) -> History:
        return History(notes=self.notes, release="r1", pid=os.getpid())


app = corral.App(entities=[Ticket])
