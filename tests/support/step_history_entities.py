"""Entities whose steps retry, fail for good, or keep retrying until a test lets them
through: what `history()`, `corral history`, the dashboard and the metrics show of steps.
Each step function logs its call to a side file (its attempts are counted from it)."""

from __future__ import annotations

import os

from pydantic import BaseModel

import corral
from corral.persistence import STEP_HISTORY_PER_RUN
from step_entities import _count, _log  # the side file of calls


class TicketInput(BaseModel):
    log: str


class Reply(BaseModel):
    text: str
    attempt: int


def model_fails_twice(log: str, ticket: int) -> Reply:
    """A model call that fails on its first two attempts, then answers."""
    attempt = _count(log, f"model:{ticket}") + 1
    _log(log, f"model:{ticket}")
    if attempt <= 2:
        raise ConnectionError(f"model overloaded (attempt {attempt})")
    return Reply(text=f"answer to {ticket}", attempt=attempt)


def tool_is_down(log: str, ticket: int) -> int:
    """A tool call that always fails."""
    _log(log, f"tool:{ticket}")
    raise RuntimeError(f"tool for {ticket} is down")


FAST = corral.RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.01)


class Ticket(corral.Entity):
    """One step that fails twice then succeeds, one that fails for good (3 attempts)."""

    reply: Reply | None

    def __init__(self, init: TicketInput) -> None:
        self.log = init.log
        self.reply: Reply | None = None
        self.failure = ""

    @corral.query
    def failed(self) -> str:
        return self.failure

    async def run(self) -> Reply | None:
        self.reply = await self.step(model_fails_twice, self.log, 9104, name="model:9104",
                                     retry=FAST)
        try:
            await self.step(tool_is_down, self.log, 9104, name="tool:9104", retry=FAST)
        except corral.StepFailedError as err:
            self.failure = err.error
        return self.reply


def fails_until_gate(log: str, gate: str) -> str:
    """Fails until the file `gate` exists."""
    _log(log, "gated")
    if not os.path.exists(gate):
        raise ConnectionRefusedError("the gate is shut")
    return "through"


class Gated(corral.Entity):
    """One step retried (forever, every 10 ms) until the test opens its gate."""

    def __init__(self, init: TicketInput) -> None:
        self.log = init.log

    async def run(self) -> str:
        return await self.step(fails_until_gate, self.log, self.log + ".gate", name="gated",
                               retry=corral.RetryPolicy(max_attempts=None,
                                                        initial_backoff=0.01,
                                                        max_backoff=0.01))


def hostile_failure(size: int) -> None:
    """Fails with a message holding markup, a lone surrogate, control characters, a NUL
    and `size` more characters."""
    raise ValueError("bad <b>\ud800 \x00 \x1b[31m \u202e" + "x" * size)


class Hostile(corral.Entity):
    """A step whose error is hostile text (and huge); a step named with a colon."""

    def __init__(self, init: TicketInput) -> None:
        self.log = init.log
        self.failure = ""

    async def run(self) -> str:
        try:
            await self.step(hostile_failure, 1_000_000, name="hostile",
                            retry=corral.RetryPolicy(max_attempts=1))
        except corral.StepFailedError as err:
            self.failure = err.error
        return self.failure[:100]


def echo(n: int) -> int:
    return n


class Many(corral.Entity):
    """`STEP_HISTORY_PER_RUN + 1` steps, then a checkpoint, then waits to be let go."""

    def __init__(self, init: TicketInput) -> None:
        self.made = 0
        self.go = False

    @corral.signal
    def proceed(self) -> None:
        self.go = True

    @corral.query
    def checkpointed(self) -> bool:
        return self.made > STEP_HISTORY_PER_RUN

    async def run(self) -> int:
        for n in range(self.made, STEP_HISTORY_PER_RUN + 1):
            await self.step(echo, n, name=f"s:{n}")
        await self.checkpoint()
        self.made = STEP_HISTORY_PER_RUN + 1
        await self.wait_for(lambda: self.go)
        return self.made


app = corral.App(entities=[Ticket, Gated, Hostile, Many])
"""The CLI's application (`--app step_history_entities:app`)."""


class RayTicket(corral.Entity):
    """`Ticket`'s two steps, each attempt a Ray task."""

    def __init__(self, init: TicketInput) -> None:
        self.log = init.log

    async def run(self) -> str:
        reply = await self.step(model_fails_twice, self.log, 1, name="model:1", retry=FAST,
                                ray_options={"num_cpus": 0})
        try:
            await self.step(tool_is_down, self.log, 1, name="tool:1", retry=FAST,
                            ray_options={"num_cpus": 0})
        except corral.StepFailedError as err:
            return f"{reply.text}; {err.error}"
        return reply.text
