"""Steps as Ray tasks (`self.step(fn, ..., ray_options={...})`) on the Ray backend: the
task runs in a Ray worker, its shard serves other entities while it runs, and its
recorded result is returned after a restart without running the task again."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import corral
from corral.runtime.ray._connection import stop_hosts
from procs import wait_until
from ray_workers import RUNTIME_ENV
from step_entities import AgentInput, Escalation, EscalationInput, RayAgent, Reason
from step_history_entities import RayTicket, TicketInput


@pytest.fixture
def namespace(ray_address: str) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    yield name
    stop_hosts(name)


def _runtime(db_path: str, namespace: str) -> corral.Runtime:
    return corral.open_runtime(db_path, entities=[RayAgent, Escalation, RayTicket],
                               backend="ray", deploy=True,
                               namespace=namespace, shards=1, lease_ttl=5.0,
                               ray_options={"runtime_env": RUNTIME_ENV})


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


async def test_a_step_runs_as_a_ray_task_while_its_shard_serves_others_and_replays(
        db_path: str, namespace: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with _runtime(db_path, namespace) as rt:
        agent = rt.ref(RayAgent, "r-1")
        await agent.start(start=AgentInput(log=str(log)))
        await wait_until(lambda: "ray-model" in _calls(log), "the task runs", timeout=60)
        # The task waits at its gate; the one shard serves another entity meanwhile.
        esc = rt.ref(Escalation, "e-1")
        await esc.signal_with_start(Escalation.open, Reason(n=1, text=""),
                                    start=EscalationInput())
        assert await esc.query(Escalation.seen) == [1]
        assert await agent.query(RayAgent.answered) is None
        Path(str(log) + ".gate").write_text("")  # noqa: ASYNC240 (tiny test write)

        async def answered() -> bool:
            return await agent.query(RayAgent.answered) is not None
        await wait_until(answered, "the step's result is recorded", timeout=60)
    stop_hosts(namespace)  # the shard actor goes: run() starts again in a new one
    async with _runtime(db_path, namespace) as rt:
        agent = rt.ref(RayAgent, "r-1")
        await agent.signal(RayAgent.proceed)
        answer = await agent.result(timeout=60)
    assert answer.key == "RayAgent/r-1/1/model"
    assert answer.n != os.getpid()  # ran in a Ray worker, not here
    assert _calls(log) == ["ray-model"]  # and once


async def test_steps_run_as_ray_tasks_show_their_attempts_node_and_metrics(
        db_path: str, namespace: str, tmp_path: Path) -> None:
    import ray

    log = tmp_path / "calls.log"
    async with _runtime(db_path, namespace) as rt:
        ref = rt.ref(RayTicket, "rt-1")
        await ref.start(start=TicketInput(log=str(log)))
        assert await ref.result(timeout=120) == (
            "answer to 1; RuntimeError: tool for 1 is down")
        model, tool = (await ref.history()).steps
        families = await rt.host_metrics()
    node = ray.get_runtime_context().get_node_id()  # the session's one node
    assert (model.name, model.status, model.attempts, model.ray_task, model.node) == (
        "model:1", "completed", 3, True, node)
    # The error raised in the task, as a step run in the host would say it.
    assert model.error == "ConnectionError: model overloaded (attempt 2)"
    assert model.traceback is not None
    assert "in model_fails_twice" in model.traceback  # the task's own traceback
    assert (tool.status, tool.attempts, tool.ray_task, tool.node) == ("failed", 3, True, node)
    assert tool.error == "RuntimeError: tool for 1 is down"
    # Counted by the host actor, pulled into the deployment's scrape.
    counted: dict[tuple[str, str], float] = {}
    for family in families:
        for s in family.samples:
            if s.labels.get("entity_type") == "RayTicket" and "step" in s.labels:
                counted[(s.name, s.labels["step"])] = counted.get(
                    (s.name, s.labels["step"]), 0.0) + s.value
    assert counted[("corral_step_attempts_total", "model")] == 3
    assert counted[("corral_step_attempts_total", "tool")] == 3
    assert counted[("corral_step_failures_total", "tool")] == 1
    assert counted.get(("corral_step_failures_total", "model"), 0) == 0
    assert counted[("corral_step_seconds_count", "tool")] == 3
