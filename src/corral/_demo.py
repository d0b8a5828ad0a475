"""The ticket agent: signal-with-start fed by at-least-once webhooks.

This is the one copy of the ticket-agent example. `corral demo` runs it, and
`examples/ticket_agent.py` is the standalone program built on it; it lives in the
package so that the `corral` command works wherever corral is installed.

The story: a helpdesk fires a webhook each time the customer replies to ticket 9104.
Webhooks arrive concurrently, in no particular order, and the same one may arrive two
or three times. Each webhook makes exactly one call:

    await rt.ref(TicketAgent, "ticket-9104").signal_with_start(
        TicketAgent.customer_reply, reply,
        start=TicketInput(...),        # sent every time; used only if a run starts
        message_id=ev.message_id,      # the provider's id: a retry is a duplicate
    )

The caller never asks whether the agent exists. Exactly one of the concurrent calls
starts the run, every reply is delivered to it once, and a retried webhook is answered
`"duplicate"` instead of being delivered again (the runtime dedupes on `message_id`,
so the entity needs no `seen` set of its own).

The entity follows the pattern's rules: everything a handler touches is created in
`__init__` (on a cold start the signal handler runs before `run()` has begun); replies
are buffered, never processed, on arrival: `customer_reply` is a mailbox signal with a
reorder window (`corral.signal(Reply, order_by="at", hold=HOLD)`), so `run()` takes
them in the order of the provider's timestamp, each held `HOLD` seconds after it was
accepted for an earlier-stamped one still on its way. Arrival order across concurrent
senders means nothing, and sorting what has arrived would miss a reply that arrives
later; one that arrives more than `HOLD` seconds late is taken at its turn, flagged
`late`, never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import corral
from corral.runtime import stop_ray_hosts

__all__ = [
    "AGENT",
    "HOLD",
    "TICKET_ID",
    "WEBHOOKS",
    "Answer",
    "Assign",
    "Assigned",
    "DemoReport",
    "Outcome",
    "Reply",
    "ReplyWebhook",
    "TicketAgent",
    "TicketInput",
    "TicketStatus",
    "format_report",
    "on_customer_reply",
    "remove_store",
    "run_demo",
]


# -- messages (every handler takes one pydantic model, so fields can be added later) ---


class TicketInput(BaseModel):
    """The start input: used only by the call that starts a run, ignored otherwise."""

    tenant: str
    subject: str


class Reply(BaseModel):
    """One customer reply, as delivered to the agent."""

    message_id: str
    body: str
    at: datetime
    """The provider's timestamp: the only trustworthy order of concurrent replies."""
    closes_ticket: bool = False


class Assign(BaseModel):
    agent: str


class Assigned(BaseModel):
    agent: str
    waiting: int
    """Replies buffered when the assignment was applied."""


class TicketStatus(BaseModel):
    tenant: str
    subject: str
    assignee: str | None
    waiting: int
    answered: int
    resolved: bool


class Answer(BaseModel):
    reply: Reply
    text: str
    late: bool = False
    """Stamped before a reply answered earlier: it arrived after its reorder window."""


class Outcome(BaseModel):
    """What the run returns; `ref.result()` gives it back as this model."""

    ticket: str
    tenant: str
    assignee: str
    resolved: bool
    answered: list[Answer]


# -- the entity ------------------------------------------------------------------------

HOLD = 1.0
"""Seconds each reply is held for an earlier-stamped one still on its way (the reorder
window; a real helpdesk's retries may need more)."""


class TicketAgent(corral.Entity):
    """An agent working one support ticket; its key is the ticket id (`ticket-9104`)."""

    # A customer reply goes to the mailbox, never processed on arrival: run() takes
    # the replies in the order of the provider's timestamp (`at`), each held HOLD
    # seconds after it was accepted, so an earlier-stamped one still on its way comes
    # first. Replies waiting in the mailbox are part of the state its snapshots keep.
    customer_reply = corral.signal(Reply, order_by="at", hold=HOLD)

    # The state its snapshots keep, as JSON through pydantic (plain values such as
    # `tenant` need no annotation; a list of models does).
    answered: list[Answer]

    def __init__(self, init: TicketInput) -> None:
        # Runs before any handler, on every activation: the `assign` update finds
        # its state here even when it comes before run() has begun.
        self.tenant = init.tenant
        self.subject = init.subject
        self.assignee: str | None = None
        self.answered = []
        self.resolved = False

    @corral.update
    def assign(self, req: Assign) -> Assigned:
        """Give the ticket to an agent; the caller gets an answer back (request-response)."""
        self.assignee = req.agent
        return Assigned(agent=req.agent, waiting=len(self.mailbox))

    @corral.query
    def status(self) -> TicketStatus:
        return TicketStatus(
            tenant=self.tenant, subject=self.subject, assignee=self.assignee,
            waiting=len(self.mailbox), answered=len(self.answered), resolved=self.resolved,
        )

    async def run(self) -> Outcome:
        # Loop over state, not local variables: after a crash run() starts again from
        # the top with the latest snapshot plus the messages applied after it.
        # Replies wait in the mailbox until someone is assigned (the `assign` update).
        await self.wait_for(lambda: self.assignee is not None)
        while not self.resolved:
            # The reply the customer wrote first, by the provider's timestamp (arrival
            # order means nothing across concurrent senders), once its window passed.
            reply: Reply = await self.mailbox.get()
            self.answered.append(Answer(reply=reply, text=self._draft_answer(reply),
                                        late=self.mailbox.late))
            self.resolved = reply.closes_ticket
            # Snapshot now: a restart resumes after this reply. (A crash before this
            # line answers it again: effects in run() happen at least once.)
            await self.checkpoint()
        assert self.assignee is not None
        return Outcome(ticket=self.key, tenant=self.tenant, assignee=self.assignee,
                       resolved=True, answered=self.answered)

    def _draft_answer(self, reply: Reply) -> str:
        # Where a real agent would call a model or send an email. Here: no network.
        if reply.closes_ticket:
            return f"Glad it works now. Closing {self.key}."
        return f"{self.assignee} on {self.subject!r}: noted, looking into it."


# -- the webhook side ------------------------------------------------------------------


class ReplyWebhook(BaseModel):
    """What the helpdesk POSTs when a customer replies."""

    ticket_id: int
    tenant: str
    subject: str
    message_id: str
    body: str
    at: datetime
    closes_ticket: bool = False


async def on_customer_reply(rt: corral.Runtime, ev: ReplyWebhook) -> corral.Ack:
    """The webhook handler: one atomic call, no existence check, start input every time."""
    reply = Reply(message_id=ev.message_id, body=ev.body, at=ev.at,
                  closes_ticket=ev.closes_ticket)
    return await rt.ref(TicketAgent, f"ticket-{ev.ticket_id}").signal_with_start(
        TicketAgent.customer_reply, reply,
        start=TicketInput(tenant=ev.tenant, subject=ev.subject),
        message_id=ev.message_id,
    )


TICKET_ID = 9104
AGENT = "atlas"


def _reply(message_id: str, hh_mm_ss: str, body: str, *, closes: bool = False) -> ReplyWebhook:
    h, m, s = (int(part) for part in hh_mm_ss.split(":"))
    return ReplyWebhook(
        ticket_id=TICKET_ID, tenant="acme", subject="CSV export fails",
        message_id=message_id, body=body,
        at=datetime(2024, 5, 14, h, m, s, tzinfo=timezone.utc), closes_ticket=closes,
    )


_M1 = _reply("msg-1", "10:02:11", "Exporting invoices to CSV fails with error 500.")
_M2 = _reply("msg-2", "10:02:14", "Only March fails; February exports fine.")
_M3 = _reply("msg-3", "10:02:15", "The download stops at about 40%.")
_M4 = _reply("msg-4", "10:03:02", "Removing the date filter makes it work.")
_M5 = _reply("msg-5", "10:05:40", "All good now, thanks! You can close it.", closes=True)

WEBHOOKS: tuple[ReplyWebhook, ...] = (_M3, _M1, _M3, _M5, _M2, _M1, _M4, _M3, _M2, _M5, _M4)
"""The deliveries, in the order they hit the server: out of order, most of them twice
or three times, and the closing reply early."""


# -- the scenario ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DemoReport:
    """Everything the scenario observed, for printing and for tests."""

    store: str
    deliveries: tuple[tuple[ReplyWebhook, corral.Ack], ...]
    waiting: TicketStatus
    assigned: Assigned
    outcome: Outcome
    description: corral.EntityDescription
    host: str = "this process (local backend)"
    """Where the ticket was hosted (with the Ray backend: the host actor)."""


async def run_demo(store: str | Path, *, timeout: float = 60.0, backend: str = "local",
                   namespace: str | None = None) -> DemoReport:
    """Deliver `WEBHOOKS` concurrently, assign the ticket, wait for the run's outcome.

    With `backend="ray"` the ticket is hosted by a host actor of a fresh deployment
    (`namespace`, default `demo-<random>`, its release declared here: `deploy=True`) on
    the Ray instance this process is connected to, or a local one started for the demo
    (or the cluster named by `RAY_ADDRESS`); the demo's actors are stopped at the end.
    """
    if backend == "ray":
        namespace = namespace or f"demo-{uuid.uuid4().hex[:8]}"
        async with corral.open_runtime(str(store), entities=[TicketAgent], backend="ray",
                                       deploy=True, namespace=namespace) as rt:
            try:
                report = await _scenario(rt, store, timeout)
                host = await _ray_host_of(rt)
            finally:
                await asyncio.to_thread(stop_ray_hosts, namespace)
        return dataclasses.replace(report, host=host)
    async with corral.open_runtime(str(store), entities=[TicketAgent]) as rt:
        return await _scenario(rt, store, timeout)


async def _ray_host_of(rt: corral.Runtime) -> str:
    """Which Ray actor, process and node hosted the ticket."""
    ray_backend: Any = rt.backend  # a RayBackend (typed loosely: Ray loads lazily)
    actor = await ray_backend.actor(TicketAgent.__name__, f"ticket-{TICKET_ID}")
    info = await actor.info.remote()
    return f"Ray actor {info['name']} (pid {info['pid']}, node {info['node_id'][:12]})"


async def _scenario(rt: corral.Runtime, store: str | Path, timeout: float) -> DemoReport:
    """The story itself, on whichever backend `rt` uses."""
    # All webhooks at once, as a busy web server would handle them.
    acks = await asyncio.gather(*(on_customer_reply(rt, ev) for ev in WEBHOOKS))
    ticket = rt.ref(TicketAgent, f"ticket-{TICKET_ID}")
    # A query sees every message accepted before it; with nobody assigned yet,
    # every reply is still waiting.
    waiting: TicketStatus = await ticket.query(TicketAgent.status)
    # Applied after every reply accepted above (one journal, one order), so the
    # agent finds all of them waiting when it starts answering.
    assigned: Assigned = await ticket.update(
        TicketAgent.assign, Assign(agent=AGENT), update_id=f"assign-{TICKET_ID}",
        timeout=timeout,
    )
    outcome: Outcome = await ticket.result(timeout=timeout)
    description = await ticket.describe()
    return DemoReport(str(store), tuple(zip(WEBHOOKS, acks, strict=True)), waiting, assigned,
                      outcome, description)


def remove_store(store: str | Path) -> None:
    """Delete a SQLite store file and its WAL side files, so a demo starts from scratch."""
    if str(store) == ":memory:":
        return
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            Path(f"{store}{suffix}").unlink()


def format_report(report: DemoReport) -> str:
    """The demo's story, as a person wants to read it."""
    acks = [ack for _, ack in report.deliveries]
    accepted = sum(ack.status == "accepted" for ack in acks)
    starters = [str(number) for number, ack in enumerate(acks, 1) if ack.started]
    unique = len({ev.message_id for ev, _ in report.deliveries})
    lines = [
        "corral demo: a ticket agent fed by at-least-once webhooks",
        f"store: {report.store}",
        f"host:  {report.host}",
        "",
        f"1. {len(acks)} webhooks for ticket-{TICKET_ID} arrive at once: {unique} customer "
        "replies, out of order,",
        "   most delivered two or three times. Each makes one call:",
        "   signal_with_start(customer_reply, reply, start=TicketInput(...), "
        "message_id=<provider id>)",
        "",
        "   #   message  sent at   ack        run  seq",
    ]
    for number, (ev, ack) in enumerate(report.deliveries, 1):
        note = "  <- this call started the run" if ack.started else ""
        lines.append(f"   {number:<3} {ev.message_id:<8} {ev.at:%H:%M:%S}  {ack.status:<10} "
                     f"{ack.run_id:>3}  {ack.seq:>3}{note}")
    status = report.waiting
    lines += [
        f"   => {accepted} accepted, {len(acks) - accepted} duplicate; "
        f"{len(starters)} call{'' if len(starters) == 1 else 's'} started the run "
        f"(#{', #'.join(starters)}); no call failed.",
        "",
        f"2. status() (a query): {status.waiting} replies waiting, {status.answered} answered, "
        f"assignee {status.assignee or 'none yet'}.",
        "   The mailbox only holds them; run() waits for an assignee.",
        "",
        "3. The dispatcher assigns the ticket (an update: the caller gets an answer back):",
        f"   assign(agent={AGENT!r}) -> agent={report.assigned.agent!r}, "
        f"{report.assigned.waiting} replies waiting",
        "",
        "4. The agent answers them in the provider's timestamp order, not arrival order",
        f"   (a reorder window: each reply held {HOLD:g} s for an earlier-stamped one; a",
        "   reply later than that would be answered at its turn, marked late):",
    ]
    answered = report.outcome.answered
    for answer in answered:
        reply = answer.reply
        late = "  (late)" if answer.late else ""
        lines.append(f"   {reply.at:%H:%M:%S}  {reply.message_id:<6} {reply.body}{late}")
    once = len({a.reply.message_id for a in answered}) == len(answered)
    d = report.description
    lines += [
        "",
        f"5. Outcome: {'resolved' if report.outcome.resolved else 'open'} by "
        f"{report.outcome.assignee}, {len(answered)} replies answered "
        f"({'each once' if once else 'SOME MORE THAN ONCE'}).",
        f"   {d.key}: run {d.run_id} {d.status.value} after accepting {d.accepted_seq} "
        f"messages ({accepted} replies, 1 update).",
    ]
    return "\n".join(lines)
