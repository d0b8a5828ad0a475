"""Models, entities and helpers shared by the single-process semantic tests.

Handlers record what they do in `EVENTS` (entity type, key, instance number, event), so
a test can check the order in which `__init__` and handlers ran on each instance
without trusting the runtime's own bookkeeping. Keys come from `fresh_key()` so events
of different tests never mix.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel

import corral
from corral.persistence import Store
from procs import wait_until

# -- recording -----------------------------------------------------------------------

EVENTS: list[tuple[str, str, int | None, str]] = []
"""(entity type, key, instance number or None if `__init__` never ran, event)."""

_INSTANCES = itertools.count(1)


def fresh_key(prefix: str = "ticket") -> str:
    """A key no other test uses (EVENTS is process-wide)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def record(entity: corral.Entity, event: str) -> None:
    EVENTS.append((type(entity).__name__, entity.key, getattr(entity, "instance", None), event))


def events_of(key: str) -> list[tuple[int | None, str]]:
    """(instance, event) pairs recorded for `key`, in the order they happened."""
    return [(inst, ev) for _, k, inst, ev in EVENTS if k == key]


def assert_init_first(key: str) -> dict[int, list[str]]:
    """Check each instance of `key` ran `__init__` exactly once, before any handler.

    Returns each instance's handler events (without `init`), in order.
    """
    per_instance: dict[int, list[str]] = {}
    for inst, ev in events_of(key):
        assert inst is not None, f"a handler ran before __init__ ({ev})"
        per_instance.setdefault(inst, []).append(ev)
    for inst, evs in per_instance.items():
        assert evs[0] == "init", f"instance {inst} ran {evs[0]!r} before __init__"
        assert evs.count("init") == 1, f"instance {inst} ran __init__ {evs.count('init')} times"
        evs.pop(0)
    return per_instance


# -- models --------------------------------------------------------------------------


class Start(BaseModel):
    tenant: str


class Reply(BaseModel):
    text: str


class Blob(BaseModel):
    """A payload that can hold values JSON cannot represent."""

    value: Any = None
    x: float = 0.0


class Chain(BaseModel):
    """A recursive model: deeply nested values must be refused, not crash the encoder."""

    text: str
    child: Chain | None = None


class Status(BaseModel):
    tenant: str
    inbox: list[str]
    assignments: list[str]


class Assign(BaseModel):
    agent: str


class Assigned(BaseModel):
    agent: str
    number: int


class Other(BaseModel):
    text: str


# -- entities ------------------------------------------------------------------------


class Ticket(corral.Entity):
    """Signals and updates touch state made in `__init__`; `run()` waits forever."""

    def __init__(self, init: Start) -> None:
        self.instance = next(_INSTANCES)
        record(self, "init")
        self.tenant = init.tenant
        self.inbox: list[str] = []
        self.assignments: list[str] = []

    @corral.signal
    def reply(self, reply: Reply) -> None:
        record(self, f"reply:{reply.text}")
        self.inbox.append(f"{self.tenant}:{reply.text}")

    @corral.signal
    def attach(self, blob: Blob) -> None:
        record(self, "attach")

    @corral.signal
    def link(self, chain: Chain) -> None:
        record(self, f"link:{chain.text}")

    @corral.update
    def assign(self, req: Assign) -> Assigned:
        record(self, f"assign:{req.agent}")
        self.assignments.append(req.agent)
        return Assigned(agent=req.agent, number=len(self.assignments))

    @corral.update
    async def reject(self, req: Assign) -> Assigned:
        record(self, f"reject:{req.agent}")
        raise ValueError(f"no agent named {req.agent}")

    @corral.query
    def status(self) -> Status:
        return Status(tenant=self.tenant, inbox=self.inbox, assignments=self.assignments)


class Note(BaseModel):
    text: str


class Notes(BaseModel):
    texts: list[str]


class Inbox(corral.Entity):
    """A mailbox signal drained by `run()`; "stop" ends the run."""

    note = corral.signal(Note)

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def run(self) -> Notes:
        async for item in self.mailbox:
            self.seen.append(item.text)
            if item.text == "stop":
                break
        return Notes(texts=self.seen)


class Poke(BaseModel):
    n: int


class Finish(BaseModel):
    mode: Literal["complete", "fail"]


class JobResult(BaseModel):
    run_id: int
    tenant: str
    pokes: list[int]


class Job(corral.Entity):
    """Runs until a `finish` signal: completes or fails on request (`corral.FailRun`: any
    other exception would suspend the run, not fail it)."""

    def __init__(self, init: Start) -> None:
        self.instance = next(_INSTANCES)
        record(self, "init")
        self.tenant = init.tenant
        self.pokes: list[int] = []
        self.mode: str | None = None

    @corral.signal
    def poke(self, poke: Poke) -> None:
        record(self, f"poke:{poke.n}")
        self.pokes.append(poke.n)

    @corral.signal
    def finish(self, finish: Finish) -> None:
        self.mode = finish.mode

    @corral.query
    def state(self) -> JobResult:
        return JobResult(run_id=self.run_id, tenant=self.tenant, pokes=self.pokes)

    async def run(self) -> JobResult:
        await self.wait_for(lambda: self.mode is not None)
        if self.mode == "fail":
            raise corral.FailRun("job failed on purpose")
        return JobResult(run_id=self.run_id, tenant=self.tenant, pokes=list(self.pokes))


class JobFailedOnly(Job):
    id_reuse = corral.IdReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY


class JobReject(Job):
    id_reuse = corral.IdReusePolicy.REJECT_DUPLICATE


class Unregistered(corral.Entity):
    """Never passed to `open_runtime`."""

    @corral.signal
    def reply(self, reply: Reply) -> None:
        pass


ALL_ENTITIES: list[type[corral.Entity]] = [Ticket, Inbox, Job, JobFailedOnly, JobReject]


# -- waiting -------------------------------------------------------------------------


async def wait_applied(ref: corral.EntityRef[Any], seq: int) -> None:
    """Wait until the live activation of `ref` has applied everything up to `seq`."""

    async def applied() -> bool:
        info = await ref.describe()
        return info.applied_seq is not None and info.applied_seq >= seq

    await wait_until(applied, f"{ref!r} applies seq {seq}")


# -- a store that can hold the host at chosen points ----------------------------------


class GatedStore:
    """Wraps a store (either kind); can hold `latest_run`/`journal` reads or run a hook before
    `close_run`, to open the windows the guarantees are about."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.gated: set[str] = set()
        self.gate = asyncio.Event()
        self.gate.set()
        self.reached = asyncio.Event()
        self.before_close: Callable[[], Awaitable[None]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def hold(self, *methods: str) -> None:
        self.gated = set(methods)
        self.reached.clear()
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    async def _pass(self, method: str) -> None:
        if method in self.gated and not self.gate.is_set():
            self.reached.set()
            await self.gate.wait()

    async def latest_run(self, etype: str, key: str) -> Any:
        await self._pass("latest_run")
        return await self.inner.latest_run(etype, key)

    async def journal(self, etype: str, key: str, *, run_id: int, after_seq: int) -> Any:
        await self._pass("journal")
        return await self.inner.journal(etype, key, run_id=run_id, after_seq=after_seq)

    async def close_run(self, *args: Any, **kwargs: Any) -> bool:
        hook, self.before_close = self.before_close, None
        if hook is not None:
            await hook()
        return await self.inner.close_run(*args, **kwargs)


__all__ = [
    "ALL_ENTITIES",
    "EVENTS",
    "Assign",
    "Assigned",
    "Blob",
    "Finish",
    "GatedStore",
    "Inbox",
    "Job",
    "JobFailedOnly",
    "JobReject",
    "JobResult",
    "Note",
    "Notes",
    "Other",
    "Poke",
    "Reply",
    "Start",
    "Status",
    "Ticket",
    "Unregistered",
    "assert_init_first",
    "events_of",
    "fresh_key",
    "record",
    "wait_applied",
]
