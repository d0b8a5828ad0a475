"""Two releases of one entity type, `Ticket`, for tests/runtime/test_renames.py and its worker.

Release 1 calls its signal `customer_reply`; release 2 renamed it `reply_from_customer`
(declared with `renamed_from=`); `TicketNoAlias` is a release that forgot to declare
it, and `TicketStrict` one whose payload model gained a required field.
"""

from __future__ import annotations

from pydantic import BaseModel

import corral


class Reply(BaseModel):
    text: str


class StrictReply(BaseModel):
    text: str
    channel: str  # required: payloads of release 1 no longer validate


class Replies(BaseModel):
    texts: list[str]


class TicketV1(corral.Entity):
    name = "Ticket"

    def __init__(self) -> None:
        self.texts: list[str] = []

    @corral.signal
    def customer_reply(self, reply: Reply) -> None:
        self.texts.append(reply.text)

    @corral.query
    def replies(self) -> Replies:
        return Replies(texts=self.texts)


class TicketV2(corral.Entity):
    name = "Ticket"

    def __init__(self) -> None:
        self.texts: list[str] = []

    @corral.signal(renamed_from="customer_reply")
    def reply_from_customer(self, reply: Reply) -> None:
        self.texts.append("v2:" + reply.text)

    @corral.query
    def replies(self) -> Replies:
        return Replies(texts=self.texts)


class TicketNoAlias(corral.Entity):
    name = "Ticket"

    def __init__(self) -> None:
        self.texts: list[str] = []

    @corral.signal
    def reply_from_customer(self, reply: Reply) -> None:
        self.texts.append("v2:" + reply.text)

    @corral.query
    def replies(self) -> Replies:
        return Replies(texts=self.texts)


class TicketStrict(corral.Entity):
    name = "Ticket"

    def __init__(self) -> None:
        self.texts: list[str] = []

    @corral.signal
    def customer_reply(self, reply: StrictReply) -> None:
        self.texts.append(f"{reply.channel}:{reply.text}")

    @corral.query
    def replies(self) -> Replies:
        return Replies(texts=self.texts)


class Decision(BaseModel):
    approved: bool


class OrderInput(BaseModel):
    timeout: float | None = None  # the wait's, in seconds (None: for ever)


class OrderV1(corral.Entity):
    name = "Order"

    decision = corral.wait(Decision)

    def __init__(self, init: OrderInput) -> None:
        self.timeout = init.timeout
        self.outcome = ""

    @corral.query
    def result_so_far(self) -> str:
        return self.outcome

    async def run(self) -> str:
        decision = await self.wait_for_signal(OrderV1.decision, timeout=self.timeout)
        return "approved" if decision.approved else "refused"


class OrderV2(corral.Entity):
    name = "Order"

    approval = corral.wait(Decision, renamed_from="decision")

    def __init__(self, init: OrderInput) -> None:
        self.timeout = init.timeout
        self.outcome = ""

    @corral.query
    def result_so_far(self) -> str:
        return self.outcome

    async def run(self) -> str:
        try:
            decision = await self.wait_for_signal(OrderV2.approval, timeout=self.timeout)
        except corral.SignalTimeoutError:
            self.outcome = "expired"
            await self.wait_for(lambda: False)  # stays running: its wait timed out, not it
        return "approved" if decision.approved else "refused"
