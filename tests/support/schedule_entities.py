"""The entity of tests/runtime/test_schedules_processes.py, importable by its workers."""

from __future__ import annotations

from pydantic import BaseModel

import corral


class Beat(BaseModel):
    n: int = 0


class Counter(corral.Entity):
    """Counts the ticks applied to it."""

    def __init__(self) -> None:
        self.count = 0

    @corral.signal
    def beat(self, beat: Beat) -> None:
        self.count += 1

    @corral.query
    def beats(self) -> int:
        return self.count
