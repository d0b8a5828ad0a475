"""Rolling deploys on Ray (`corral.runtime.roll_ray_hosts`): the shard actors are
replaced one at a time, through the graceful hand-off, under a stream of signals.

Release 1 is `ray_workers.Counter`, release 2 `ray_roll_entities.Counter` (one more
signal, `tag`); clients of both releases, and Ray tasks of release 1, send throughout.
"Applied once" is checked on the entity's own record (`Counter.items`). The session's
Ray instance and a SQLite store keep these fast; `test_ray_roll_cluster.py` rolls a
multi-node cluster on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import ray

import corral
import ray_roll_bad
import ray_roll_entities as release2
import ray_workers as release1
from corral._cli import main
from corral.runtime import RollStep, roll_ray_hosts
from corral.runtime._ray import RayBackend, stop_hosts
from corral.runtime._ray_directory import host_of
from corral.runtime._ray_host import actor_name
from procs import sql
from ray_workers import RUNTIME_ENV, Item, Seen, Start

SHARDS = 2
KEYS = [f"roll-{i}" for i in range(6)]


@pytest.fixture
def namespace(ray_address: str) -> Iterator[str]:
    name = f"roll-{uuid.uuid4().hex[:8]}"
    yield name
    stop_hosts(name)


@contextlib.asynccontextmanager
async def client(store: str, namespace: str, entity: type[corral.Entity]
                 ) -> AsyncIterator[corral.Runtime]:
    async with corral.open_runtime(store, backend="ray", namespace=namespace, shards=SHARDS,
                                   lease_ttl=3.0, entities=[entity],
                                   ray_options={"runtime_env": RUNTIME_ENV}) as rt:
        yield rt


async def actors(rt: corral.Runtime) -> dict[int, dict[str, Any]]:
    """`info()` of the actor hosting each shard now."""
    backend = rt.backend
    assert isinstance(backend, RayBackend)
    found = {}
    for index in range(SHARDS):
        name = host_of(backend.spec.namespace, index, actor_name(backend.spec, index))
        found[index] = await ray.get_actor(name, namespace=backend.spec.namespace
                                           ).info.remote()
    return found


async def start_all(rt: corral.Runtime) -> None:
    assert {rt.router.shard_of("Counter", k) for k in KEYS} == set(range(SHARDS))
    for key in KEYS:
        await rt.ref(release1.Counter, key).signal_with_start(
            release1.Counter.add, Item(id=f"{key}-first"), start=Start(tenant="t"),
            message_id=f"{key}-first")


async def roll_under_stream(store: str, namespace: str,
                            during: Callable[[], Any] | None = None
                            ) -> tuple[list[RollStep], dict[str, list[str]], set[tuple[str, str]],
                                       list[str], dict[int, dict[str, Any]]]:
    """Roll to release 2 while release 1 and 2 clients and two Ray tasks send; the
    steps, what each entity applied, the acks (key, item), the callers' errors, and
    the actors before the roll. `during` runs in a thread beside the roll."""
    async with client(store, namespace, release1.Counter) as rt1, \
            client(store, namespace, release2.Counter) as rt2:
        await start_all(rt1)
        before = await actors(rt1)
        acked = {(k, f"{k}-first") for k in KEYS}
        errors: list[str] = []
        stop = asyncio.Event()

        async def sender(rt: corral.Runtime, entity: Any, handler: Any, who: str,
                         mark: str = "") -> None:
            n = 0
            while not stop.is_set() or n < 20:
                key, mid = KEYS[n % len(KEYS)], f"{who}-{n}"
                n += 1
                try:
                    await rt.ref(entity, key).signal(handler, Item(id=mid), message_id=mid)
                except Exception as err:
                    errors.append(f"{mid}: {type(err).__name__}: {err}")
                else:
                    acked.add((key, f"{mark}{mid}"))

        remote = ray.remote(release2.task_stream).options(runtime_env=RUNTIME_ENV)
        tasks = [remote.remote(store, namespace, SHARDS, KEYS, f"task{t}", 60)
                 for t in range(2)]
        r1, r2 = release1.Counter, release2.Counter
        senders = [asyncio.create_task(sender(rt1, r1, r1.add, f"r1s{s}")) for s in range(3)]
        senders += [asyncio.create_task(sender(rt2, r2, r2.add, "r2s")),
                    asyncio.create_task(sender(rt2, r2, r2.tag, "r2t", "tag:"))]
        steps: list[RollStep] = []
        side = asyncio.to_thread(during) if during else asyncio.sleep(0)
        report, _ = await asyncio.gather(
            asyncio.to_thread(roll_ray_hosts, namespace, [release2.Counter],
                              actor_options={"runtime_env": RUNTIME_ENV},
                              on_step=steps.append),
            side)
        stop.set()
        await asyncio.gather(*senders)
        for acks in await asyncio.to_thread(ray.get, tasks):
            acked.update((k, m) for k, m in acks)
        assert list(report.steps) == steps
        applied: dict[str, list[str]] = {}
        for key in KEYS:
            ref = rt2.ref(release2.Counter, key)
            deadline = time.monotonic() + 60
            while (d := await ref.describe()).applied_seq != d.accepted_seq:
                assert time.monotonic() < deadline, f"{key}: not all applied"
                await asyncio.sleep(0.05)
            seen: Seen = await ref.query(release2.Counter.seen)
            applied[key] = seen.items
        return steps, applied, acked, errors, before


def assert_each_ack_applied_once(applied: dict[str, list[str]],
                                 acked: set[tuple[str, str]]) -> None:
    for key, items in applied.items():
        twice = sorted({i for i in items if items.count(i) > 1})
        assert not twice, f"{key}: applied twice: {twice[:5]}"
        missing = sorted(m for k, m in acked if k == key and m not in items)
        assert not missing, f"{key}: acknowledged but never applied: {missing[:5]}"


async def test_a_roll_under_a_stream_moves_every_shard_to_release_2_and_loses_nothing(
        tmp_path: Any, namespace: str) -> None:
    store = str(tmp_path / "corral.db")
    steps, applied, acked, errors, before = await roll_under_stream(store, namespace)
    assert not errors, errors[:5]
    assert [s.shard for s in steps] == list(range(SHARDS))
    for step in steps:
        assert step.old_actor == actor_name_of(namespace, step.shard)
        assert step.new_actor.startswith(f"{step.old_actor}@")
        assert step.epoch > before[step.shard]["epoch"], "taken at a new epoch"
        assert 0 <= step.pause < 10
    assert_each_ack_applied_once(applied, acked)
    tags = [i for items in applied.values() for i in items if i.startswith("tag:")]
    assert tags, "release 2 applied the entries of the handler only it has"
    assert len(acked) > 200
    async with client(store, namespace, release2.Counter) as rt:
        after = await actors(rt)
    assert {a["name"] for a in after.values()} == {s.new_actor for s in steps}
    assert all(a["fingerprints"]["Counter"] == release2.Counter._corral_definition.fingerprint
               for a in after.values())
    names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == namespace}
    assert names == {s.new_actor for s in steps}, "the old actors are gone"
    again = await asyncio.to_thread(roll_ray_hosts, namespace, [release2.Counter])
    assert again.steps == ()
    assert again.skipped == tuple(range(SHARDS))


def actor_name_of(namespace: str, index: int) -> str:
    return f"corral/{namespace}/shard-{index}"


async def test_an_incompatible_roll_is_refused_with_the_differences_before_anything_moves(
        tmp_path: Any, namespace: str) -> None:
    store = str(tmp_path / "corral.db")
    async with client(store, namespace, release1.Counter) as rt:
        await start_all(rt)
        with pytest.raises(corral.IncompatibleBuildError) as caught:
            await asyncio.to_thread(roll_ray_hosts, namespace, [ray_roll_bad.Counter])
        assert any(d.startswith("signal add") for d in caught.value.differences), \
            caught.value.differences
        assert "stop_ray_hosts" in str(caught.value)
        names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["namespace"] == namespace}
        assert names == {actor_name_of(namespace, i) for i in range(SHARDS)}
        await rt.ref(release1.Counter, KEYS[0]).signal(release1.Counter.add, Item(id="x"))


async def test_a_client_of_an_incompatible_build_is_refused_with_the_differences(
        tmp_path: Any, namespace: str) -> None:
    store = str(tmp_path / "corral.db")
    async with client(store, namespace, release1.Counter) as rt:
        await start_all(rt)
    async with client(store, namespace, ray_roll_bad.Counter) as rt:
        with pytest.raises(corral.DefinitionMismatchError) as caught:
            await rt.ref(ray_roll_bad.Counter, KEYS[0]).update(
                ray_roll_bad.Counter.add_and_count, Item(id="y"))
    assert "signal add" in str(caught.value)


async def test_a_sigkill_of_the_receiving_actor_mid_hand_off_loses_nothing(
        tmp_path: Any, namespace: str) -> None:
    """The heir of shard 0 is killed once its request for the shard is in the store
    (its holder hands the shard to a process that is gone, or has not yet): Ray
    restarts it, it takes the shard at a new epoch, and the stream loses nothing."""
    store = str(tmp_path / "corral.db")
    killed: list[int] = []

    def kill_the_heir() -> None:
        deadline = time.monotonic() + 120
        while not killed and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                rows = sql(store, "SELECT requester FROM lease_handoffs WHERE shard = 0")
                if rows:
                    pid = int(rows[0][0].split("-")[0])
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.002)

    steps, applied, acked, errors, before = await roll_under_stream(store, namespace,
                                                                    kill_the_heir)
    assert killed, "the heir's request was never seen"
    assert not errors, errors[:5]
    assert steps[0].epoch > before[0]["epoch"]
    assert_each_ack_applied_once(applied, acked)


def test_corral_deploy_roll_prints_each_shard_moved_and_refuses_an_incompatible_build(
        tmp_path: Any, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "corral.db")

    async def start() -> None:
        async with client(store, namespace, release1.Counter) as rt:
            await start_all(rt)
    asyncio.run(start())
    argv = ["deploy", "roll", "--namespace", namespace, "--app"]
    assert main([*argv, "ray_roll_bad:ENTITIES"]) == 1
    assert "IncompatibleBuildError" in capsys.readouterr().err
    assert main([*argv, "ray_roll_entities:ENTITIES"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for index in range(SHARDS):
        assert any(line.startswith(f"shard {index}: {actor_name_of(namespace, index)} -> ")
                   for line in lines), lines
    assert lines[-1].startswith(f"rolled {SHARDS} shards in ")
    assert main([*argv, "ray_roll_entities:ENTITIES"]) == 0
    assert capsys.readouterr().out.startswith("rolled 0 shards in ")
