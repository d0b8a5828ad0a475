"""The entity of tests/runtime/test_signal_waits_processes.py, shared with its worker processes.

The pytest process and every `wait_worker.py` subprocess import `Order` from this one
module, so they all register the same entity name, wait name and models against the
shared store.
"""

from __future__ import annotations

from pydantic import BaseModel

import corral

__all__ = ["Decision", "Order", "OrderInput", "Outcome", "Release"]


class OrderInput(BaseModel):
    """Start input: the approval wait's timeout in seconds (None: wait for ever), and
    whether `run()` then holds on until `release` is delivered too."""

    timeout: float | None = None
    hold: bool = False


class Decision(BaseModel):
    """The approval payload; `by` says which delivery it came from."""

    approved: bool
    by: str = ""


class Release(BaseModel):
    """The payload of `Order.release`."""


class Outcome(BaseModel):
    """What `run()` returns: the decision it resumed with, or that it timed out.

    `at` is the host's clock when `run()` got past the wait, so a test can tell a
    timeout at the original deadline from one re-armed at a restart.
    """

    approved: bool | None = None
    by: str = ""
    timed_out: bool = False
    at: float


class Order(corral.Entity):
    """Waits once, durably, for `approval`, then returns what it got.

    With `hold`, the run stays running after the approval until `release` is
    delivered, so deliveries that lose the race still meet a running run.
    """

    approval = corral.wait(Decision)
    release = corral.wait(Release)

    def __init__(self, init: OrderInput) -> None:
        self.timeout = init.timeout
        self.hold = init.hold

    async def run(self) -> Outcome:
        try:
            decision = await self.wait_for_signal(Order.approval, timeout=self.timeout)
        except corral.SignalTimeoutError:
            return Outcome(timed_out=True, at=self.now())
        outcome = Outcome(approved=decision.approved, by=decision.by, at=self.now())
        if self.hold:
            await self.wait_for_signal(Order.release)
        return outcome
