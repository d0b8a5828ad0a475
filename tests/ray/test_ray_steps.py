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


@pytest.fixture
def namespace(ray_address: str) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    yield name
    stop_hosts(name)


def _runtime(db_path: str, namespace: str) -> corral.Runtime:
    return corral.open_runtime(db_path, entities=[RayAgent, Escalation], backend="ray", deploy=True,
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
