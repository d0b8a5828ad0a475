"""Release 1 of the ticket desk with an incompatible state change: `notes` was a
`list[str]` and is an `int` now (a count), with no `state_version` bump and no
upgrade hook, so release 1's snapshots cannot be restored. Deploying it is refused.
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
    pid: int


class Ticket(corral.Entity):
    notes: int  # was list[str]

    def __init__(self, init: Opened) -> None:
        self.customer = init.customer
        self.notes = 0

    @corral.signal
    def comment(self, note: Note) -> None:
        self.notes += 1

    @corral.query
    def history(self) -> History:
        return History(notes=[], release="bad", pid=os.getpid())


app = corral.App(entities=[Ticket])
