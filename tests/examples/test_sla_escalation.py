"""The SLA-escalation example (`examples/sla_escalation.py`) runs and tells the truth: a
week on the virtual clock, sweeps at 09:00 on weekdays in each tenant's zone."""

from __future__ import annotations

import datetime as dt
from types import ModuleType

import pytest

import corral.testing
from example_modules import load_example


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("sla_escalation.py", "sla_escalation_example")


def _utc(day: int, hour: int) -> float:
    return dt.datetime(2026, 1, day, hour, tzinfo=dt.timezone.utc).timestamp()


async def test_tickets_past_their_sla_are_escalated_at_nine_on_weekdays_in_their_zone(
    example: ModuleType,
) -> None:
    async with corral.testing.open_test_runtime(entities=[example.Desk, example.Ticket],
                                                start=_utc(5, 6)) as env:
        report = await example.demo(env.runtime, env.advance)
    # Paris 09:00 is 08:00 UTC in January, New York 09:00 is 14:00 UTC; Monday's sweep
    # comes before the 24 h SLA, the weekend has none.
    assert report.escalations == {
        "A-1": [_utc(d, 8) for d in (6, 7, 8, 9)],
        "A-2": [_utc(6, 8)],  # resolved on Tuesday at noon
        "G-1": [_utc(d, 14) for d in (6, 7, 8, 9)],
    }
    assert report.sweeps == {"acme": 5, "globex": 5}
    infos = {i.id: i for i in report.schedules}
    assert infos["sla-acme"].next_ticks[0] == _utc(12, 8)  # next Monday
    assert (infos["sla-globex"].fired, infos["sla-globex"].skipped) == (5, 0)


async def test_the_example_runs_as_a_program(example: ModuleType) -> None:
    report = await example.main()
    assert sum(len(t) for t in report.escalations.values()) == 9
