"""A finished entity keeps its final state (guarantee 16): after its run completes,
fails or is terminated, queries, `state()` (what `corral show --state` and the
dashboard print) and `describe()` read the state as of the close, with the watermark
of what was applied, in this process, after a retention round that keeps the run, and
in a fresh runtime on the same store."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

import corral
import corral.testing
from procs import wait_until

JOBS = 5


class Job(BaseModel):
    n: int


class Jobs(BaseModel):
    queued: list[int]
    done: list[int]


class Worker(corral.Entity):
    """Its handler queues jobs; its `run()` pops and finishes them, then returns, fails
    (start input 1) or waits to be terminated (2): only `run()` changes `done`."""

    retention = corral.Retention(closed_for=3600)

    queued: list[int]
    done: list[int]

    def __init__(self, init: Job) -> None:
        self.then = init.n
        self.queued = []
        self.done = []

    @corral.signal
    def job(self, job: Job) -> None:
        self.queued.append(job.n)

    @corral.query
    def jobs(self) -> Jobs:
        return Jobs(queued=self.queued, done=self.done)

    async def run(self) -> int:
        while len(self.done) < JOBS:
            await self.wait_for(lambda: self.queued, timeout=None)
            self.done.append(self.queued.pop(0))
        if self.then == 1:
            raise corral.FailRun("failed on purpose, after its jobs")
        if self.then == 2:
            await self.wait_for(lambda: False, timeout=None)
        return len(self.done)


FINAL = {"queued": [], "done": list(range(1, JOBS + 1))}


async def _work(rt: corral.Runtime, key: str, *, then: int) -> corral.EntityRef[Worker]:
    ref = rt.ref(Worker, key)
    for n in range(1, JOBS + 1):
        await ref.signal_with_start(Worker.job, Job(n=n), start=Job(n=then))
    if then == 0:
        assert await ref.result(timeout=30) == JOBS
    elif then == 1:
        with pytest.raises(corral.EntityFailedError):
            await ref.result(timeout=30)
    return ref


async def _assert_final(ref: corral.EntityRef[Worker], status: corral.RunStatus,
                        applied: int = JOBS) -> None:
    assert (await ref.query(Worker.jobs)).model_dump() == FINAL
    state: Any = await ref.state()
    jobs = {name: state.state[name] for name in FINAL}
    assert (state.status, state.snapshot_seq, jobs) == (status, applied, FINAL)
    d = await ref.describe()
    assert (d.status, d.accepted_seq, d.applied_seq, d.backlog) \
        == (status, applied, applied, 0)
    history = await ref.history()
    assert (history.applied_seq, [m.status for m in history.messages.items][:JOBS]) \
        == (applied, ["applied"] * JOBS)


async def test_a_completed_worker_answers_the_state_its_run_left_not_a_replay_of_its_signals(
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Worker]) as rt:
        ref = await _work(rt, "done", then=0)
        await _assert_final(ref, corral.RunStatus.COMPLETED)
        assert rt.host is not None
        await rt.host.purge_closed()  # closed an hour ago at the earliest: kept
        await _assert_final(ref, corral.RunStatus.COMPLETED)
    async with corral.open_runtime(db_path, entities=[Worker]) as rt:  # a restarted host
        await _assert_final(rt.ref(Worker, "done"), corral.RunStatus.COMPLETED)


async def test_a_failed_worker_answers_the_state_as_of_its_failure(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Worker]) as rt:
        ref = await _work(rt, "failed", then=1)
        await _assert_final(ref, corral.RunStatus.FAILED)
    async with corral.open_runtime(db_path, entities=[Worker]) as rt:
        await _assert_final(rt.ref(Worker, "failed"), corral.RunStatus.FAILED)


async def test_a_terminated_worker_answers_the_state_as_of_its_terminate(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=[Worker]) as rt:
        ref = await _work(rt, "terminated", then=2)
        await wait_until(lambda: _done(ref), "every job done")
        await ref.terminate("enough")
        with pytest.raises(corral.EntityTerminatedError):
            await ref.result(timeout=30)
        await wait_until(lambda: _settled(ref), "the terminate applied by its host")
        await _assert_final(ref, corral.RunStatus.TERMINATED, applied=JOBS + 1)
    async with corral.open_runtime(db_path, entities=[Worker]) as rt:
        await _assert_final(rt.ref(Worker, "terminated"), corral.RunStatus.TERMINATED,
                            applied=JOBS + 1)


async def _done(ref: corral.EntityRef[Worker]) -> bool:
    return (await ref.query(Worker.jobs)).model_dump() == FINAL


async def _settled(ref: corral.EntityRef[Worker]) -> bool:
    return (await ref.state()).snapshot_seq == JOBS + 1


class WorkerRenumbered(corral.Entity):
    """The next release of `Worker`, whose `done` no longer holds numbers: the final
    state a query on a completed worker restores does not validate."""

    name = "Worker"

    queued: list[int]
    done: list[Job]

    def __init__(self, init: Job) -> None:
        self.queued = []
        self.done = []

    @corral.signal
    def job(self, job: Job) -> None:
        self.queued.append(job.n)


async def test_check_snapshots_checks_the_final_state_a_query_on_a_finished_entity_restores(
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Worker]) as rt:
        await _work(rt, "done", then=0)
    good = await corral.testing.check_snapshots(db_path, entities=[Worker])
    assert good.summary() == "Worker: 1 of 1 restore"
    bad = await corral.testing.check_snapshots(db_path, entities=[WorkerRenumbered])
    assert [(f.key, f.run_id) for f in bad.failures] == [("done", 1)]
    assert "`done` does not validate" in bad.failures[0].error
