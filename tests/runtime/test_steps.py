"""Durable steps (`Entity.step`): a completed step's function never runs again after
its result is recorded; retries, per-attempt timeouts and exhausted retries; bounded
records; bad input refused. On both stores."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import corral
from procs import wait_until
from step_entities import (
    Agent,
    AgentInput,
    Dispatcher,
    Escalation,
    EscalationInput,
    Flaky,
    Reason,
    Reuser,
    call_model,
)
from stores import sql


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


async def _until(check: Any) -> None:
    while not await check():
        pass


async def test_a_restarted_run_gets_recorded_results_without_calling_the_step_again(
        db_path: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with corral.open_runtime(db_path, entities=[Agent]) as rt:
        ref = rt.ref(Agent, "a-1")
        await ref.start(start=AgentInput(log=str(log), steps=3))
        await _until(lambda: _has(ref, 3))
        assert len(sql(db_path, "SELECT * FROM steps")) == 3
    # Another process: run() starts again from the top, with no snapshot taken.
    async with corral.open_runtime(db_path, entities=[Agent]) as rt:
        ref = rt.ref(Agent, "a-1")
        await ref.signal(Agent.proceed)
        answers = await ref.result(timeout=30)
    assert _calls(log) == ["model:0", "model:1", "model:2"]
    assert [a.text for a in answers] == ["answer 0", "answer 1", "answer 2"]
    # Typed by the function's return annotation, with the key each step was given.
    assert [a.key for a in answers] == [f"Agent/a-1/1/model:{n}" for n in range(3)]
    assert sql(db_path, "SELECT * FROM steps") == []  # the run's end deletes its records


async def _has(ref: corral.EntityRef[Agent, AgentInput], n: int) -> bool:
    return await ref.query(Agent.count) >= n


async def test_a_step_over_its_timeout_is_retried_and_one_out_of_attempts_raises(
        db_path: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with corral.open_runtime(db_path, entities=[Flaky]) as rt:
        ref = rt.ref(Flaky, "f-1")
        await ref.signal_with_start(Flaky.proceed, start=AgentInput(log=str(log)))
        value, failed = await ref.result(timeout=30)
    assert value.value == 10
    assert (failed.attempts, failed.error) == (3, "RuntimeError: tool 2 is down")
    assert _calls(log) == ["slow:1", "slow:1", "fail:2", "fail:2", "fail:2"]


async def test_a_step_failed_for_good_raises_again_after_a_restart_without_a_call(
        db_path: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with corral.open_runtime(db_path, entities=[Flaky]) as rt:
        ref = rt.ref(Flaky, "f-2")
        await ref.start(start=AgentInput(log=str(log)))
        await _until(lambda: ref.query(Flaky.done))
        rows = sql(db_path, "SELECT name, ok, attempts FROM steps ORDER BY name")
        assert [(name, bool(ok), n) for name, ok, n in rows] == [("slow", True, 2),
                                                                 ("tool", False, 3)]
    async with corral.open_runtime(db_path, entities=[Flaky]) as rt:
        ref = rt.ref(Flaky, "f-2")
        await ref.signal(Flaky.proceed)
        value, failed = await ref.result(timeout=30)
    assert value.value == 10
    assert failed.attempts == 3
    assert _calls(log) == ["slow:1", "slow:1", "fail:2", "fail:2", "fail:2"]


async def test_a_name_used_twice_raises_until_a_checkpoint_covers_it(
        db_path: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with corral.open_runtime(db_path, entities=[Reuser]) as rt:
        ref = rt.ref(Reuser, "r-1")
        await ref.start(start=AgentInput(log=str(log)))
        assert await ref.result(timeout=30) == ["answer 0", "answer 1", "duplicate"]
    assert _calls(log) == ["model:0", "model:1"]


class Misuse(corral.Entity):
    def __init__(self, init: AgentInput) -> None:
        self.log = init.log

    async def run(self) -> list[str]:
        refused = []
        for kwargs in ({"name": ""}, {"name": "a\x00b"}, {"name": "x" * 201},
                       {"name": "a\ud800"}, {"name": "\x1b[31m"}, {"name": "l\u2028"},
                       {"name": "t", "timeout": -1}, {"name": "t", "timeout": True},
                       {"name": "r", "retry": 3}, {"name": "o", "ray_options": [1]}):
            try:
                await self.step(call_model, self.log, 0, **kwargs)
            except corral.InvalidArgumentError:
                refused.append(str(kwargs["name"])[:3])
        try:
            await self.step(lambda: object(), name="not-json")
        except corral.InvalidArgumentError:
            refused.append("json")
        return refused


async def test_bad_step_arguments_are_refused_with_nothing_called_or_recorded(
        db_path: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with corral.open_runtime(db_path, entities=[Misuse]) as rt:
        ref = rt.ref(Misuse, "m-1")
        await ref.start(start=AgentInput(log=str(log)))
        assert len(await ref.result(timeout=30)) == 11
    assert _calls(log) == []
    assert sql(db_path, "SELECT * FROM step_history") == []  # nor in history


def test_step_key_outside_a_step_is_refused() -> None:
    with pytest.raises(corral.InvalidArgumentError):
        corral.step_key()


async def _seen(rt: corral.Runtime, key: str, n: int) -> bool:
    ref = rt.ref(Escalation, key)
    try:
        return len(await ref.query(Escalation.seen)) >= n
    except corral.CorralError:
        return False


async def test_sends_reach_their_target_once_in_order_across_a_restart(
        db_path: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    entities = [Dispatcher, Escalation]
    async with corral.open_runtime(db_path, entities=entities) as rt:
        ref = rt.ref(Dispatcher, "d-1")
        await ref.start(start=AgentInput(log=str(log), steps=12))
        await wait_until(lambda: _seen(rt, "esc-d-1", 12), "12 sends arrive")
        # Bounded: the checkpoints at 5 and 10 deleted the records they covered.
        assert sorted(sql(db_path, "SELECT name FROM steps")) == [("model:10",), ("model:11",)]
    async with corral.open_runtime(db_path, entities=entities) as rt:
        await rt.ref(Dispatcher, "d-1").signal(Dispatcher.proceed)
        assert await rt.ref(Dispatcher, "d-1").result(timeout=30) == 12
        assert await rt.ref(Escalation, "esc-d-1").query(Escalation.seen) == list(range(12))
        senders = {r[0] for r in sql(db_path, "SELECT sender FROM journal WHERE "
                                              "etype = 'Escalation'")}
    assert senders <= {"Dispatcher/d-1"}
    assert _calls(log) == [f"model:{n}" for n in range(12)]
    # Delivered rows go, but each run's newest, which keeps its numbering.
    assert sql(db_path, "SELECT seq, delivered FROM outbox") in ([(12, True)], [(12, 1)])


class Stray(corral.Entity):
    def __init__(self, init: AgentInput) -> None:
        self.refused: list[str] = []

    @corral.signal
    def poke(self) -> None:
        pass

    @corral.query
    def seen(self) -> list[str]:
        return self.refused

    async def run(self) -> list[str]:
        for args in ((Reason, "e", Escalation.open, Reason(n=0, text="")),
                     (Escalation, "bad key!", Escalation.open, Reason(n=0, text="")),
                     (Escalation, "e", Stray.poke, None),
                     (Escalation, "e", Escalation.open, {"n": "x"})):
            try:
                self.send(*args)
            except corral.CorralError as err:
                self.refused.append(type(err).__name__)
        await self.wait_for(lambda: bool(self.refused[3:]))
        return self.refused


async def test_a_bad_send_is_refused_where_it_is_made_and_nothing_is_written(
        db_path: str, tmp_path: Path) -> None:
    async with corral.open_runtime(db_path, entities=[Stray, Escalation]) as rt:
        ref = rt.ref(Stray, "s-1")
        await ref.signal_with_start(Stray.poke, start=AgentInput(log=""))
        assert sorted(await ref.result(timeout=30)) == [
            "InvalidArgumentError", "InvalidKeyError", "InvalidPayloadError",
            "UnknownHandlerError"]
    assert sql(db_path, "SELECT count(*) FROM outbox") == [(0,)]


class Renewed(corral.Entity):
    """Steps once per run, continuing as new after the first run's step."""

    def __init__(self, init: AgentInput) -> None:
        self.log = init.log
        self.total = init.steps
        self.go = False

    @corral.signal
    def proceed(self) -> None:
        self.go = True

    async def run(self) -> str:
        answer = await self.step(call_model, self.log, self.total, name="model")
        if self.total == 0:
            self.continue_as_new(AgentInput(log=self.log, steps=1))
        await self.wait_for(lambda: self.go)
        return answer.key


async def test_continue_as_new_deletes_the_runs_step_records_and_the_next_run_steps_anew(
        db_path: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with corral.open_runtime(db_path, entities=[Renewed]) as rt:
        ref = rt.ref(Renewed, "n-1")
        await ref.start(start=AgentInput(log=str(log), steps=0))
        await wait_until(lambda: len(_calls(log)) == 2, "run 2 makes its step")
        await wait_until(lambda: sql(db_path, "SELECT run_id FROM steps") == [(2,)],
                         "run 1's record is gone, run 2's is there")
        await ref.signal(Renewed.proceed)
        assert await ref.result(timeout=30) == "Renewed/n-1/2/model"
    assert _calls(log) == ["model:0", "model:1"]
    assert sql(db_path, "SELECT count(*) FROM steps") == [(0,)]


class Adder:
    """A callable that cannot be hashed (it defines `__eq__` only)."""

    def __eq__(self, other: object) -> bool:
        return self is other

    def __call__(self, n: int) -> int:
        return n + 1


class Callables(corral.Entity):
    def __init__(self, init: AgentInput) -> None:
        self.log = init.log

    async def run(self) -> int:
        return await self.step(Adder(), 1, name="add")


async def test_a_step_may_call_any_callable_even_one_that_cannot_be_hashed(
        db_path: str, tmp_path: Path) -> None:
    async with corral.open_runtime(db_path, entities=[Callables]) as rt:
        ref = rt.ref(Callables, "c-1")
        await ref.start(start=AgentInput(log=""))
        assert await ref.result(timeout=30) == 2


async def double(n: int) -> int:
    return 2 * n


class Gatherer(corral.Entity):
    """One send, then two steps at once: only one of their records may write it."""

    def __init__(self, init: AgentInput) -> None:
        self.log = init.log

    async def run(self) -> int:
        self.send(Escalation, "esc-g", Escalation.open, Reason(n=7, text="once"),
                  start=EscalationInput())
        a, b = await asyncio.gather(self.step(double, 1, name="a"),
                                    self.step(double, 2, name="b"))
        return a + b


async def test_two_steps_recorded_at_once_write_a_send_made_before_them_once(
        db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Gatherer, Escalation]) as rt:
        ref = rt.ref(Gatherer, "g-1")
        await ref.start(start=AgentInput(log=""))
        assert await ref.result(timeout=30) == 6
        await wait_until(lambda: _seen(rt, "esc-g", 1), "the send arrives")
        assert sql(db_path, "SELECT count(*) FROM outbox") == [(1,)]
        assert await rt.ref(Escalation, "esc-g").query(Escalation.seen) == [7]
