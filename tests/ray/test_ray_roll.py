"""Rolling deploys on Ray (`corral.runtime.roll_ray_hosts`, `corral deploy roll`): the
shard actors are replaced one at a time, through the graceful hand-off, under a stream
of signals from clients of both releases and from Ray tasks (`ray_roll_stream`).

The session's Ray instance and a SQLite store keep these fast;
`test_ray_roll_cluster.py` rolls a multi-node cluster on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

import corral
import ray_roll_bad
import ray_roll_entities as release2
import ray_workers as release1
from corral._cli import main
from corral.runtime import roll_ray_hosts
from corral.runtime.ray._connection import stop_hosts
from procs import sql
from ray_roll_stream import (
    Deployment,
    actors,
    assert_each_ack_applied_once,
    client,
    hosts_now,
    roll_under_stream,
    start_all,
)
from ray_workers import Item

SHARDS = 2
KEYS = [f"roll-{i}" for i in range(6)]


@pytest.fixture
def namespace(ray_address: str) -> Iterator[str]:
    name = f"roll-{uuid.uuid4().hex[:8]}"
    yield name
    stop_hosts(name)


@pytest.fixture
def deployment(tmp_path: Path, namespace: str) -> Deployment:
    return Deployment(str(tmp_path / "corral.db"), namespace, SHARDS, KEYS)


def named_actors(namespace: str) -> set[str]:
    """The deployment's actors but its placer."""
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == namespace} - {f"corral/{namespace}/placer"}


async def test_a_roll_under_a_stream_moves_every_shard_to_release_2_and_loses_nothing(
        deployment: Deployment) -> None:
    run = await roll_under_stream(deployment)
    assert not run.errors, run.errors[:5]
    assert [s.shard for s in run.steps] == list(range(SHARDS))
    for step in run.steps:
        assert step.old_actor == run.before[step.shard]["name"]
        # the host of the new build on the same node, in the same slot
        assert step.new_actor.split("@")[0] == step.old_actor.split("@")[0]
        assert step.new_actor != step.old_actor
        assert step.epoch > run.before[step.shard]["epoch"], "taken at a new epoch"
        assert 0 <= step.pause < 10
    assert_each_ack_applied_once(run.applied, run.acked)
    tags = [i for items in run.applied.values() for i in items if i.startswith("tag:")]
    assert tags, "release 2 applied the entries of the handler only it has"
    assert len(run.acked) > 200
    after = await actors(deployment)
    assert {a["name"] for a in after.values()} == {s.new_actor for s in run.steps}
    fingerprint = release2.Counter._corral_definition.fingerprint
    assert all(a["fingerprints"]["Counter"] == fingerprint for a in after.values())
    assert named_actors(deployment.namespace) == {s.new_actor for s in run.steps}, \
        "the old actors are gone"
    async with corral.open_runtime(deployment.store, entities=[], shards=SHARDS,
                                   host=False) as local:
        builds = {b.fingerprint: b for b in await local.builds("Counter")}
    new = builds[fingerprint]
    assert new.newest, "the roll's actors registered release 2 as the newest build"
    assert [p.role for p in new.processes] == ["host"]  # one host actor holds both shards
    assert not builds[release1.Counter._corral_definition.fingerprint].processes
    again = await asyncio.to_thread(roll_ray_hosts, deployment.namespace, [release2.Counter],
                                    actor_options=deployment.ray_options)
    assert again.steps == ()
    assert again.skipped == tuple(range(SHARDS))


async def test_an_incompatible_roll_is_refused_with_the_differences_before_anything_moves(
        deployment: Deployment) -> None:
    async with client(deployment, release1.Counter) as rt:
        await start_all(rt, KEYS)
        before = hosts_now(deployment.namespace)
        with pytest.raises(corral.IncompatibleBuildError) as caught:
            await asyncio.to_thread(roll_ray_hosts, deployment.namespace,
                                    [ray_roll_bad.Counter])
        assert any(d.startswith("Counter signal add") for d in caught.value.differences), \
            caught.value.differences
        assert "corral deploy stop" in str(caught.value)
        assert named_actors(deployment.namespace) == before
        await rt.ref(release1.Counter, KEYS[0]).signal(release1.Counter.add, Item(id="x"))


async def test_a_client_of_an_incompatible_build_is_refused_with_the_differences(
        deployment: Deployment) -> None:
    async with client(deployment, release1.Counter) as rt:
        await start_all(rt, KEYS)
    async with client(deployment, ray_roll_bad.Counter, deploy=False) as rt:
        with pytest.raises(corral.DefinitionMismatchError) as caught:
            await rt.ref(ray_roll_bad.Counter, KEYS[0]).update(
                ray_roll_bad.Counter.add_and_count, Item(id="y"))
    assert "signal add" in str(caught.value)


async def test_a_sigkill_of_the_receiving_actor_mid_hand_off_loses_nothing(
        deployment: Deployment) -> None:
    """The heir of shard 0 is killed once its request for the shard is in the store
    (its holder hands the shard to a process that is gone, or has not yet): Ray
    restarts it, it takes the shard at a new epoch, and the stream loses nothing."""
    killed: list[int] = []

    def kill_the_heir() -> None:
        deadline = time.monotonic() + 120
        while not killed and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                rows = sql(deployment.store,
                           "SELECT requester FROM lease_handoffs WHERE shard = 0")
                if rows:
                    pid = int(rows[0][0].split("-")[0])
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.002)

    run = await roll_under_stream(deployment, kill_the_heir)
    assert killed, "the heir's request was never seen"
    assert not run.errors, run.errors[:5]
    assert run.steps[0].epoch > run.before[0]["epoch"]
    assert_each_ack_applied_once(run.applied, run.acked)


def test_corral_deploy_roll_prints_each_shard_moved_and_refuses_an_incompatible_build(
        deployment: Deployment, capsys: pytest.CaptureFixture[str]) -> None:
    async def start() -> None:
        async with client(deployment, release1.Counter) as rt:
            await start_all(rt, KEYS)
    asyncio.run(start())
    (old,) = hosts_now(deployment.namespace)
    argv = ["deploy", "roll", "--namespace", deployment.namespace, "--app"]
    assert main([*argv, "ray_roll_bad:ENTITIES"]) == 1
    assert "IncompatibleBuildError" in capsys.readouterr().err
    assert main([*argv, "ray_roll_entities:ENTITIES"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for index in range(SHARDS):
        assert any(line.startswith(f"shard {index}: {old} -> ") for line in lines), lines
    assert f"moved {SHARDS} shards in " in lines[-1], lines
    assert main([*argv, "ray_roll_entities:ENTITIES"]) == 0
    assert "nothing changed" in capsys.readouterr().out
