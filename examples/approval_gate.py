"""An order held at an approval gate: a durable signal wait with a deadline.

Run it:

    .venv/bin/python examples/approval_gate.py     # a demo on a SQLite file in a temp dir

The order is the entity, its key the order id. Its `run()` stops at one declared,
one-shot wait, `Order.approval = corral.wait(Decision)`, until a manager decides or the
decision window closes; the deadline is fixed when `run()` first reaches the gate, so
a restart does not extend it. Managers decide with `ref.deliver(Order.approval, ...)`:

- exactly one delivery wins a wait. Two managers clicking at once get `delivered`
  and `already_delivered`, the loser with the winner's decision and name;
- a retried click (same key, payload and manager) is a `duplicate` of the first;
- a decision after the deadline is `stale`: `run()` has already returned `timed_out`;
- the sender recorded is the one the `authorize` hook returns: the browser claims its
  session token, the hook maps it to the manager's name and refuses unknown tokens;
- operators list the orders waiting at their gate with `rt.signal_waits(Order)`.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

import corral

DAY = 86400.0


class Decision(BaseModel):
    approved: bool
    note: str = ""


class OrderInput(BaseModel):
    item: str
    amount_cents: int
    decide_within: float  # seconds, from when run() first reaches the gate


class Outcome(BaseModel):
    order: str
    status: Literal["approved", "rejected", "timed_out"]
    note: str = ""


class Order(corral.Entity):
    approval = corral.wait(Decision)  # the wait named "approval": one decision per run

    def __init__(self, init: OrderInput) -> None:
        self.item = init.item
        self.amount_cents = init.amount_cents
        self.decide_within = init.decide_within

    async def run(self) -> Outcome:
        try:
            decision = await self.wait_for_signal(Order.approval, timeout=self.decide_within)
        except corral.SignalTimeoutError:  # nobody decided in time; a late click is stale
            return Outcome(order=self.key, status="timed_out")
        # run() sees the payload only; who decided is on the `Delivery` the caller gets.
        return Outcome(order=self.key, status="approved" if decision.approved else "rejected",
                       note=decision.note)


# The managers' browsers claim their session token as the sender; only the hook knows
# whose it is. (A real hook would look the token up in the session store.)
ANA, BEN = "sess-4f1c9a", "sess-9b7e20"
SESSIONS = {ANA: "ana", BEN: "ben"}

# The two clicks of the race on o-1: delivery key -> (decision, claimed sender).
CLICKS = {
    "click-ana-1": (Decision(approved=True, note="budget ok"), ANA),
    "click-ben-1": (Decision(approved=False, note="too expensive"), BEN),
}


def authorize(req: corral.AuthRequest) -> str | None:
    """Record the manager behind a decision's session token; refuse unknown tokens.

    Every other call (the order service's own starts) keeps the sender it claims.
    """
    if req.kind != "deliver":
        return req.sender
    manager = SESSIONS.get(req.sender or "")
    if manager is None:
        raise corral.UnauthorizedError(
            f"no manager has session {req.sender!r}; {req.key} {req.name} refused",
            entity_type=req.entity_type, key=req.key)
    return manager


async def open_gates(rt: corral.Runtime) -> list[corral.SignalWaitInfo]:
    """Every order waiting at its gate, oldest first: the operators' view, page by page."""
    gates: list[corral.SignalWaitInfo] = []
    cursor: str | None = None
    while True:
        page = await rt.signal_waits(Order, limit=50, after=cursor)
        gates += page.items
        if page.next_cursor is None:
            return gates
        cursor = page.next_cursor


async def wait_at_gate(rt: corral.Runtime, keys: set[str], *, timeout: float = 10.0
                       ) -> list[corral.SignalWaitInfo]:
    """Wait until every order of `keys` waits at its gate (nothing announces it: poll).

    A decision delivered before `run()` gets there is not lost (it is `buffered` and
    wins when `run()` arrives); the demo waits so that the race below is a real one.
    """
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while True:
        gates = await open_gates(rt)
        if keys <= {g.key for g in gates}:
            return gates
        if loop.time() > give_up:
            raise TimeoutError(f"orders {sorted(keys)} did not reach their gate in {timeout} s")
        await asyncio.sleep(0.01)


@dataclass
class Report:
    gates: list[corral.SignalWaitInfo] = field(default_factory=list)  # before any decision
    race: dict[str, corral.Delivery[Decision]] = field(default_factory=dict)  # by click
    retry: corral.Delivery[Decision] | None = None  # the winning click, sent again
    refused: corral.UnauthorizedError | None = None  # a click with an unknown token
    decided: Outcome | None = None  # o-1's run() result
    timed_out: Outcome | None = None  # o-2's run() result
    late: corral.Delivery[Decision] | None = None  # a click on o-2 after its deadline
    gates_after: list[corral.SignalWaitInfo] = field(default_factory=list)


async def demo(rt: corral.Runtime, *, window: float,
               let_time_pass: Callable[[float], Awaitable[object]]) -> Report:
    """Two orders: o-1 (a day to decide) is decided by the first of two managers who
    click at once; o-2 (`window` seconds to decide) is decided by nobody in time.

    `let_time_pass(seconds)` is `asyncio.sleep` on a real clock, or a test runtime's
    `advance` on a virtual one. `rt` must have been opened with `authorize=authorize`.
    """
    report = Report()
    o1, o2 = rt.ref(Order, "o-1"), rt.ref(Order, "o-2")
    await o1.start(start=OrderInput(item="forklift", amount_cents=4_200_000, decide_within=DAY),
                   start_id="order-o-1-created")  # a retried start is a duplicate
    await o2.start(start=OrderInput(item="pallets", amount_cents=90_000, decide_within=window),
                   start_id="order-o-2-created")
    report.gates = await wait_at_gate(rt, {"o-1", "o-2"})
    for g in report.gates:
        within = float("inf") if g.deadline is None else g.deadline - g.waiting_since
        print(f"waiting: {g.key} at {g.name!r}, to be decided within {within:g} s")
    await race(o1, report)
    report.decided = await o1.result(timeout=30)
    print(f"o-1: {report.decided.status} ({report.decided.note})")
    await let_time_pass(window)  # nobody decides o-2 in time
    report.timed_out = await o2.result(timeout=30)
    report.late = await o2.deliver(Order.approval, Decision(approved=True), key="click-ana-2",
                                   sender=ANA)
    print(f"o-2: {report.timed_out.status}; ana's click after the deadline: "
          f"{report.late.status}")
    report.gates_after = await open_gates(rt)
    print(f"orders still waiting: {len(report.gates_after)}")
    return report


async def race(order: corral.EntityRef[Order, OrderInput], report: Report) -> None:
    """Both managers click at once; the winner's browser retries; a stranger tries."""
    answers = await asyncio.gather(*(
        order.deliver(Order.approval, decision, key=key, sender=token)
        for key, (decision, token) in CLICKS.items()))
    report.race = dict(zip(CLICKS, answers, strict=True))
    for key, d in report.race.items():
        assert d.payload is not None  # delivered and already_delivered carry the winner's
        print(f"{key}: {d.status}; the decision: approved={d.payload.approved} by {d.sender}")
    winner = next(k for k, d in report.race.items() if d.status == "delivered")
    decision, token = CLICKS[winner]
    report.retry = await order.deliver(Order.approval, decision, key=winner, sender=token)
    print(f"{winner} again: {report.retry.status}")
    try:
        await order.deliver(Order.approval, Decision(approved=True), key="click-x",
                            sender="sess-000000")
    except corral.UnauthorizedError as err:
        report.refused = err
        print(f"an unknown session token: refused ({err})")


async def main(store: str | Path, *, window: float = 1.0) -> Report:
    """The demo on the SQLite file `store`, in real time (o-2 times out after `window` s)."""
    async with corral.open_runtime(str(store), entities=[Order], authorize=authorize) as rt:
        return await demo(rt, window=window, let_time_pass=asyncio.sleep)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="approval-gate-") as tmp:
        asyncio.run(main(Path(tmp) / "orders.db"))
