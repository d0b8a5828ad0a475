"""Passivation (snapshot + evict, the run stays running) and durable timers.

`Sleepy` and `SleepyReminder` passivate after 0.2 s idle. Passivation is observed
through `describe().hosted_here` with a deadline, never by sleeping.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import corral
from bounded_entities import (
    Job,
    Note,
    Patient,
    Reminder,
    Sleepy,
    SleepyReminder,
    Start,
    Wake,
)
from procs import wait_until
from stores import sql

ENTITIES: list[type[corral.Entity]] = [Patient, Reminder, Sleepy, SleepyReminder]


async def hosted(ref: corral.EntityRef[Any]) -> bool:
    return (await ref.describe()).hosted_here


async def passivated(ref: corral.EntityRef[Any]) -> bool:
    return not (await ref.describe()).hosted_here


async def test_an_idle_entity_is_passivated_and_a_message_reactivates_it_with_its_state(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Sleepy, "s-1")
        for n in range(5):
            await ref.signal_with_start(Sleepy.note, Note(mid=f"n{n}"), start=Start())
            await ref.signal(Sleepy.jobs, Job(mid=f"j{n}"))
        await wait_until(lambda: _processed(ref, 5), "run() took the 5 jobs")
        await wait_until(lambda: passivated(ref), "the idle entity is passivated")

        info = await ref.describe()
        assert info.status is corral.RunStatus.RUNNING, "passivation must not close the run"
        # Not in memory: the store's watermark, the seq it was passivated at.
        assert (info.accepted_seq, info.applied_seq, info.backlog) == (10, 10, 0)
        assert sql(db_path, "SELECT passivated_seq FROM entities WHERE key='s-1'") == [(10,)]
        assert sql(db_path, "SELECT applied_seq, run_id FROM snapshots WHERE key='s-1' "
                            "ORDER BY applied_seq DESC LIMIT 1") == [(10, 1)]

        Sleepy.inits = Sleepy.handler_calls = 0
        ack = await ref.signal(Sleepy.note, Note(mid="n5"))
        assert (ack.run_id, ack.started) == (1, False)
        await ref.signal(Sleepy.jobs, Job(mid="j5"))
        await wait_until(lambda: _processed(ref, 6), "the reactivated run() took job 6")
        state = await ref.query(Sleepy.state)
        assert await hosted(ref)
    assert state == {"notes": [f"n{n}" for n in range(6)],
                     "processed": [f"j{n}" for n in range(6)]}
    # Restored from the passivation snapshot: __init__ once (the snapshot's state is set
    # over what it built), no replay of old signals.
    assert (Sleepy.inits, Sleepy.handler_calls) == (1, 1)


async def _processed(ref: corral.EntityRef[Sleepy], n: int) -> bool:
    state = await ref.query(Sleepy.state)
    return len(state["processed"]) >= n


async def test_a_query_on_a_passivated_entity_answers_from_its_snapshot_without_activating_it(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Sleepy, "q-1")
        await ref.signal_with_start(Sleepy.jobs, Job(mid="j0"), start=Start())
        await ref.signal(Sleepy.note, Note(mid="n0"))
        await wait_until(lambda: _processed(ref, 1), "run() took the job")
        await wait_until(lambda: passivated(ref), "the idle entity is passivated")

        Sleepy.inits = 0
        for _ in range(3):
            # `processed` is run()-made state: only the passivation snapshot has it.
            assert await ref.query(Sleepy.state) == {"notes": ["n0"], "processed": ["j0"]}
            assert not await hosted(ref)
        # Each answer is a replica built from the snapshot (`__init__`, then its state
        # over it), never an activation.
        assert Sleepy.inits == 3
        assert sql(db_path, "SELECT passivated_seq FROM entities WHERE key='q-1'") == [(2,)]

        assert await ref.query(Sleepy.state, activate=True) == \
            {"notes": ["n0"], "processed": ["j0"]}
        assert await hosted(ref)
        assert sql(db_path, "SELECT passivated_seq FROM entities WHERE key='q-1'") == [(None,)]
        await wait_until(lambda: passivated(ref), "it is passivated again")
    assert Sleepy.inits == 4  # the activation restored from the snapshot too


async def test_a_passivated_entity_stays_passivated_across_a_host_restart_and_keeps_its_state(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Sleepy, "r-1")
        for n in range(3):
            await ref.signal_with_start(Sleepy.note, Note(mid=f"n{n}"), start=Start())
        await wait_until(lambda: passivated(ref), "the idle entity is passivated")
    Sleepy.inits = Sleepy.handler_calls = 0
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Sleepy, "r-1")
        assert not await hosted(ref), "recovery must not activate a passivated entity"
        assert (await ref.query(Sleepy.state))["notes"] == ["n0", "n1", "n2"]
        assert not await hosted(ref)
        await ref.signal(Sleepy.note, Note(mid="n3"))
        await wait_until(lambda: hosted(ref), "the message reactivated it")
        assert (await ref.query(Sleepy.state))["notes"] == ["n0", "n1", "n2", "n3"]
    # Both the replica answering the first query and the reactivation start from the
    # snapshot (`__init__`, then its state over it); only the new signal is applied.
    assert (Sleepy.inits, Sleepy.handler_calls) == (2, 1)


async def test_a_durable_timer_fires_after_a_host_restart_that_happened_before_its_deadline(
        db_path: str) -> None:
    due = time.time() + 1.5
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Reminder, "t-1")
        await ref.signal_with_start(Reminder.wake, Wake(at=due), start=Start())
        await wait_until(lambda: _timer_set(db_path, "t-1"), "run() sleeps under a timer")
    assert time.time() < due, "the host was meant to close before the deadline"
    Reminder.starts = 0
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        fired = await rt.ref(Reminder, "t-1").result(timeout=30)
    assert fired.due == due
    assert fired.fired_at >= due, "the timer fired before its deadline"
    assert fired.starts == 1, "run() restarted from the top once, after the restart"
    assert sql(db_path, "SELECT count(*) FROM timers") == [(0,)]


def _timer_set(db_path: str, key: str) -> bool:
    return bool(sql(db_path, "SELECT count(*) FROM timers WHERE key=?", key)[0][0])


async def test_a_due_timer_reactivates_a_passivated_entity(db_path: str) -> None:
    SleepyReminder.starts = 0
    due = time.time() + 1.5
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(SleepyReminder, "p-1")
        await ref.signal_with_start(SleepyReminder.wake, Wake(at=due), start=Start())
        await wait_until(lambda: passivated(ref), "the sleeping entity is passivated")
        assert _timer_set(db_path, "p-1"), "passivation must keep the durable timer"
        fired = await ref.result(timeout=30)
    assert fired.fired_at >= due
    assert fired.starts == 2, "run() ran once before passivation and once after the timer"


async def test_a_due_timer_reactivates_an_entity_passivated_before_a_host_restart(
        db_path: str) -> None:
    due = time.time() + 3.0
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(SleepyReminder, "pr-1")
        await ref.signal_with_start(SleepyReminder.wake, Wake(at=due), start=Start())
        await wait_until(lambda: passivated(ref), "the sleeping entity is passivated")
    SleepyReminder.starts = 0
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(SleepyReminder, "pr-1")
        info = await ref.describe()
        if time.time() < due:  # only the timer may bring it back, and it was not due yet
            assert not info.hosted_here, "recovery activated a passivated entity"
        else:
            print("\nthe deadline passed before the check; hosted_here not checked")
        fired = await ref.result(timeout=30)
    assert fired.fired_at >= due
    assert fired.starts == 1
    assert sql(db_path, "SELECT passivated_seq FROM entities WHERE key='pr-1'") == [(None,)]


async def test_wait_for_with_a_timeout_survives_passivation_and_times_out_at_its_deadline(
        db_path: str) -> None:
    until = time.time() + 1.5
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Patient, "w-1")
        await ref.signal_with_start(Patient.poke, start=Wake(at=until))
        await wait_until(lambda: passivated(ref), "the waiting entity is passivated")
        ((due,),) = sql(db_path, "SELECT due_at FROM timers WHERE key='w-1'")
        assert due == pytest.approx(until, abs=0.5)
        outcome = await ref.result(timeout=30)
        finished = time.time()
    assert outcome == "timed out"
    assert finished >= until


async def test_a_message_wakes_a_passivated_wait_for_before_its_timeout(db_path: str) -> None:
    until = time.time() + 60
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        ref = rt.ref(Patient, "w-2")
        await ref.signal_with_start(Patient.poke, start=Wake(at=until))
        await wait_until(lambda: passivated(ref), "the waiting entity is passivated")
        await ref.signal(Patient.reply, Note(mid="yes"))
        assert await ref.result(timeout=30) == "yes"
    assert sql(db_path, "SELECT count(*) FROM timers") == [(0,)]
