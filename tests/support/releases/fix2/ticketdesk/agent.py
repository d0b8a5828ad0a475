"""The body-only fix of `fix1`'s `run()`: an urgent note is triaged like any other
(the same handlers and state as `fix1`, so the same manifest but a new build)."""

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
                self.triaged.append(self.inbox.pop(0))  # fixed: urgent notes too


app = corral.App(entities=[Ticket])
