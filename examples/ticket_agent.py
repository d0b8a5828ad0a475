"""A support-ticket agent fed by at-least-once webhooks (the signal-with-start pattern).

Run it:

    .venv/bin/python examples/ticket_agent.py [STORE]     # default ./ticket-agent.db

The same scenario is `corral demo`. Its code, commented, is `src/corral/_demo.py`
(kept in the package so the installed `corral` command can run it; this file is the
standalone program). In short:

The entity is the ticket. Its key is the ticket id, so a webhook never looks it up:

    class TicketAgent(corral.Entity):
        # A mailbox signal with a reorder window: replies reach run() in the order
        # of the provider's timestamp, each held 1 s for an earlier-stamped one.
        customer_reply = corral.signal(Reply, order_by="at", hold=1.0)
        answered: list[Answer]                  # state: snapshotted as JSON

        def __init__(self, init: TicketInput) -> None:
            self.answered = []                  # before any handler, even the first

        @corral.update
        def assign(self, req: Assign) -> Assigned: ...

        @corral.query
        def status(self) -> TicketStatus: ...

        async def run(self) -> Outcome:
            await self.wait_for(lambda: self.assignee is not None)
            while not self.resolved:
                reply = await self.mailbox.get()     # provider time, not arrival
                late = self.mailbox.late             # stamped before one answered
                ...                                  # answer it
                self.resolved = reply.closes_ticket
                await self.checkpoint()              # a restart won't answer twice
            return Outcome(...)

Each webhook is one atomic call that starts the agent if needed and delivers the reply
either way. The start input goes with every call; the provider's message id makes a
retried webhook a duplicate:

    ack = await rt.ref(TicketAgent, f"ticket-{ev.ticket_id}").signal_with_start(
        TicketAgent.customer_reply, reply,
        start=TicketInput(tenant=ev.tenant, subject=ev.subject),
        message_id=ev.message_id,
    )
    ack.status    # "accepted", or "duplicate" for a retry (not delivered again)
    ack.started   # True for exactly one of any number of concurrent calls
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from corral._demo import DemoReport, TicketAgent, format_report, remove_store, run_demo

__all__ = ["TicketAgent", "main"]


async def main(store_path: str | Path) -> DemoReport:
    """Fire the webhooks at `store_path`, wait for the agent's outcome, print the story.

    `store_path` should be a new (or removed) SQLite file: on an old one the ticket's
    previous run and its dedupe records would still be there.
    """
    report = await run_demo(store_path)
    print(format_report(report))
    return report


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else "ticket-agent.db"
    remove_store(path)
    asyncio.run(main(path))
