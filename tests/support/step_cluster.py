"""For tests/ray/test_ray_steps_cluster.py: `python step_cluster.py STORE TEMP OUT`.

A `ray.cluster_utils.Cluster` of its own (a head and two nodes with the custom resource
`model`), in this process so it never clashes with the session's Ray. A `NodeAgent`
hosted here runs its step as a Ray task on a `model` node; that node is removed without
grace while the task runs; then the task's gate opens. Writes a JSON report: the nodes
the step's function ran on, the node removed, the run's result, the step records left,
the steps its history lists, and the traces: the start's acceptance span's (recorded
here with the SDK's in-memory exporter) and the one each task ran in, with its node.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import corral
from ray_clusters import on_cluster
from step_entities import AgentInput, NodeAgent
from stores import sql
from trace_spans import named, recording, trace_id


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


async def _scenario(cluster: Any, store: str, log: Path) -> dict[str, Any]:
    with recording() as spans:
        report = await _traced_scenario(cluster, store, log)
        [accept] = named(spans.get_finished_spans(), "corral accept NodeAgent")
    return {**report, "accept_trace": f"{trace_id(accept):032x}",
            "task_traces": [line.split() for line in _calls(Path(str(log) + ".trace"))]}


async def _traced_scenario(cluster: Any, store: str, log: Path) -> dict[str, Any]:
    async with corral.open_runtime(store, entities=[NodeAgent]) as rt:
        ref = rt.ref(NodeAgent, "agent-1")
        await ref.start(start=AgentInput(log=str(log)))
        while not _calls(log):
            await asyncio.sleep(0.02)
        removed = _calls(log)[0]
        victim = next(n for n in cluster.worker_nodes if n.node_id == removed)
        await asyncio.to_thread(cluster.remove_node, victim, False)
        deadline = time.monotonic() + 60
        while len(_calls(log)) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        Path(str(log) + ".gate").write_text("")  # noqa: ASYNC240 (a tiny test write)
        result = await ref.result(timeout=120)
        steps = [{"name": s.name, "status": s.status, "attempts": s.attempts,
                  "ray_task": s.ray_task, "node": s.node}
                 for s in (await ref.history()).steps]
    return {"calls": _calls(log), "removed": removed, "result": result,
            "records": sql(store, "SELECT count(*) FROM steps")[0][0], "steps": steps}


def main(store: str, temp: str, out: str) -> None:
    report = on_cluster(temp, "step-node-loss",
                        lambda cluster: _scenario(cluster, store, Path(temp) / "calls.log"),
                        resources={"model": 1})
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
