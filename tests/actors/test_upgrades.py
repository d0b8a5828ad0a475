"""`state_version` and `@corral.upgrade` hooks: old snapshots are brought forward step
by step; a snapshot the code cannot bring forward (a rollback, a missing step) is
refused without failing the run or touching the store (issue 22)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

import corral
from procs import wait_until
from stores import sql

FAST = corral.RetryPolicy(max_attempts=2, initial_backoff=0.001, max_backoff=0.01)


class Edit(BaseModel):
    text: str


class DocV1(corral.Entity):
    name = "Doc"
    retry = FAST
    snapshots = corral.SnapshotPolicy(every=1, keep=1)

    def __init__(self) -> None:
        self.title = ""
        self.urgent = False

    @corral.signal
    def edit(self, e: Edit) -> None:
        self.title = e.text
        self.urgent = e.text.endswith("!")


class DocV2(corral.Entity):
    """Version 2: `urgent: bool` became `priority: str`."""

    # A rollback suspends the run: retried forever, quickly here, never failed.
    run_retry = corral.RetryPolicy(max_attempts=None, initial_backoff=0.01, max_backoff=0.05)
    name = "Doc"
    retry = FAST
    snapshots = corral.SnapshotPolicy(every=1, keep=1)
    state_version = 2

    def __init__(self) -> None:
        self.title = ""
        self.priority = "normal"

    @corral.upgrade(from_version=1)
    def _urgent_to_priority(state: dict[str, Any]) -> dict[str, Any]:
        urgent = state.pop("urgent")
        return {**state, "priority": "high" if urgent else "normal"}

    @corral.signal
    def edit(self, e: Edit) -> None:
        self.title = e.text

    @corral.query
    def view(self) -> list[str]:
        return [self.title, self.priority]


class DocV3(corral.Entity):
    """Version 3: `title` became `subject`."""

    name = "Doc"
    retry = FAST
    snapshots = corral.SnapshotPolicy(every=1, keep=1)
    state_version = 3

    def __init__(self) -> None:
        self.subject = ""
        self.priority = "normal"

    _urgent_to_priority = DocV2._urgent_to_priority

    @corral.upgrade(from_version=2)
    def _title_to_subject(state: dict[str, Any]) -> dict[str, Any]:
        return {**{k: v for k, v in state.items() if k != "title"}, "subject": state["title"]}

    @corral.signal
    def edit(self, e: Edit) -> None:
        self.subject = e.text

    @corral.query
    def view(self) -> list[str]:
        return [self.subject, self.priority]


class DocV3Gap(corral.Entity):
    """Version 3 without the step from 1."""

    name = "Doc"
    state_version = 3

    def __init__(self) -> None:
        self.subject = ""

    _title_to_subject = DocV3._title_to_subject

    @corral.query
    def view(self) -> list[str]:
        return [self.subject]


async def _written_by(db_path: str, cls: type[corral.Entity], text: str) -> None:
    async with corral.open_runtime(db_path, entities=[cls]) as rt:
        ref = rt.ref(cls, "d-1")
        await ref.signal_with_start(cls.edit, Edit(text=text), start=None)  # type: ignore[attr-defined]
        await ref.describe()
    assert sql(db_path, "SELECT count(*) FROM snapshots") == [(1,)]


async def test_an_upgrade_chain_brings_a_version_1_snapshot_to_version_3(db_path: str) -> None:
    await _written_by(db_path, DocV1, "outage!")
    async with corral.open_runtime(db_path, entities=[DocV3], host=False) as rt:  # replica
        assert await rt.ref(DocV3, "d-1").query(DocV3.view) == ["outage!", "high"]
    async with corral.open_runtime(db_path, entities=[DocV3]) as rt:  # a live activation
        ref = rt.ref(DocV3, "d-1")
        assert await ref.query(DocV3.view, activate=True) == ["outage!", "high"]
        await ref.signal(DocV3.edit, Edit(text="fixed"))
        assert await ref.query(DocV3.view) == ["fixed", "high"]


async def test_a_missing_upgrade_step_is_a_version_error_naming_it(db_path: str) -> None:
    await _written_by(db_path, DocV1, "x")
    with pytest.raises(corral.IncompatibleBuildError, match="from_version=1"):
        async with corral.open_runtime(db_path, entities=[DocV3Gap], host=False):
            pytest.fail("refused at open: the registry knows release 1's state version")
    sql(db_path, "DELETE FROM builds")  # a store from before the registry of builds
    async with corral.open_runtime(db_path, entities=[DocV3Gap], host=False) as rt:
        with pytest.raises(corral.SnapshotVersionError, match="from_version=1") as caught:
            await rt.ref(DocV3Gap, "d-1").query(DocV3Gap.view)
    err = caught.value
    assert (err.stored_version, err.code_version, err.missing_from) == (1, 3, 1)


async def test_a_rollback_is_refused_without_failing_the_run_or_touching_the_store(
        db_path: str) -> None:
    await _written_by(db_path, DocV3, "v3 wrote this")
    snapshot = sql(db_path, "SELECT applied_seq, state FROM snapshots")
    async with corral.open_runtime(db_path, entities=[DocV2]) as rt:  # the older code
        ref = rt.ref(DocV2, "d-1")
        ack = await ref.signal(DocV2.edit, Edit(text="sent during the rollback"))

        async def retried() -> bool:  # suspended and retried, never failed
            held = (await ref.describe()).suspension
            return held is not None and held.attempts >= 3
        await wait_until(retried, "the activation is retried under run_retry")
        held = (await ref.describe()).suspension
        assert held is not None
        assert "newer than this code" in held.error
        with pytest.raises(corral.SnapshotVersionError, match="newer than this code"):
            await ref.query(DocV2.view)
        info = await ref.describe()
        assert info.status is corral.RunStatus.RUNNING
        assert info.applied_seq is None or info.applied_seq < ack.seq
    assert sql(db_path, "SELECT applied_seq, state FROM snapshots") == snapshot
    assert sql(db_path, "SELECT status FROM runs") == [("running",)]
    async with corral.open_runtime(db_path, entities=[DocV3]) as rt:  # v3 again
        ref = rt.ref(DocV3, "d-1")
        assert await ref.query(DocV3.view, activate=True) == ["sent during the rollback",
                                                              "normal"]
