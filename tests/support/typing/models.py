"""Entities for the typing tests (checked by mypy, never run)."""

from __future__ import annotations

from pydantic import BaseModel

import corral


class Start(BaseModel):
    tenant: str


class Reply(BaseModel):
    text: str


class Other(BaseModel):
    text: str


class Assigned(BaseModel):
    agent: str


class Ticket(corral.Entity):
    inbox = corral.signal(Reply)
    approval = corral.wait(Reply)

    def __init__(self, init: Start) -> None:
        self.replies: list[str] = []

    @corral.signal
    def reply(self, reply: Reply) -> None:
        self.replies.append(reply.text)

    @corral.signal
    def ping(self) -> None:
        pass

    @corral.update
    async def assign(self, req: Reply) -> Assigned:
        return Assigned(agent=req.text)

    @corral.update
    def count(self) -> int:
        return len(self.replies)

    @corral.query
    def replies_so_far(self) -> list[str]:
        return self.replies

    @corral.query
    def starts_with(self, prefix: Reply) -> bool:
        return any(r.startswith(prefix.text) for r in self.replies)

    async def run(self) -> int:
        await self.wait_for(lambda: len(self.replies) > 3)
        return len(self.replies)


class Job(corral.Entity):
    @corral.signal
    def poke(self, reply: Reply) -> None:
        pass

    async def run(self) -> str:
        return "done"
