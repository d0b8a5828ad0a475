"""The entity of tests/runtime/test_takeover.py, importable by its worker process too."""

from __future__ import annotations

from pydantic import BaseModel

import corral


class AlarmInput(BaseModel):
    due_at: float


class Alarm(corral.Entity):
    """Rings once at `due_at` (a durable timer), and remembers when it rang."""

    def __init__(self, init: AlarmInput) -> None:
        self.due_at = init.due_at
        self.rang_at: float | None = None

    @corral.query
    def rang(self) -> float | None:
        return self.rang_at

    async def run(self) -> None:
        await self.sleep_until(self.due_at)
        if self.rang_at is None:
            self.rang_at = self.now()
            await self.checkpoint()
        await self.wait_for(lambda: False)
