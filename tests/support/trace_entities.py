"""Entities for tests/runtime/test_tracing.py: a case whose `run()` answers each reply
with a model step that fails twice before it answers, then sends the answer on."""

from __future__ import annotations

import os
import time

from pydantic import BaseModel

import corral


class CaseInput(BaseModel):
    log: str  # one line per step attempt
    fails: int = 2  # attempts that fail before one answers


class Reply(BaseModel):
    text: str


class Note(BaseModel):
    text: str


def flaky_model(log: str, n: int, fails: int) -> str:
    """Fails its first `fails` attempts of reply `n` (counted in `log`), then answers."""
    with open(log, "a+") as f:
        f.seek(0)
        before = f.read().splitlines().count(f"model:{n}")
        f.write(f"model:{n}\n")
    if before < fails:
        raise ConnectionError(f"model unavailable (attempt {before + 1})")
    return f"answer to reply {n}"


class NotifierInput(BaseModel):
    channel: str = "email"


class Notifier(corral.Entity):
    """The second entity: keeps the notes it is sent."""

    notes: list[str]

    def __init__(self, init: NotifierInput) -> None:
        self.notes = []

    @corral.signal
    def note(self, note: Note) -> None:
        self.notes.append(note.text)

    @corral.query
    def seen(self) -> list[str]:
        return self.notes

    @corral.update
    def count(self) -> int:
        return len(self.notes)


class Case(corral.Entity):
    """Answers each reply in `run()` with a model step (retried), then notifies."""

    replies: list[str]
    answered: int

    def __init__(self, init: CaseInput) -> None:
        self.log = init.log
        self.fails = init.fails
        self.replies = []
        self.answered = 0

    @corral.signal
    def reply(self, reply: Reply) -> None:
        if os.path.exists(self.log + ".hold"):  # a test kills the host here
            with open(self.log + ".held", "w"):
                pass
            while True:
                time.sleep(1)
        self.replies.append(reply.text)

    async def run(self) -> None:
        retry = corral.RetryPolicy(max_attempts=5, initial_backoff=0.01)
        while True:
            await self.wait_for(lambda: self.answered < len(self.replies))
            n = self.answered
            answer = await self.step(flaky_model, self.log, n, self.fails, name=f"model:{n}",
                                     retry=retry)
            self.send(Notifier, f"notes-{self.key}", Notifier.note, Note(text=answer),
                      start=NotifierInput())
            self.answered += 1


class Traced(corral.Entity):
    """A handler that starts a span of its own, as an application's code does."""

    @corral.signal
    def work(self) -> None:
        from opentelemetry import trace

        with trace.get_tracer("app").start_as_current_span("app work"):
            pass


class TaskContext(BaseModel):
    traceparent: str | None
    pid: int


def context_in_task() -> TaskContext:
    """What a step's code sees of the trace, in the Ray task that runs it."""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    traceparent = None if not context.is_valid else (
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}")
    return TaskContext(traceparent=traceparent, pid=os.getpid())


class Tasked(corral.Entity):
    """Runs one step as a Ray task for each `go` applied."""

    seen: list[TaskContext]
    wanted: int

    def __init__(self) -> None:
        self.seen = []
        self.wanted = 0

    @corral.signal
    def go(self) -> None:
        self.wanted += 1

    @corral.query
    def contexts(self) -> list[TaskContext]:
        return self.seen

    async def run(self) -> None:
        while True:
            await self.wait_for(lambda: len(self.seen) < self.wanted)
            self.seen.append(await self.step(context_in_task, name=f"task:{len(self.seen)}",
                                             ray_options={"num_cpus": 0}))


class Poison(BaseModel):
    fatal: bool = False  # `run()` raises once it sees it (its run is suspended)


class Brittle(corral.Entity):
    """A handler that raises on every call (its message is dead-lettered), and a
    `run()` that raises after a `crash` (its run is suspended)."""

    retry = corral.RetryPolicy(max_attempts=2, initial_backoff=0.01)
    crashed: bool

    def __init__(self) -> None:
        self.crashed = False

    @corral.signal
    def poison(self, poison: Poison) -> None:
        raise ValueError("cannot parse this reply")

    @corral.signal
    def crash(self) -> None:
        self.crashed = True

    async def run(self) -> None:
        await self.wait_for(lambda: self.crashed)
        raise RuntimeError("run() hit a bug")
