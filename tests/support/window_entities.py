"""An entity with a reorder window, for tests/runtime/test_reorder_window.py and its
worker process (`window_worker.py`)."""

from __future__ import annotations

from pydantic import BaseModel

import corral

__all__ = ["HOLD", "Inbox", "Reply", "Taken"]

HOLD = 2.0


class Reply(BaseModel):
    n: int
    at: float  # the provider's timestamp


class Taken(BaseModel):
    order: list[tuple[int, bool]]  # (n, late) in the order run() took them


class Inbox(corral.Entity):
    """Takes replies in the order of their `at`, holding each `HOLD` seconds."""

    replies = corral.signal(Reply, order_by="at", hold=HOLD)
    taken: list[tuple[int, bool]]

    def __init__(self) -> None:
        self.taken: list[tuple[int, bool]] = []

    async def run(self) -> None:
        async for reply in self.mailbox:
            self.taken.append((reply.n, self.mailbox.late))
            await self.checkpoint()  # a restart does not take it again

    @corral.query
    def seen(self) -> Taken:
        return Taken(order=self.taken)
