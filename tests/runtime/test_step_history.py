"""Steps in history and metrics: each step of a run, with its attempts, duration,
outcome and where it ran, in `ref.history()` and `corral history` (also while it
retries), bounded per run, purged with its run; step metrics counted per attempt with
labels that stay bounded. On both stores."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import corral
import corral.metrics
from corral.cli import main
from corral.persistence import (
    STEP_ERROR_CHARS,
    STEP_HISTORY_PER_RUN,
    STEP_TRACEBACK_CHARS,
    open_store,
)
from procs import wait_until
from step_history_entities import Gated, Hostile, Many, Ticket, TicketInput
from stores import sql

TESTS = Path(__file__).resolve().parents[1] / "support"


def _samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of this process's registry, by name and sorted labels."""
    text = corral.metrics.exposition().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
           **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_a_retried_step_and_one_that_failed_for_good_show_their_attempts_in_history(
        db_path: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    before = _samples()
    async with corral.open_runtime(db_path, entities=[Ticket]) as rt:
        ref = rt.ref(Ticket, "t-9104")
        await ref.start(start=TicketInput(log=str(log)))
        reply = await ref.result(timeout=30)
        assert reply is not None
        assert reply.attempt == 3
        assert await ref.query(Ticket.failed) == "RuntimeError: tool for 9104 is down"
        h = await ref.history()
    model, tool = h.steps
    assert (model.run_id, model.name, model.status, model.attempts) == (
        1, "model:9104", "completed", 3)
    assert model.result is not None
    assert json.loads(model.result) == {"text": "answer to 9104", "attempt": 3}
    # Completed after two failures: the last one's error and traceback say why it retried.
    assert model.error == "ConnectionError: model overloaded (attempt 2)"
    assert model.traceback is not None
    assert "in model_fails_twice" in model.traceback
    assert (tool.name, tool.status, tool.attempts, tool.result) == (
        "tool:9104", "failed", 3, None)
    assert tool.error == "RuntimeError: tool for 9104 is down"
    assert tool.traceback is not None
    assert "in tool_is_down" in tool.traceback
    assert tool.traceback.rstrip().endswith("RuntimeError: tool for 9104 is down")
    for step in h.steps:
        assert (step.ray_task, step.node) == (False, None)
        assert step.duration >= 0
        assert step.started_at > 0
    assert model.started_at <= tool.started_at
    # The run ended: its step records are gone, its steps stay in history.
    assert sql(db_path, "SELECT * FROM steps") == []
    assert len(sql(db_path, "SELECT * FROM step_history")) == 2

    after = _samples()
    for step, attempts, failures in (("model", 3, 0), ("tool", 3, 1)):
        labels: dict[str, str] = {"entity_type": "Ticket", "step": step}
        assert _value(after, "corral_step_attempts_total", **labels) - _value(
            before, "corral_step_attempts_total", **labels) == attempts
        assert _value(after, "corral_step_failures_total", **labels) - _value(
            before, "corral_step_failures_total", **labels) == failures
        assert _value(after, "corral_step_seconds_count", **labels) - _value(
            before, "corral_step_seconds_count", **labels) == attempts
    # The label is the name up to its ":": no ticket id in any series.
    assert not any("9104" in value for _, labels in after for _, value in labels)


async def test_a_step_still_retrying_is_in_history_with_its_attempts_and_last_error(
        db_path: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with corral.open_runtime(db_path, entities=[Gated]) as rt:
        ref = rt.ref(Gated, "g-1")
        await ref.start(start=TicketInput(log=str(log)))

        async def retrying_twice() -> bool:
            steps = (await ref.history()).steps
            return bool(steps) and steps[0].attempts >= 2
        await wait_until(retrying_twice, "the step is in history while it retries")
        [step] = (await ref.history()).steps
        assert (step.name, step.status, step.result) == ("gated", "retrying", None)
        assert step.error == "ConnectionRefusedError: the gate is shut"
        assert step.traceback is not None
        assert "in fails_until_gate" in step.traceback
        assert step.attempts <= log.read_text().splitlines().count("gated")
        assert sql(db_path, "SELECT * FROM steps") == []  # no record until it completes

        Path(str(log) + ".gate").write_text("")  # noqa: ASYNC240 (tiny test write)
        assert await ref.result(timeout=30) == "through"
        [done] = (await ref.history()).steps
    assert (done.status, done.result, done.attempts) == (
        "completed", '"through"', log.read_text().splitlines().count("gated"))
    assert done.started_at == step.started_at
    assert done.duration >= step.duration


async def test_a_hostile_error_is_stored_cut_and_escaped_and_read_back(
        db_path: str, tmp_path: Path) -> None:
    async with corral.open_runtime(db_path, entities=[Hostile]) as rt:
        ref = rt.ref(Hostile, "h-1")
        await ref.start(start=TicketInput(log=str(tmp_path / "calls.log")))
        failure = await ref.result(timeout=30)
        [step] = (await ref.history()).steps
    assert failure.startswith("ValueError: bad <b>\\ud800 \\x00 \x1b[31m \u202e")
    assert step.status == "failed"
    assert step.error is not None
    assert step.error.startswith("ValueError: bad <b>\\ud800 \\x00 \x1b[31m \u202exxx")
    assert step.error.endswith(" characters cut]")
    assert len(step.error) < STEP_ERROR_CHARS + 40
    assert step.traceback is not None
    assert step.traceback.startswith("[... ")
    assert len(step.traceback) < STEP_TRACEBACK_CHARS + 40
    assert step.traceback.endswith("x" * 100 + "\n")  # its end: the error's last line


async def test_a_checkpoint_keeps_the_runs_newest_steps_and_retention_purges_them(
        db_path: str, tmp_path: Path) -> None:
    async with corral.open_runtime(db_path, entities=[Many]) as rt:
        ref = rt.ref(Many, "m-1")
        await ref.start(start=TicketInput(log=str(tmp_path / "calls.log")))
        await wait_until(lambda: ref.query(Many.checkpointed), "the checkpoint", timeout=120)
        steps = (await ref.history()).steps
        assert len(steps) == STEP_HISTORY_PER_RUN
        assert steps[0].name == "s:1"  # the oldest went
        assert steps[-1].name == f"s:{STEP_HISTORY_PER_RUN}"
        assert sql(db_path, "SELECT count(*) FROM step_history") == [
            (STEP_HISTORY_PER_RUN,)]  # stored, not only shown
        await ref.signal(Many.proceed)
        await ref.result(timeout=30)
    store = await open_store(db_path, shards=16)
    try:
        purged = await store.purge_closed("Many", closed_before=1e12, limit=10)
        assert purged.entities == 1
        assert await store.step_history("Many", "m-1", limit=10) == []
    finally:
        await store.close()


def test_corral_history_lists_the_steps_with_their_attempts(
        db_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    async def seed() -> None:
        async with corral.open_runtime(db_path, entities=[Ticket]) as rt:
            ref = rt.ref(Ticket, "t-cli")
            await ref.start(start=TicketInput(log=str(tmp_path / "calls.log")))
            await ref.result(timeout=30)
    asyncio.run(seed())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    monkeypatch.setenv("CORRAL_STORE", db_path)
    monkeypatch.setenv("CORRAL_APP", "step_history_entities:app")

    assert main(["history", "Ticket", "t-cli", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    steps = [(s["name"], s["status"], s["attempts"], s["error"], s["ray_task"])
             for s in found["steps"]]
    assert steps == [
        ("model:9104", "completed", 3, "ConnectionError: model overloaded (attempt 2)", False),
        ("tool:9104", "failed", 3, "RuntimeError: tool for 9104 is down", False)]
    assert "in tool_is_down" in found["steps"][1]["traceback"]

    assert main(["history", "Ticket", "t-cli"]) == 0
    text = capsys.readouterr().out
    assert "steps" in text
    rows = [line.split() for line in text.splitlines() if "9104 " in line]
    assert [row[:4] for row in rows] == [["1", "model:9104", "completed", "3"],
                                          ["1", "tool:9104", "failed", "3"]]
    assert "RuntimeError: tool for 9104 is down" in text


async def test_a_damaged_step_row_is_a_corrupt_row_error_naming_it(
        db_path: str, tmp_path: Path) -> None:
    async with corral.open_runtime(db_path, entities=[Ticket]) as rt:
        ref = rt.ref(Ticket, "t-bad")
        await ref.start(start=TicketInput(log=str(tmp_path / "calls.log")))
        await ref.result(timeout=30)
        sql(db_path, "UPDATE step_history SET status = 'bogus' WHERE name = 'tool:9104'")
        with pytest.raises(corral.CorruptRowError) as caught:
            await ref.history()
    assert (caught.value.table, caught.value.column, caught.value.key) == (
        "step_history", "status", "t-bad")
    assert "'tool:9104'" in str(caught.value)


async def test_a_step_retrying_when_its_run_is_terminated_is_interrupted_in_history(
        db_path: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with corral.open_runtime(db_path, entities=[Gated]) as rt:
        ref = rt.ref(Gated, "g-stop")
        await ref.start(start=TicketInput(log=str(log)))

        async def retrying() -> bool:
            steps = (await ref.history()).steps
            return bool(steps) and steps[0].status == "retrying"
        await wait_until(retrying, "the step retrying")
        await ref.terminate(reason="enough")
        with pytest.raises(corral.EntityTerminatedError):
            await ref.result(timeout=30)
        [step] = (await ref.history()).steps
    assert (step.status, step.error) == ("interrupted",
                                         "ConnectionRefusedError: the gate is shut")
