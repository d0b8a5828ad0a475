"""Durable steps (`Entity.step`): a completed step's function never runs again after
its result is recorded; retries, per-attempt timeouts and exhausted retries; bounded
records; bad input refused. On both stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import corral
from step_entities import Agent, AgentInput, Flaky, Reuser, call_model
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
        assert len(await ref.result(timeout=30)) == 8
    assert _calls(log) == []


def test_step_key_outside_a_step_is_refused() -> None:
    with pytest.raises(corral.InvalidArgumentError):
        corral.step_key()
