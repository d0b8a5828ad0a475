"""Misuses of the typed client API: mypy (strict) must report exactly the lines marked
`# error`, and nothing else."""

from __future__ import annotations

from models import Job, Other, Reply, Start, Ticket

import corral


async def misuses(rt: corral.Runtime) -> None:
    ref = rt.ref(Ticket, "ticket-1")
    await ref.signal(Job.poke, Reply(text="x"))  # error: another type's handler
    await ref.signal(Ticket.reply, Other(text="x"))  # error: the wrong payload model
    await ref.signal(Ticket.inbox, Other(text="x"))  # error: the wrong mailbox model
    await ref.signal(Ticket.reply)  # error: a payload is required
    await ref.signal(Ticket.ping, Reply(text="x"))  # error: ping takes no payload
    await ref.signal_with_start(Ticket.reply, Reply(text="x"),  # error: wrong start model
                                start=Reply(text="a"))
    await ref.signal_with_start(Ticket.reply, Reply(text="x"))  # error: start is required
    assigned: int = await ref.update(Ticket.assign, Reply(text="x"))  # error: not an int
    count: str = await ref.update(Ticket.count)  # error: count returns an int
    await ref.update(Ticket.assign, Other(text="x"))  # error: the wrong payload model
    flag: str = await ref.query(Ticket.starts_with, Reply(text="x"))  # error: a bool
    result: str = await ref.result()  # error: run() returns an int
    await ref.query(Ticket.starts_with)  # error: the query takes a payload
    await ref.query(Ticket.replies_so_far, timeout="5")  # error: seconds, not text
    job = rt.ref(Job, "job-1")
    await job.signal(Ticket.inbox, Reply(text="x"))  # error: Ticket's mailbox on a Job
    await job.signal_with_start(Job.poke, Reply(text="x"), start=Start(tenant="a"))  # error
    await ref.deliver(Ticket.approval, Other(text="x"), key="k")  # error: wrong model
    await job.deliver(Ticket.approval, Reply(text="x"), key="k")  # error: Ticket's wait
    await ref.deliver(Ticket.approval, Reply(text="x"))  # error: the key is required
    _ = (assigned, count, flag, result)


class Stepper(Ticket):
    async def run(self) -> int:
        words: str = await self.step(count_words, "a b", name="n")  # error: an int
        await self.step(count_words, 3, name="n")  # error: text is a str
        await self.step(count_words, "a", "b", name="n")  # error: one argument
        await self.step(count_words, "a")  # error: the name is required
        _ = words
        return 0


def count_words(text: str) -> int:
    return len(text.split())
