"""Entities whose `run()` makes durable steps, and step functions that log each call
to a side file (one line per call: a crash or a replay cannot hide a repeated call)."""

from __future__ import annotations

import asyncio
import os
import time

from pydantic import BaseModel

import corral


class AgentInput(BaseModel):
    log: str
    steps: int = 3
    pause: float = 0.0  # seconds each model call takes (a kill then lands mid-call)


class Answer(BaseModel):
    n: int
    text: str
    key: str


def _count(path: str, line: str) -> int:
    try:
        with open(path) as f:
            return f.read().splitlines().count(line)
    except FileNotFoundError:
        return 0


def _log(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def call_model(log: str, n: int) -> Answer:
    """A sync step function: logs its call, answers with its step key."""
    _log(log, f"model:{n}")
    return Answer(n=n, text=f"answer {n}", key=corral.step_key())


def call_model_paused(log: str, n: int, pause: float) -> Answer:
    """`call_model` taking `pause` seconds after it logged its call."""
    answer = call_model(log, n)
    time.sleep(pause)
    return answer


async def slow_then_fast(log: str, n: int) -> int:
    """Times out on its first attempt (the log has no line yet), then answers."""
    calls = _count(log, f"slow:{n}")
    _log(log, f"slow:{n}")
    if calls == 0:
        await asyncio.sleep(60)
    return n * 10


def always_fails(log: str, n: int) -> int:
    _log(log, f"fail:{n}")
    raise RuntimeError(f"tool {n} is down")


class Agent(corral.Entity):
    """Makes `steps` model steps over its state, then waits for `proceed`."""

    def __init__(self, init: AgentInput) -> None:
        self.log = init.log
        self.total = init.steps
        self.answers: list[Answer] = []
        self.go = False

    @corral.signal
    def poke(self) -> None:
        pass

    @corral.signal
    def proceed(self) -> None:
        self.go = True

    @corral.query
    def count(self) -> int:
        return len(self.answers)

    async def run(self) -> list[Answer]:
        while len(self.answers) < self.total:
            n = len(self.answers)
            self.answers.append(await self.step(call_model, self.log, n, name=f"model:{n}"))
        await self.wait_for(lambda: self.go)
        return self.answers


class Outcome(BaseModel):
    value: int | None = None
    error: str | None = None
    attempts: int | None = None


class Flaky(corral.Entity):
    """One step with a per-attempt timeout, one that exhausts its retries."""

    def __init__(self, init: AgentInput) -> None:
        self.log = init.log
        self.go = False
        self.outcomes: list[Outcome] = []

    @corral.signal
    def proceed(self) -> None:
        self.go = True

    @corral.query
    def done(self) -> bool:
        return len(self.outcomes) == 2

    async def run(self) -> list[Outcome]:
        fast = corral.RetryPolicy(max_attempts=3, initial_backoff=0.01)
        self.outcomes = []  # run() restarts from the top: rebuilt from the records
        value = await self.step(slow_then_fast, self.log, 1, name="slow", timeout=0.2,
                                retry=fast)
        self.outcomes.append(Outcome(value=value))
        try:
            await self.step(always_fails, self.log, 2, name="tool", retry=fast)
            self.outcomes.append(Outcome())
        except corral.StepFailedError as err:
            self.outcomes.append(Outcome(error=err.error, attempts=err.attempts))
        await self.wait_for(lambda: self.go)
        return self.outcomes


class Reuser(corral.Entity):
    """Uses one step name twice; after a checkpoint it may use it again."""

    def __init__(self, init: AgentInput) -> None:
        self.log = init.log
        self.seen: list[str] = []

    async def run(self) -> list[str]:
        first = await self.step(call_model, self.log, 0, name="model")
        await self.checkpoint()  # covers "model": its record goes, its name is free
        again = await self.step(call_model, self.log, 1, name="model")
        try:
            await self.step(call_model, self.log, 2, name="model")
        except corral.DuplicateStepError:
            self.seen.append("duplicate")
        return [first.text, again.text, *self.seen]


class Reason(BaseModel):
    n: int
    text: str


class EscalationInput(BaseModel):
    team: str = "l2"


class Escalation(corral.Entity):
    """The target of sends: keeps what it was sent, in order."""

    def __init__(self, init: EscalationInput) -> None:
        self.team = init.team
        self.received: list[int] = []

    @corral.signal
    def open(self, reason: Reason) -> None:
        self.received.append(reason.n)

    @corral.query
    def seen(self) -> list[int]:
        return self.received


class Dispatcher(corral.Entity):
    """A model step per item, each followed by a send to one `Escalation`; a checkpoint
    every `every` items (steps and sends between them replay after a crash)."""

    every = 5

    def __init__(self, init: AgentInput) -> None:
        self.log = init.log
        self.total = init.steps
        self.pause = init.pause
        self.done = 0
        self.go = False

    @corral.signal
    def proceed(self) -> None:
        self.go = True

    @corral.query
    def progress(self) -> int:
        return self.done

    async def run(self) -> int:
        while self.done < self.total:
            n = self.done
            answer = await self.step(call_model_paused, self.log, n, self.pause,
                                     name=f"model:{n}")
            self.send(Escalation, "esc-" + self.key, Escalation.open,
                      Reason(n=n, text=answer.text), start=EscalationInput())
            self.done += 1
            if self.done % self.every == 0:
                await self.checkpoint()
        await self.wait_for(lambda: self.go)
        return self.done


def gated_model(log: str, gate: str) -> Answer:
    """A model call as a Ray task: logs its call, waits for the test to open `gate`,
    answers with its process id and step key."""
    _log(log, "ray-model")
    while not os.path.exists(gate):
        time.sleep(0.01)
    return Answer(n=os.getpid(), text="from a Ray task", key=corral.step_key())


class RayAgent(corral.Entity):
    """One step run as a Ray task."""

    def __init__(self, init: AgentInput) -> None:
        self.log = init.log
        self.answer: Answer | None = None
        self.go = False

    @corral.signal
    def proceed(self) -> None:
        self.go = True

    @corral.query
    def answered(self) -> Answer | None:
        return self.answer

    async def run(self) -> Answer:
        self.answer = await self.step(gated_model, self.log, self.log + ".gate", name="model",
                                      ray_options={"num_cpus": 0.01})
        await self.wait_for(lambda: self.go)
        return self.answer


def model_on_node(log: str, gate: str) -> str:
    """A model call pinned by a custom resource: logs the node it runs on (and, beside
    it, the trace it runs in: its attempt's, continued in the task), waits for the test
    to open `gate`, answers with that node's id."""
    import ray
    from opentelemetry import trace

    node = ray.get_runtime_context().get_node_id()
    context = trace.get_current_span().get_span_context()
    _log(log + ".trace", f"{node} {context.trace_id:032x}")
    _log(log, node)
    while not os.path.exists(gate):
        time.sleep(0.01)
    return node


class NodeAgent(corral.Entity):
    """One step as a Ray task on a node with the `model` resource."""

    def __init__(self, init: AgentInput) -> None:
        self.log = init.log

    async def run(self) -> str:
        return await self.step(model_on_node, self.log, self.log + ".gate", name="model",
                               ray_options={"num_cpus": 0, "resources": {"model": 1}})


class Forward(BaseModel):
    n: int
    fail_first: bool = False  # the handler raises on its first attempt, after sending


class Relay(corral.Entity):
    """Sends from its handlers: each `forward` sends `2n` and `2n + 1` to its
    `Escalation`; `ask` (an update) sends `n` and answers, or raises after sending."""

    retry = corral.RetryPolicy(max_attempts=3, initial_backoff=0.01)

    def __init__(self, init: EscalationInput) -> None:
        self.forwarded = 0
        self.failed: list[int] = []

    @corral.signal
    def forward(self, item: Forward) -> None:
        target = "esc-" + self.key
        for n in (2 * item.n, 2 * item.n + 1):
            self.send(Escalation, target, Escalation.open, Reason(n=n, text="relayed"),
                      start=EscalationInput())
        if item.fail_first and item.n not in self.failed:
            self.failed.append(item.n)
            raise RuntimeError("the first attempt fails after its sends")
        self.forwarded += 1

    @corral.update
    async def ask(self, item: Forward) -> int:
        self.send(Escalation, "esc-" + self.key, Escalation.open,
                  Reason(n=item.n, text="asked"), start=EscalationInput())
        if item.fail_first:
            raise ValueError("refused after a send")
        return item.n

    @corral.query
    def count(self) -> int:
        return self.forwarded

    @corral.query
    def peek(self) -> int:
        self.send(Escalation, "esc-" + self.key, Escalation.open, Reason(n=-1, text="no"))
        return 0
