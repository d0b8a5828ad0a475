"""The entity of the hand-off tests and of `benchmarks/handoff.py`, shared by the test
process and its workers (`handoff_worker.py`) so all register the same definitions."""

from __future__ import annotations

from pydantic import BaseModel

import corral

__all__ = ["Mark", "Tally"]


class Mark(BaseModel):
    """A message id, carried in the payload so the entity records what it applied."""

    mid: str


class Tally(corral.Entity):
    """Keeps the ids of the signals and updates applied to it, in the order applied."""

    applied: list[str]

    def __init__(self, init: Mark) -> None:
        self.applied = []

    @corral.signal
    def note(self, msg: Mark) -> None:
        self.applied.append(msg.mid)

    @corral.update
    def add(self, msg: Mark) -> int:
        self.applied.append(msg.mid)
        return len(self.applied)

    @corral.query
    def ids(self) -> list[str]:
        return list(self.applied)
