"""Traces on Ray: a step run as a Ray task continues its attempt's span, the child of
the span of the handler it follows, in the Ray worker that runs it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import corral
from procs import wait_until
from trace_entities import TaskContext, Tasked
from trace_spans import named, parent_of, recording, span_id, trace_id


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with recording() as exporter:
        yield exporter


async def test_a_step_run_as_a_ray_task_is_a_child_span_of_its_handler_s(
        ray_address: str, tmp_path: Path, spans: InMemorySpanExporter) -> None:
    async with corral.open_runtime(str(tmp_path / "corral.db"), entities=[Tasked]) as rt:
        ref = rt.ref(Tasked, "t-1")
        await ref.signal_with_start(Tasked.go, start=None)

        async def ran() -> list[TaskContext]:
            return await ref.query(Tasked.contexts)
        await wait_until(ran, "the task runs", timeout=60)
        [seen] = await ran()
    got = spans.get_finished_spans()
    [apply] = named(got, "corral apply Tasked.go")
    [attempt] = named(got, "corral step task:0")
    assert parent_of(attempt) == span_id(apply)
    assert attempt.attributes is not None
    assert attempt.attributes["corral.step.ray_task"] is True
    # In the task, in another process: the attempt's context is the current one.
    assert seen.pid != os.getpid()
    assert seen.traceparent is not None
    _, trace_hex, span_hex, _ = seen.traceparent.split("-")
    assert (int(trace_hex, 16), int(span_hex, 16)) == (trace_id(apply), span_id(attempt))
