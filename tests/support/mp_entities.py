"""Entity types shared by the multi-process tests and their worker processes.

Every process (the pytest process and each `mp_worker.py` subprocess) imports the
entity classes from this one module, so they all register the same entity names,
handlers and start types against the shared store file.
"""

from __future__ import annotations

import time

from pydantic import BaseModel

import corral

__all__ = ["Clocked", "Job", "Note", "Pipeline", "Recorder", "Stamp", "Stamps", "Start"]


class Start(BaseModel):
    """Start input; `origin` says which process started the run."""

    origin: str = ""


class Note(BaseModel):
    """A signal payload carrying the sender's message id."""

    mid: str


class Job(BaseModel):
    """A mailbox payload for `Pipeline`; `mid="finish"` ends its run."""

    mid: str


class Stamp(BaseModel):
    """One applied message id with the wall-clock time the owner applied it."""

    mid: str
    applied_at: float


class Stamps(BaseModel):
    """Answer of `Clocked.applied`."""

    items: list[Stamp]


class Recorder(corral.Entity):
    """Keeps the ids of the signals applied to it, in application order."""

    def __init__(self, init: Start) -> None:
        self.applied: list[str] = []

    @corral.signal
    def note(self, msg: Note) -> None:
        self.applied.append(msg.mid)

    @corral.query
    def applied_ids(self) -> list[str]:
        return list(self.applied)


class Clocked(corral.Entity):
    """Records when each signal was applied (test instrumentation: replays re-stamp)."""

    stamps: list[Stamp]

    def __init__(self, init: Start) -> None:
        self.stamps = []

    @corral.signal
    def note(self, msg: Note) -> None:
        self.stamps.append(Stamp(mid=msg.mid, applied_at=time.time()))

    @corral.query
    def applied(self) -> Stamps:
        return Stamps(items=list(self.stamps))


class Pipeline(corral.Entity):
    """A `run()` loop that processes mailbox jobs until a `finish` job arrives.

    `processed` is state only `run()` changes, so it is visible only where the entity
    is hosted, and rebuilding it after a takeover needs `run()` to continue.
    """

    jobs = corral.signal(Job)

    def __init__(self, init: Start) -> None:
        self.processed: list[str] = []

    async def run(self) -> list[str]:
        async for job in self.mailbox:
            if job.mid == "finish":
                return self.processed
            self.processed.append(job.mid)
        return self.processed

    @corral.query
    def done(self) -> list[str]:
        return list(self.processed)
