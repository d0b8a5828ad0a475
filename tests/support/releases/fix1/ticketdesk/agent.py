"""A ticket desk whose `run()` triages notes, with a bug: an urgent note (its id starts
with "urgent") raises, so the run is suspended (retried only an hour later), its notes
kept. `fix2` is the body-only fix: the same handlers and state.
"""

from __future__ import annotations

from pydantic import BaseModel

import corral


class Opened(BaseModel):
    customer: str


class Note(BaseModel):
    id: str


class Ticket(corral.Entity):
    run_retry = corral.RetryPolicy(max_attempts=None, initial_backoff=3600, max_backoff=3600)
    inbox: list[str]
    triaged: list[str]

    def __init__(self, init: Opened) -> None:
        self.inbox = []
        self.triaged = []

    @corral.signal
    def comment(self, note: Note) -> None:
        self.inbox.append(note.id)

    @corral.query
    def seen(self) -> list[str]:
        return self.triaged

    async def run(self) -> None:
        while True:
            await self.wait_for(lambda: self.inbox)
            while self.inbox:
                note = self.inbox[0]
                if note.startswith("urgent"):
                    raise KeyError(f"no queue for {note}")  # the bug
                self.triaged.append(self.inbox.pop(0))


app = corral.App(entities=[Ticket])
