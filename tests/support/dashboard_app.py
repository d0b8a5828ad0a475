"""The application the dashboard tests serve, and how they start the dashboard.

Entities: one that waits for an operator's decision, one whose signal handler fails
until it is "fixed", and one that only fills the entity list; the `corral.App`s naming
them. The dashboard runs in a subprocess through `corral.dashboard.run` (`start`), a
pure client (`host=False`) as `corral ui` is; the test process opens its own runtime on
the same store and hosts the entities, so dead letters appear, and replayed signals are
applied, where `BROKEN` is set and cleared. No test process imports `corral.dashboard`.
The dashboard never creates a store, so `start` has the application create it first.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

import corral
from step_history_entities import Gated, Hostile, Ticket

__all__ = [
    "APP",
    "BROKEN",
    "ENTITIES",
    "HEADER_APP",
    "LIMITED_APP",
    "LIMITS",
    "OPERATORS",
    "Dashboard",
    "Decision",
    "Ledger",
    "Note",
    "Refund",
    "RefundInput",
    "Tally",
    "authorize",
    "create_store",
    "dead_notes",
    "eventually",
    "fresh",
    "from_header",
    "serve",
    "start",
    "waiting_refund",
]

T = TypeVar("T")

OPERATORS = frozenset({"dashboard", "ops-ana", "ops-bob"})
"""Who may decide, replay and discard: the token dashboard's operator and the two that
`from_header` recognises. `authorize` refuses an operator call from anyone else, so a
dashboard that passed on a sender from the browser would be refused."""

BROKEN = threading.Event()
"""While set, `Ledger.add` raises (the bug); cleared, it applies (the fix deployed)."""


class Decision(BaseModel):
    """The operator's decision on a refund."""

    approved: bool
    note: str = ""


class RefundInput(BaseModel):
    amount: int


class Refund(corral.Entity):
    """Waits, durably and without a deadline, for an operator's `approval`; returns it."""

    approval = corral.wait(Decision)

    def __init__(self, init: RefundInput) -> None:
        self.amount = init.amount

    async def run(self) -> Decision:
        return await self.wait_for_signal(Refund.approval)


class Note(BaseModel):
    text: str


class Ledger(corral.Entity):
    """Appends notes; its handler raises while `BROKEN` is set, so with one attempt the
    note is dead-lettered at once, and a replay after the fix applies it."""

    retry = corral.RetryPolicy(max_attempts=1)

    def __init__(self) -> None:
        self.notes: list[str] = []

    @corral.signal
    def add(self, note: Note) -> None:
        if BROKEN.is_set():
            raise RuntimeError(f"ledger is broken: cannot add {note.text!r}")
        self.notes.append(note.text)

    @corral.query
    def lines(self) -> list[str]:
        return list(self.notes)


class Tally(corral.Entity):
    """Counts; only the listing tests make these, so they know every one there is. A run
    ends when `stop` is signalled, with the count as its result."""

    def __init__(self) -> None:
        self.count = 0
        self.stopped = False

    @corral.signal
    def bump(self) -> None:
        self.count += 1

    @corral.signal
    def stop(self) -> None:
        self.stopped = True

    @corral.query
    def total(self) -> int:
        return self.count

    async def run(self) -> int:
        await self.wait_for(lambda: self.stopped)
        return self.count


class Stuck(corral.Entity):
    """`run()` has a bug: the run is suspended (retried an hour later, unless resumed)."""

    run_retry = corral.RetryPolicy(max_attempts=None, initial_backoff=3600, max_backoff=3600)

    async def run(self) -> None:
        raise KeyError("no template <b>for</b> this")


ENTITIES: list[type[corral.Entity]] = [Refund, Ledger, Tally, Stuck, Ticket, Gated, Hostile]


def authorize(request: corral.AuthRequest) -> str | bool | None:
    """Operator calls (deliver, replay, discard) only from `OPERATORS`; no query of a
    key that starts with "secret-" (whoever asks); no read of a key that starts with
    "hidden-", and none at all by "ops-bob"; no schedule write for a key that starts
    with "hidden-"; the rest as claimed."""
    if request.kind in ("deliver", "replay", "discard"):
        return request.sender if request.sender in OPERATORS else False
    if request.kind == "schedule" and request.key.startswith("hidden-"):
        return False
    if request.kind == "query" and request.key.startswith("secret-"):
        return False
    if request.kind == "read" and (request.key.startswith("hidden-")
                                   or request.sender == "ops-bob"):
        return False
    return request.sender


def from_header(request: Any) -> str | None:
    """The dashboard's `authenticate` as behind an authenticating proxy: the operator's
    name from `X-Operator`, if it is one of ours (None: 401)."""
    name = request.headers.get("x-operator")
    return name if name in ("ops-ana", "ops-bob") else None


APP = corral.App(entities=ENTITIES, authorize=authorize)
"""Signed in with the bearer token `corral.dashboard.run` is given or generates."""

HEADER_APP = corral.App(entities=ENTITIES, authorize=authorize,
                        authenticate=from_header)
"""Signed in by `from_header`."""


LIMITS = corral.Limits(max_payload_bytes=1024, key_pattern=r"[a-z0-9-]+(~[a-z0-9-]+)?")
"""The application's own limits: payloads up to 1 KiB, and keys that may hold one `~`
(which the default pattern refuses)."""

LIMITED_APP = corral.App(entities=ENTITIES, authorize=authorize, limits=LIMITS)
"""Signed in with the bearer token, validating with `LIMITS`."""

_APPS = {"token": APP, "header": HEADER_APP, "limited": LIMITED_APP}


def serve(store: str, app: str, token: str) -> None:
    """`corral.dashboard.run` on a port the kernel picks (it prints the URL)."""
    import corral.dashboard

    corral.dashboard.run(store, _APPS[app], port=0, token=token or None)



# -- the test side ---------------------------------------------------------------------


@dataclass(frozen=True)
class Dashboard:
    """A running dashboard: its base URL (no trailing slash) and the token it printed
    (None when the application authenticates)."""

    url: str
    token: str | None
    store: str


@contextmanager
def start(store: str, tmp: Path, app: str = "token") -> Iterator[Dashboard]:
    """`corral.dashboard.run` in a subprocess on a free port, until SIGTERM, after which
    it must have exited cleanly and logged no error (a server-side exception would be).
    The store is created first, as the application would (`create_store`)."""
    create_store(store)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    log = tmp / f"dashboard-{app}.log"
    with log.open("w") as errors:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys, dashboard_app; dashboard_app.serve(*sys.argv[1:])",
             store, app, ""], stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
    try:
        assert proc.stdout is not None
        printed = [proc.stdout.readline() for _ in range(1 if app == "header" else 3)]
        assert printed[0].startswith("corral dashboard: http://127.0.0.1:"), \
            f"{printed!r}\n{log.read_text()}"
        url = printed[0].split()[-1].rstrip("/")
        token = None
        if app != "header":  # the URL, the generated token, the sign-in link
            assert printed[1].startswith("token: "), printed
            token = printed[1].split()[-1]
            assert printed[2].strip() == f"sign in: {url}/login?token={token}", printed
        yield Dashboard(url, token, store)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
    logged = log.read_text()
    assert code == 0, f"the dashboard exited with {code}:\n{logged}"
    assert "Traceback" not in logged, logged
    assert "ERROR" not in logged, logged


def create_store(store: str, *, shards: int = 16) -> None:
    """Open (so create) the store at `store` as the application does, and close it; in
    a thread of its own, so that a test's running event loop may call it too."""
    async def create() -> None:
        async with corral.open_runtime(store, entities=ENTITIES, shards=shards, host=False):
            pass

    with concurrent.futures.ThreadPoolExecutor(1) as worker:
        worker.submit(asyncio.run, create()).result()


async def eventually(probe: Callable[[], Awaitable[T | None]], *, timeout: float = 15.0,
                     what: str = "the condition") -> T:
    """`probe()`'s first truthy answer, asked with backoff; fails after `timeout` s."""
    loop = asyncio.get_running_loop()
    deadline, delay = loop.time() + timeout, 0.005
    while True:
        found = await probe()
        if found:
            return found
        if loop.time() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.1)


def fresh(prefix: str) -> str:
    """A key no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def waiting_refund(rt: corral.Runtime, key: str) -> corral.EntityRef[Refund, RefundInput]:
    """A refund whose run waits on `approval`."""
    ref = rt.ref(Refund, key)
    await ref.start(start=RefundInput(amount=40))

    async def waiting() -> bool:
        return bool((await ref.describe()).open_waits)

    await eventually(waiting, what=f"{key} waiting on approval")
    return ref


async def dead_notes(rt: corral.Runtime, key: str, *texts: str) -> list[corral.DeadLetter]:
    """Notes sent while `BROKEN` is set: each is dead-lettered after its one attempt."""
    assert BROKEN.is_set()
    ref = rt.ref(Ledger, key)
    for text in texts:
        await ref.signal_with_start(Ledger.add, Note(text=text), start=None)

    async def all_dead() -> list[corral.DeadLetter] | None:
        found = await ref.dead_letters()
        return found if len(found) == len(texts) else None

    return await eventually(all_dead, what=f"{len(texts)} dead letters of {key}")
