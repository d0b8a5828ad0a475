"""An AI agent working one support ticket: durable steps and entity-to-entity sends.

Run it:

    .venv/bin/python examples/ai_agent.py            # a demo on a SQLite file in a temp dir
    .venv/bin/python examples/ai_agent.py --ray      # the model call as a Ray task

The ticket is the entity, its key the ticket id. Webhooks deliver customer replies
with signal-with-start; the handler only buffers them. `run()` drains the inbox, one
reply at a time, and for each:

- calls the "model" as a durable step (`await self.step(draft_reply, ...)`), a small
  deterministic function standing in for inference; with `--ray` it runs as a Ray task
  (`ray_options={"num_cpus": 1}`; `{"num_gpus": 1}` on a GPU cluster);
- calls a "tool" as another step (`lookup_order`), when the reply names an order;
- hands a refund to the tenant's `Escalation` entity with `self.send(...)`, which is
  written with the agent's progress and delivered exactly once;
- answers, takes the reply off the inbox and checkpoints: the checkpoint covers the
  reply's steps, so their records go and the state carries their results.

After a crash, `run()` starts again from the latest snapshot: a step whose result was
recorded returns it without calling the model again, and a send made again before such
a step is dropped (it was written then). Each step's name comes from the reply it works
on (`f"model:{reply.id}"`), so a restart finds its record whatever `run()` did before.
The model and the tool get `corral.step_key()`, a key stable across attempts and
restarts, to pass to the outside system as an idempotency key.
"""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import corral

CALLS: Counter[str] = Counter()  # this process's step calls, by step key (the demo's proof)


class TicketInput(BaseModel):
    tenant: str
    subject: str
    model_on_ray: bool = False


class Reply(BaseModel):
    id: str
    text: str


class Draft(BaseModel):
    text: str
    wants_refund: bool
    order_id: str | None = None


class Order(BaseModel):
    id: str
    status: str


class Case(BaseModel):
    ticket: str
    order_id: str | None
    summary: str


class EscalationInput(BaseModel):
    tenant: str


class Outcome(BaseModel):
    ticket: str
    answers: list[str]
    escalated: int


def draft_reply(text: str) -> Draft:
    """The "model": reads the customer's words, drafts an answer (deterministic)."""
    CALLS[corral.step_key()] += 1
    order = re.search(r"#(\d+)", text)
    return Draft(text=f"Thanks for writing: {text!r}", wants_refund="refund" in text.lower(),
                 order_id=order.group(1) if order else None)


async def lookup_order(order_id: str) -> Order:
    """The "tool": an order system's API (an async call)."""
    CALLS[corral.step_key()] += 1
    await asyncio.sleep(0)
    return Order(id=order_id, status="delivered")


class Escalation(corral.Entity):
    """The tenant's queue of cases for a human; agents send cases to it."""

    tenant: str
    cases: list[Case]  # state is annotated: snapshotted as JSON through pydantic

    def __init__(self, init: EscalationInput) -> None:
        self.tenant = init.tenant
        self.cases = []

    @corral.signal
    def open_case(self, case: Case) -> None:
        self.cases.append(case)

    @corral.query
    def open_cases(self) -> list[Case]:
        return self.cases


class AiAgent(corral.Entity):
    """One ticket's agent: replies buffered by the handler, worked by `run()`."""

    tenant: str
    model_on_ray: bool
    inbox: list[Reply]
    answers: list[str]
    escalated: int
    resolved: bool

    def __init__(self, init: TicketInput) -> None:
        self.tenant = init.tenant
        self.model_on_ray = init.model_on_ray
        self.inbox = []
        self.answers = []
        self.escalated = 0
        self.resolved = False

    @corral.signal
    def customer_reply(self, reply: Reply) -> None:
        self.inbox.append(reply)  # buffer, never process: run() does

    @corral.query
    def answered(self) -> list[str]:
        return self.answers

    async def run(self) -> Outcome:
        while not self.resolved:
            await self.wait_for(lambda: bool(self.inbox))
            reply = self.inbox[0]
            ray_options = {"num_cpus": 1} if self.model_on_ray else None
            draft = await self.step(draft_reply, reply.text, name=f"model:{reply.id}",
                                    timeout=60, ray_options=ray_options)
            answer = draft.text
            if draft.order_id is not None:
                order = await self.step(lookup_order, draft.order_id,
                                        name=f"tool:{reply.id}", timeout=10)
                answer += f" Order {order.id} is {order.status}."
            if draft.wants_refund:
                self.send(Escalation, f"escalations-{self.tenant}", Escalation.open_case,
                          Case(ticket=self.key, order_id=draft.order_id, summary=reply.text),
                          start=EscalationInput(tenant=self.tenant))
                self.escalated += 1
            self.answers.append(answer)
            self.resolved = "thanks" in reply.text.lower()
            self.inbox.pop(0)
            await self.checkpoint()  # covers this reply's steps and its send
        return Outcome(ticket=self.key, answers=self.answers, escalated=self.escalated)


@dataclass
class Report:
    outcome: Outcome
    cases: list[Case]
    calls: dict[str, int] = field(default_factory=dict)


WEBHOOKS = [
    Reply(id="m-1", text="My parcel #4411 never arrived, I want a refund"),
    Reply(id="m-1", text="My parcel #4411 never arrived, I want a refund"),  # a retry
    Reply(id="m-2", text="Found it at the neighbour's, thanks!"),
]


async def main(store: str | Path, *, ray: bool = False, **options: Any) -> Report:
    """Deliver the webhooks to `ticket-7` at `store`, wait for the agent's outcome."""
    async with corral.open_runtime(str(store), entities=[AiAgent, Escalation],
                                   **options) as rt:
        agent = rt.ref(AiAgent, "ticket-7")
        for reply in WEBHOOKS:
            await agent.signal_with_start(
                AiAgent.customer_reply, reply, message_id=reply.id,
                start=TicketInput(tenant="acme", subject="parcel", model_on_ray=ray))
        outcome = await agent.result(timeout=120)
        escalations = rt.ref(Escalation, "escalations-acme")
        while not (cases := await escalations.query(Escalation.open_cases)):
            await asyncio.sleep(0.01)  # the send is delivered just after its commit
        return Report(outcome, cases, dict(CALLS))


if __name__ == "__main__":
    on_ray = "--ray" in sys.argv[1:]
    if on_ray:
        import ray

        ray.init(include_dashboard=False)
    with tempfile.TemporaryDirectory() as tmp:
        report = asyncio.run(main(Path(tmp) / "ai-agent.db", ray=on_ray))
    for answer in report.outcome.answers:
        print("agent:", answer)
    for case in report.cases:
        print(f"escalated: {case.ticket} order {case.order_id}: {case.summary!r}")
    print("step calls in this process:", report.calls or "(the model ran as Ray tasks)")
