"""`corral.testing`: the real host and store on a virtual clock that a test advances."""

from __future__ import annotations

import time

from pydantic import BaseModel

import corral
import corral.testing

DAY = 86400.0


class Note(BaseModel):
    text: str


class Reminder(corral.Entity):
    """Sends its note a day after the first one arrives; passivates after 5 idle minutes."""

    idle_timeout = 300.0
    FIRED: list[tuple[str, str, float]] = []

    def __init__(self) -> None:
        self.note: str | None = None
        self.due_at: float | None = None
        self.sent_at: float | None = None

    @corral.signal
    def remind(self, note: Note) -> None:
        self.note = note.text

    @corral.query
    def sent(self) -> float | None:
        return self.sent_at

    async def run(self) -> None:
        await self.wait_for(lambda: self.note is not None)
        if self.due_at is None:
            self.due_at = self.now() + DAY
            await self.checkpoint()
        await self.sleep_until(self.due_at)
        if self.sent_at is None:
            self.sent_at = self.now()
            Reminder.FIRED.append((self.key, self.note or "", self.now()))
            await self.checkpoint()
        await self.wait_for(lambda: False)


class Escalation(corral.Entity):
    """Waits an hour for an answer, then escalates."""

    def __init__(self) -> None:
        self.answered = False
        self.outcome: str | None = None

    @corral.signal
    def open(self) -> None:
        pass

    @corral.signal
    def answer(self, note: Note) -> None:
        self.answered = True

    @corral.query
    def result(self) -> str | None:
        return self.outcome

    async def run(self) -> None:
        got = await self.wait_for(lambda: self.answered, timeout=3600)
        self.outcome = "answered" if got else "escalated"
        await self.wait_for(lambda: False)


async def test_a_day_long_durable_timer_fires_when_the_clock_reaches_it() -> None:
    began = time.monotonic()
    async with corral.testing.open_test_runtime(entities=[Reminder]) as env:
        ref = env.runtime.ref(Reminder, "r-1")
        start = env.now()
        await ref.signal_with_start(Reminder.remind, Note(text="call"), start=None)
        await env.advance(hours=23, minutes=59)
        assert await ref.query(Reminder.sent) is None
        await env.advance(minutes=1)
        assert await ref.query(Reminder.sent) == start + DAY
    assert time.monotonic() - began < 10  # a simulated day, not a real one


async def test_timers_of_many_entities_fire_in_order_each_at_its_own_time() -> None:
    Reminder.FIRED.clear()
    async with corral.testing.open_test_runtime(entities=[Reminder]) as env:
        due = {}
        for n, key in enumerate(["r-c", "r-a", "r-b"]):
            due[key] = env.now() + DAY
            await env.runtime.ref(Reminder, key).signal_with_start(
                Reminder.remind, Note(text=key), start=None)
            await env.advance(hours=1 + n)
        await env.advance(days=2)
    assert [k for k, _, _ in Reminder.FIRED] == ["r-c", "r-a", "r-b"]
    assert {k: at for k, _, at in Reminder.FIRED} == due


async def test_wait_for_with_a_timeout_follows_the_virtual_clock() -> None:
    async with corral.testing.open_test_runtime(entities=[Escalation]) as env:
        answered, ignored = (env.runtime.ref(Escalation, k) for k in ("e-1", "e-2"))
        for ref in (answered, ignored):
            await ref.signal_with_start(Escalation.open, start=None)
        await env.advance(minutes=59)
        assert await answered.query(Escalation.result) is None
        await answered.signal(Escalation.answer, Note(text="on it"))
        await env.advance(minutes=2)
        assert await answered.query(Escalation.result) == "answered"
        assert await ignored.query(Escalation.result) == "escalated"


async def test_an_idle_entity_passivates_on_the_virtual_clock_and_its_timer_brings_it_back(
) -> None:
    async with corral.testing.open_test_runtime(entities=[Reminder]) as env:
        ref = env.runtime.ref(Reminder, "r-9")
        start = env.now()
        await ref.signal_with_start(Reminder.remind, Note(text="call"), start=None)
        await env.advance(seconds=299)
        assert (await ref.describe()).hosted_here
        await env.advance(seconds=2)
        assert not (await ref.describe()).hosted_here  # passivated: snapshot, evicted
        await env.advance(days=1)
        assert await ref.query(Reminder.sent) == start + DAY
