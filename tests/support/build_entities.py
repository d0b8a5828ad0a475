"""Three releases of one entity type, `Case`, for tests/runtime/test_builds.py and its
worker (`build_worker.py`).

Release 2 renames `note` to `remark` (declared), adds an optional field to its payload,
adds the signal `escalate`, and moves the state to version 2 with an upgrade hook: it is
compatible with release 1. Release 3 removes `escalate` again: refused while entries
or senders of it remain.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import corral


class Note(BaseModel):
    text: str


class NoteV2(BaseModel):
    text: str
    lang: str = "en"  # optional: release 1's payloads still validate


class Escalation(BaseModel):
    level: int


class CaseView(BaseModel):
    notes: list[str]
    level: int


class CaseR1(corral.Entity):
    name = "Case"

    def __init__(self) -> None:
        self.notes: list[str] = []

    @corral.signal
    def note(self, n: Note) -> None:
        self.notes.append(n.text)

    @corral.query
    def view(self) -> CaseView:
        return CaseView(notes=self.notes, level=0)


class CaseR3(corral.Entity):
    """Release 3: release 2 without `escalate` (declared first: release 2 extends it)."""

    name = "Case"
    state_version = 2

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.level = 0

    @corral.upgrade(from_version=1)
    def _add_level(state: dict[str, Any]) -> dict[str, Any]:
        return {**state, "level": 0}

    @corral.signal(renamed_from="note")
    def remark(self, n: NoteV2) -> None:
        self.notes.append(n.text)

    @corral.query
    def view(self) -> CaseView:
        return CaseView(notes=self.notes, level=self.level)


class CaseR2(CaseR3):
    """Release 2: `note` renamed `remark` with an optional field, `escalate` added, state
    version 2 with its hook."""

    name = "Case"  # a subclass is a type of its own unless it says so

    @corral.signal
    def escalate(self, e: Escalation) -> None:
        self.level += e.level
