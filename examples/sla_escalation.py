"""SLA escalation on a schedule: every open ticket past its SLA is escalated at 09:00 on
weekdays, in its tenant's time zone.

Run it:

    .venv/bin/python examples/sla_escalation.py     # a simulated week on a test clock

Each tenant's support desk is an entity (`Desk`, key = tenant) that knows its open
tickets. One schedule per tenant, `sla-<tenant>`, signals the desk's `sweep` at 09:00
Monday to Friday in the tenant's zone (`corral.Cron("0 0 9 * * mon-fri",
time_zone=...)`): the sweep escalates each ticket open longer than the SLA by sending
`escalate` to that `Ticket` entity (`self.send`, exactly once). The schedule is store
data: whichever host holds the desk's shard fires it, each tick once (its message id is
derived from the schedule and the tick), and a tick missed while every host was down
fires on return within the catch-up window. `overlap=skip`: a sweep that is still
queued when the next 09:00 comes is not doubled.

`main()` runs a week on `corral.testing`'s virtual clock; `demo(rt, advance)` is the
scenario, on any runtime.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pydantic import BaseModel

import corral

HOUR = 3600.0
SLA = 24 * HOUR  # a ticket open longer than this at a sweep is escalated
TENANTS = {"acme": "Europe/Paris", "globex": "America/New_York"}


class DeskInput(BaseModel):
    tenant: str


class Opened(BaseModel):
    ticket: str
    at: float


class Resolved(BaseModel):
    ticket: str


class Sweep(BaseModel):
    sla_seconds: float = SLA


class Escalate(BaseModel):
    level: int


class Ticket(corral.Entity):
    """One support ticket: its escalation level and when each escalation came."""

    def __init__(self) -> None:
        self.level = 0
        self.escalated_at: list[float] = []

    @corral.signal
    def escalate(self, e: Escalate) -> None:
        self.level = max(self.level, e.level)
        self.escalated_at.append(self.now())

    @corral.query
    def escalations(self) -> list[float]:
        return self.escalated_at


class Desk(corral.Entity):
    """A tenant's open tickets (id -> opened at) and their escalation levels."""

    def __init__(self, init: DeskInput) -> None:
        self.tenant = init.tenant
        self.open: dict[str, float] = {}
        self.levels: dict[str, int] = {}
        self.sweeps = 0

    @corral.signal
    def opened(self, o: Opened) -> None:
        self.open[o.ticket] = o.at

    @corral.signal
    def resolved(self, r: Resolved) -> None:
        self.open.pop(r.ticket, None)

    @corral.signal
    def sweep(self, s: Sweep) -> None:
        self.sweeps += 1
        for ticket, at in sorted(self.open.items()):
            if self.now() - at > s.sla_seconds:
                self.levels[ticket] = self.levels.get(ticket, 0) + 1
                self.send(Ticket, ticket, Ticket.escalate,
                          Escalate(level=self.levels[ticket]), start=None)

    @corral.query
    def swept(self) -> int:
        return self.sweeps


async def schedule_sweeps(rt: corral.Runtime) -> None:
    """One schedule per tenant: its desk's sweep at 09:00 on weekdays, in its zone."""
    for tenant, zone in TENANTS.items():
        await rt.schedules.create(
            f"sla-{tenant}", rt.ref(Desk, tenant), Desk.sweep, Sweep(),
            start=DeskInput(tenant=tenant),
            spec=corral.Cron("0 0 9 * * mon-fri", time_zone=zone),
            overlap=corral.Overlap.SKIP, catchup_window=2 * HOUR,
            note=f"escalate {tenant}'s tickets open past {SLA / HOUR:g} h")


@dataclass(frozen=True)
class Report:
    """What a week did: each ticket's escalation times, each desk's sweeps, and each
    schedule's description."""

    escalations: dict[str, list[float]]
    sweeps: dict[str, int]
    schedules: list[corral.ScheduleInfo]


async def demo(rt: corral.Runtime, advance: Callable[[float], Awaitable[object]]) -> Report:
    """Open three tickets (at the runtime's now: Monday 2026-01-05 06:00 UTC in
    `main`), resolve one on Tuesday at noon, let the week pass."""
    await schedule_sweeps(rt)
    tickets = {"acme": ["A-1", "A-2"], "globex": ["G-1"]}
    for tenant, keys in tickets.items():
        desk = rt.ref(Desk, tenant)
        for key in keys:
            await desk.signal_with_start(Desk.opened, Opened(ticket=key, at=rt.clock.time()),
                                         start=DeskInput(tenant=tenant))
    await advance(30 * HOUR)  # Monday's sweeps found none late; Tuesday 09:00 Paris did
    await rt.ref(Desk, "acme").signal(Desk.resolved, Resolved(ticket="A-2"))
    await advance(4 * 24 * HOUR)  # to Saturday noon: the weekend has no sweep
    return Report(
        {key: await rt.ref(Ticket, key).query(Ticket.escalations)
         for keys in tickets.values() for key in keys},
        {tenant: await rt.ref(Desk, tenant).query(Desk.swept) for tenant in TENANTS},
        await rt.schedules.list())


async def main() -> Report:
    import corral.testing

    monday = dt.datetime(2026, 1, 5, 6, tzinfo=dt.timezone.utc).timestamp()
    async with corral.testing.open_test_runtime(entities=[Desk, Ticket],
                                                start=monday) as env:
        report = await demo(env.runtime, env.advance)
    for key, times in report.escalations.items():
        shown = ", ".join(dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%a %H:%M")
                          for t in times)
        print(f"{key}: escalated {len(times)} times (UTC: {shown})")
    for info in report.schedules:
        print(f"{info.id}: {info.fired} sweeps fired, next "
              f"{dt.datetime.fromtimestamp(info.next_ticks[0], dt.timezone.utc):%a %H:%M} UTC")
    return report


if __name__ == "__main__":
    asyncio.run(main())
