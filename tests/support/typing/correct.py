"""Correct uses of the typed client API: mypy (strict) must accept every line."""

from __future__ import annotations

from models import Assigned, Job, Reply, Start, Ticket
from typing_extensions import assert_type

import corral


async def uses(rt: corral.Runtime) -> None:
    ref = rt.ref(Ticket, "ticket-1")
    assert_type(ref, corral.EntityRef[Ticket, Start])
    ack = await ref.signal_with_start(Ticket.reply, Reply(text="hi"), start=Start(tenant="a"))
    assert_type(ack, corral.Ack)
    await ref.signal_with_start(Ticket.reply, {"text": "hi"}, start={"tenant": "a"})
    await ref.signal_with_start(Ticket.inbox, Reply(text="hi"), start=Start(tenant="a"))
    await ref.signal(Ticket.ping)
    await ref.signal(Ticket.inbox, {"text": "hi"}, message_id="m-1", sender="svc")
    assert_type(await ref.update(Ticket.assign, Reply(text="ann")), Assigned)
    assert_type(await ref.update_with_start(Ticket.count, start=Start(tenant="a")), int)
    assert_type(await ref.query(Ticket.replies_so_far), list[str])
    assert_type(await ref.query(Ticket.replies_so_far, timeout=5), list[str])
    assert_type(await ref.query(Ticket.starts_with, Reply(text="h")), bool)
    assert_type(await ref.result(timeout=1.0), int)
    delivery = await ref.deliver(Ticket.approval, Reply(text="ok"), key="k-1", sender="ana")
    assert_type(delivery, corral.Delivery[Reply])
    assert_type(delivery.payload, Reply | None)
    await ref.deliver(Ticket.approval, {"text": "ok"}, key="k-2")

    job = rt.ref(Job, "job-1")
    assert_type(job, corral.EntityRef[Job, None])
    await job.signal_with_start(Job.poke, Reply(text="x"), start=None)
    assert_type(await job.result(), str)


class Waiter(Ticket):
    async def run(self) -> int:
        assert_type(await self.wait_for_signal(Ticket.approval, timeout=60), Reply)
        assert_type(await self.step(draft, "hi", 2, name="draft"), Reply)
        assert_type(await self.step(count_words, "a b", name="count", timeout=5.0), int)
        assert_type(await self.step(now, name="now", retry=corral.RetryPolicy()), float)
        return 0


async def draft(text: str, times: int) -> Reply:
    return Reply(text=text * times)


def count_words(text: str) -> int:
    return len(text.split())


def now() -> float:
    return 0.0
