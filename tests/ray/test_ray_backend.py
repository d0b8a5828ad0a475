"""The Ray backend: shards as named Ray actors, restarts, fencing, dedicated placement.

One Ray instance serves the whole session (the `ray_address` fixture in conftest.py);
each test uses its own deployment namespace and store file and stops its actors at the
end, but for the API tests that only address keys of their own (`shared`): they share
one deployment, which saves starting its placer and host actor (~3 s) for each.
Entities live in `tests/support/ray_workers.py`, which the shard actors import by name
(`tests/` is on the workers' PYTHONPATH), as an application ships its entity module.

"Applied once" is checked on the entity's own record of what it applied (`Counter.items`,
in application order), never on the runtime's counters alone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import gc
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

import corral
from corral import LeaseLostError, RunStatus
from corral.actors._manifest import manifest
from corral.persistence import (
    Acceptance,
    EntryKind,
    Fence,
    UpdateOutcome,
    canonical_json,
    open_sqlite_store,
    payload_hash,
)
from corral.runtime.client._requests import AcceptBatch, Query
from corral.runtime.client._router import Router
from corral.runtime.host._host import LocalHost
from corral.runtime.host._local_backend import LocalBackend
from corral.runtime.ray._connection import RayBackend, shard_actor_class, stop_hosts
from corral.runtime.ray._shard_host import (
    HOST_PROTOCOL,
    YOUNG_OBJECTS_PER_COLLECTION,
    actor_name,
    host_fingerprint,
)
from procs import sql, wait_until
from ray_workers import (
    ENTITIES,
    TESTS_DIR,
    Alarm,
    Brittle,
    ClientActor,
    Counter,
    Gate,
    Heavy,
    Item,
    Patchy,
    Seen,
    Start,
    Tally,
    Verdict,
    Wake,
    client_task,
    storm,
)

SHARDS = 2
WORKERS = str(Path(TESTS_DIR) / "ray_workers.py")


def fresh_key(prefix: str = "k") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def namespace(ray_address: str) -> Iterator[str]:
    """A deployment of its own; its actors are stopped (leases released) afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    yield name
    stop_hosts(name)


@dataclasses.dataclass(frozen=True)
class Deployment:
    store: str
    namespace: str


@pytest.fixture(scope="module")
def shared(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One deployment (store file and namespace) for the tests of this module that
    address only fresh keys of their own and list nothing type-wide: its actors start
    once, at the first of them, and are stopped after the module."""
    deployment = Deployment(str(tmp_path_factory.mktemp("shared") / "shared.db"),
                            f"t-shared-{uuid.uuid4().hex[:8]}")
    yield deployment
    stop_hosts(deployment.namespace)


@contextlib.asynccontextmanager
async def ray_runtime(store: str, namespace: str, *, deploy: bool = True,
                      **kwargs: Any) -> AsyncIterator[corral.Runtime]:
    """A runtime of the deployment; with `deploy`, its entities declared its release
    first (the current one again is no change), else a pure client."""
    kwargs.setdefault("entities", ENTITIES)
    if deploy:
        kwargs.setdefault("lease_ttl", 5.0)
    async with corral.open_runtime(store, backend="ray", deploy=deploy,
                                   namespace=namespace, shards=SHARDS,
                                   **kwargs) as rt:
        yield rt


def backend(rt: corral.Runtime) -> RayBackend:
    assert isinstance(rt.backend, RayBackend)
    return rt.backend


def keys_on(rt: corral.Runtime, etype: str, shard: int, count: int) -> list[str]:
    keys: list[str] = []
    while len(keys) < count:
        key = fresh_key()
        if rt.router.shard_of(etype, key) == shard:
            keys.append(key)
    return keys


async def until(predicate: Callable[[], Awaitable[bool]], what: str, timeout: float = 60.0
                ) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def assert_applied_once(items: list[str], acked: set[str]) -> None:
    counts = collections.Counter(items)
    twice = sorted(i for i, n in counts.items() if n > 1)
    assert not twice, f"applied more than once: {twice[:10]}"
    missing = sorted(acked - set(items))
    assert not missing, f"acknowledged but never applied: {missing[:10]}"


# -- the API -----------------------------------------------------------------------------


async def test_durable_signal_waits_work_the_same_on_ray(shared: Deployment) -> None:
    async with ray_runtime(shared.store, shared.namespace) as rt:
        ref = rt.ref(Gate, fresh_key("gate"))
        await ref.start(start=Start(tenant="t"))

        async def listed() -> bool:
            return any(w.key == ref.key for w in (await rt.signal_waits(Gate)).items)
        await until(listed, "the gate waits")
        await asyncio.sleep(0.5)  # passivated meanwhile (idle_timeout 0.2 s)
        answers = await asyncio.gather(*(
            ref.deliver(Gate.verdict, Verdict(approved=i == 0, by=f"m{i}"), key=f"k{i}",
                        sender=f"m{i}") for i in range(8)))
        retry = await ref.deliver(Gate.verdict, answers[3].payload or {}, key="k3",
                                  sender="m3")
        result = await ref.result(timeout=60)
    winners = [a for a in answers if a.status == "delivered"]
    assert len(winners) == 1
    assert {a.status for a in answers} == {"delivered", "already_delivered"}
    assert {a.sender for a in answers} == {winners[0].sender}
    assert result == winners[0].payload
    assert retry.status == ("duplicate" if answers[3].status == "delivered"
                            else "already_delivered")


async def test_a_suspended_run_keeps_its_signals_and_resume_applies_them_on_ray(
    shared: Deployment,
) -> None:
    async with ray_runtime(shared.store, shared.namespace) as rt:
        ref = rt.ref(Patchy, fresh_key("patchy"))
        await ref.signal_with_start(Patchy.add, Item(id="bug-1"), start=Start(tenant="t"))

        async def suspended() -> bool:
            return (await ref.describe()).suspension is not None
        await until(suspended, "the run is suspended")
        ids = ["bug-1", *(f"i{n}" for n in range(49)), "patch"]
        for item in ids[1:]:  # 50 signals accepted while suspended
            await ref.signal(Patchy.add, Item(id=item))
        info = await ref.describe()
        assert info.status is RunStatus.RUNNING
        assert info.suspension is not None
        assert info.suspension.attempts == 1  # no message brought it back early
        assert "cannot answer bug-1" in info.suspension.error
        assert [e.suspended for e in (await rt.entities(Patchy)).items] == [True]
        await ref.resume()

        async def answered() -> bool:
            return await ref.query(Patchy.seen) == ids
        await until(answered, "every item answered, in order, after resume()")
        await until(lambda: _not_suspended(ref), "the suspension is cleared")


async def _not_suspended(ref: Any) -> bool:
    return (await ref.describe()).suspension is None


async def test_operators_list_and_inspect_entities_the_same_on_ray(db_path: str,
                                                                   namespace: str) -> None:
    async with ray_runtime(db_path, namespace) as rt:
        keys = sorted(fresh_key("list") for _ in range(5))
        for key in keys:
            await rt.ref(Counter, key).signal_with_start(Counter.add, Item(id="a"),
                                                         start=Start(tenant="t"))
        first = await rt.entities(Counter, limit=3)
        rest = await rt.entities(Counter, limit=3, after=first.next_cursor)
        info = await rt.ref(Counter, keys[0]).describe()
    assert [e.key for e in first.items + rest.items] == keys
    assert rest.next_cursor is None
    assert {(e.status, e.accepted_seq) for e in first.items + rest.items} == \
        {(RunStatus.RUNNING, 1)}
    assert (info.accepted_seq, info.dead_letters, info.open_waits) == (1, 0, ())


async def test_dead_letters_are_listed_paged_replayed_and_discarded_the_same_on_ray(
        db_path: str, namespace: str) -> None:
    async with ray_runtime(db_path, namespace) as rt:
        ref = rt.ref(Brittle, fresh_key("brittle"))
        for item in ("a", "bad-1", "b", "bad-2", "bad-3", "c"):
            await ref.signal_with_start(Brittle.add, Item(id=item), start=Start(tenant="t"))
        assert await ref.query(Brittle.seen) == ["a", "b", "c"]  # after every dead letter
        first = await rt.dead_letters(Brittle, limit=2)
        rest = await ref.dead_letters(after=first[-1].id)
        assert [json.loads(d.payload)["id"] for d in first + rest] == ["bad-1", "bad-2", "bad-3"]
        assert (await ref.describe()).dead_letters == 3
        assert await ref.discard_dead_letter(first[0].id) is True
        ack = await ref.replay_dead_letter(first[1].id)  # still raises: dead-lettered again
        assert ack.status == "accepted"

        async def dead_lettered_again() -> bool:
            ids = [d.id for d in await ref.dead_letters()]
            return len(ids) == 2 and ids[0] == rest[0].id and ids[1] > rest[0].id

        await wait_until(dead_lettered_again, "the replay is dead-lettered under a new id")
        assert await ref.discard_dead_letter(first[0].id) is False


async def test_history_state_and_a_key_prefix_search_answer_the_same_on_ray(
        shared: Deployment) -> None:
    async with ray_runtime(shared.store, shared.namespace) as rt:
        ref = rt.ref(Brittle, fresh_key("brittle"))
        for item in ("a", "bad-1", "b"):
            await ref.signal_with_start(Brittle.add, Item(id=item), start=Start(tenant="t"),
                                        message_id=f"m-{item}")
        assert await ref.query(Brittle.seen) == ["a", "b"]  # after the dead letter
        history = await ref.history()
        state = await ref.state()
        found = await rt.entities(Brittle, key_prefix=ref.key)
    # The shard actor hosts the entity: its live watermark says all three are settled.
    assert [(m.message_id, m.status) for m in history.messages.items] == [
        ("m-a", "applied"), ("m-bad-1", "dead_lettered"), ("m-b", "applied")]
    assert history.applied_seq == 3
    assert history.runs[0].start_input == {"tenant": "t"}
    assert (state.run_id, state.status) == (1, RunStatus.RUNNING)
    assert all(m.seq > (state.snapshot_seq or 0) for m in state.pending.items)
    assert [e.key for e in found.items] == [ref.key]


async def test_a_batch_sent_again_after_it_committed_is_answered_duplicate_on_ray(
        shared: Deployment) -> None:
    """`RayBackend.call` sends a batch again when its actor died, maybe after committing
    it. Ids the runtime made (no message id given) must then be looked up, not taken as
    new (`Acceptance.fresh_id`): the second send answers duplicate, applies nothing."""
    async with ray_runtime(shared.store, shared.namespace) as rt:
        backend = rt.backend
        assert isinstance(backend, RayBackend)
        sent: list[tuple[int, str, AcceptBatch]] = []
        call = backend.call

        async def recording(index: int, etype: str, op: Any, **options: Any) -> Any:
            if isinstance(op, AcceptBatch):
                sent.append((index, etype, op))
            return await call(index, etype, op, **options)

        backend.call = recording  # type: ignore[method-assign]
        ref = rt.ref(Counter, fresh_key("retried"))
        await ref.signal_with_start(Counter.add, Item(id="a"), start=Start(tenant="t"))
        await ref.signal(Counter.add, Item(id="b"))
        backend.call = call  # type: ignore[method-assign]
        assert len(sent) == 2
        for index, etype, batch in sent:  # the retry of each batch, as `call` makes it
            (again,) = await call(index, etype, batch)
            assert not isinstance(again, BaseException), again  # not refused as a repeat
            assert again[0] is True  # AcceptResult.to_wire: `duplicate` first
        async def both_applied() -> bool:
            return len((await ref.query(Counter.seen)).items) >= 2

        await wait_until(both_applied, "both items applied")
        await asyncio.sleep(0.2)  # time for a wrongly accepted repeat to be applied too
        assert (await ref.query(Counter.seen)).items == ["a", "b"]


def acceptance(key: str, shard: int) -> Acceptance:
    """A signal-with-start of `Counter.add` for `key`, said to belong to `shard`."""
    payload = canonical_json({"id": "x"})
    return Acceptance("Counter", key, shard, EntryKind.SIGNAL, "add", fresh_key("m"), payload,
                      payload_hash("add", payload), None, canonical_json({"tenant": "t"}),
                      corral.IdReusePolicy.ALLOW_DUPLICATE, time.time())


async def test_a_shard_actor_refuses_each_acceptance_routed_to_it_wrongly(
        shared: Deployment) -> None:
    """A batch routed with another shard count (or none said) has each key hashed again
    and a key of another shard refused alone; any batch has an acceptance naming another
    shard refused alone. The rest of the batch commits."""
    async with ray_runtime(shared.store, shared.namespace) as rt:
        ours, theirs = keys_on(rt, "Counter", 0, 3), keys_on(rt, "Counter", 1, 1)[0]
        for shards in (None, SHARDS + 1):
            batch = [acceptance(ours[0], 0), acceptance(theirs, 0)]
            accepted, refused = await backend(rt).call(0, "Counter",
                                                       AcceptBatch(0, batch, shards))
            assert not isinstance(accepted, BaseException), accepted
            assert isinstance(refused, corral.CorralError)
            assert "does not belong to shard 0" in str(refused)
        batch = [acceptance(ours[1], 0), acceptance(ours[2], 1)]
        accepted, refused = await backend(rt).call(0, "Counter",
                                                   AcceptBatch(0, batch, SHARDS))
        assert not isinstance(accepted, BaseException), accepted
        assert isinstance(refused, corral.CorralError)
        assert "routed to shard 1" in str(refused)
        assert sql(shared.store, "SELECT count(*) FROM journal WHERE key=?", theirs) == [(0,)]


@pytest.mark.every_version
async def test_the_entity_ref_api_works_the_same_on_ray(shared: Deployment) -> None:
    async with ray_runtime(shared.store, shared.namespace) as rt:
        ref = rt.ref(Counter, fresh_key())
        ack = await ref.signal_with_start(Counter.add, Item(id="a"), start=Start(tenant="t"),
                                          message_id="a")
        assert (ack.status, ack.run_id, ack.seq, ack.started) == ("accepted", 1, 1, True)
        again = await ref.signal_with_start(Counter.add, Item(id="a"), start=Start(tenant="t"),
                                            message_id="a")
        assert (again.status, again.seq) == ("duplicate", 1)
        with pytest.raises(corral.IdempotencyConflictError):
            await ref.signal(Counter.add, Item(id="changed"), message_id="a")
        await ref.signal(Counter.add, {"id": "b"}, message_id="b")
        assert await ref.update(Counter.add_and_count, Item(id="c"), update_id="u") == 3
        assert await ref.update(Counter.add_and_count, Item(id="c"), update_id="u") == 3
        seen: Seen = await ref.query(Counter.seen)
        assert seen.items == ["a", "b", "c"]
        assert seen.pid != os.getpid()  # answered by the shard actor's live entity
        info = await ref.describe()
        assert (info.shard, info.status, info.accepted_seq, info.applied_seq) == (
            ref.shard, RunStatus.RUNNING, 3, 3)
        assert info.hosted_here

        other = rt.ref(Counter, fresh_key())
        with pytest.raises(corral.EntityNotRunningError):
            await other.signal(Counter.add, Item(id="x"))
        with pytest.raises(corral.UnknownHandlerError):  # refused at the client boundary
            await other.signal_with_start("nope", Item(id="x"), start=Start(tenant="t"))
        assert await other.update_with_start(Counter.add_and_count, Item(id="x"),
                                             start=Start(tenant="t")) == 1
        await ref.terminate("done")
        with pytest.raises(corral.EntityTerminatedError):
            await ref.result(timeout=30)
        assert (await ref.describe()).status is RunStatus.TERMINATED


async def test_one_host_actor_per_node_holds_every_shard_and_outlives_its_client(
        db_path: str, namespace: str) -> None:
    key = fresh_key()
    async with ray_runtime(db_path, namespace) as rt:
        ref = rt.ref(Counter, key)
        await ref.signal_with_start(Counter.add, Item(id="a"), start=Start(tenant="t"))
        info = await (await backend(rt).actor("Counter", key)).info.remote()
    names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == namespace}
    node = ray.get_runtime_context().get_node_id()
    assert names == {f"corral/{namespace}/placer", info["name"]}
    assert info["name"].startswith(f"corral/{namespace}/host-{node[:12]}-0@")
    assert sorted(info["shards"]) == list(range(SHARDS))
    # A new client (as another driver would be) reaches the same live entity.
    async with ray_runtime(db_path, namespace) as rt:
        ref = rt.ref(Counter, key)
        await ref.signal(Counter.add, Item(id="b"))
        seen: Seen = await ref.query(Counter.seen)
        assert seen.items == ["a", "b"]


async def test_a_shard_actor_learns_an_entity_type_its_creator_did_not_list(
        db_path: str, namespace: str) -> None:
    async with ray_runtime(db_path, namespace, entities=[Counter]) as rt:
        for shard in range(SHARDS):  # create every shard actor, knowing Counter only
            await rt.ref(Counter, keys_on(rt, "Counter", shard, 1)[0]).signal_with_start(
                Counter.add, Item(id="a"), start=Start(tenant="t"))
    async with ray_runtime(db_path, namespace, entities=[Counter, Tally]) as rt:
        ref = rt.ref(Tally, fresh_key())
        await ref.signal_with_start(Tally.add, Item(id="t1"), start=None)
        await ref.signal(Tally.add, Item(id="t2"))
        seen: Seen = await ref.query(Tally.seen)
        assert seen.items == ["t1", "t2"]


async def test_a_release_whose_app_the_cluster_cannot_import_is_refused_with_a_clear_error(
        db_path: str, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "driver_only_entities.py").write_text(
        "import corral\n\n\nclass Lonely(corral.Entity):\n"
        "    @corral.signal\n    def poke(self) -> None:\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # importable here, not on the Ray workers
    module = importlib.import_module("driver_only_entities")
    with pytest.raises(corral.InvalidArgumentError, match="cannot import 'driver_only_entities'"):
        async with corral.open_runtime(db_path, entities=[module.Lonely], backend="ray",
                                       deploy=True, namespace=namespace, shards=SHARDS):
            pass  # pragma: no cover (refused before it connects)
    with pytest.raises(corral.DeploymentNotFoundError):  # nothing was declared or started
        corral.runtime.deploy_status(namespace)


# -- signal-with-start storm -------------------------------------------------------------


@pytest.mark.slow
async def test_a_signal_with_start_storm_from_four_drivers_and_ray_tasks_starts_one_run(
        ray_address: str, db_path: str, namespace: str, tmp_path: Path) -> None:
    key, per_sender = fresh_key("storm"), 60
    go = tmp_path / "go"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": TESTS_DIR}
    async with ray_runtime(db_path, namespace):  # the release; every sender is a client
        pass
    drivers = [f"driver{i}" for i in range(4)]
    tasks = [f"task{i}" for i in range(4)]
    procs = [
        spawn([sys.executable, WORKERS, "storm", "--address", ray_address, "--namespace",
               namespace, "--store", db_path, "--shards", str(SHARDS), "--key", key,
               "--who", who, "--count", str(per_sender), "--ready",
               str(tmp_path / f"{who}.ready"), "--go", str(go), "--out",
               str(tmp_path / f"{who}.json")], env, tmp_path / f"{who}.log")
        for who in drivers
    ]

    def log(n: int) -> str:
        return (tmp_path / f"{drivers[n]}.log").read_text()

    try:
        remote_storm = ray.remote(num_cpus=0)(storm)
        refs = [remote_storm.remote(db_path, namespace, SHARDS, key, who, per_sender,
                                    str(tmp_path / f"{who}.ready"), str(go))
                for who in tasks]

        async def everyone_ready() -> bool:
            for n, proc in enumerate(procs):
                assert proc.poll() is None, log(n)
            return all((tmp_path / f"{who}.ready").exists() for who in drivers + tasks)

        await until(everyone_ready, "every driver and task to connect", timeout=90)
        go.write_text("go")
        acks = [ack for result in await asyncio.gather(*refs) for ack in result]
        for n, proc in enumerate(procs):
            await asyncio.to_thread(proc.wait, timeout=90)
            assert proc.returncode == 0, log(n)
        for who in drivers:
            acks += json.loads((tmp_path / f"{who}.json").read_text())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    total = per_sender * len(drivers + tasks)
    assert len(acks) == total
    assert sum(a["started"] for a in acks) == 1, "exactly one call starts the run"
    assert {a["run_id"] for a in acks} == {1}
    assert {a["status"] for a in acks} == {"accepted"}
    assert sorted(a["seq"] for a in acks) == list(range(1, total + 1))
    async with ray_runtime(db_path, namespace) as rt:
        seen: Seen = await rt.ref(Counter, key).query(Counter.seen)
    assert len(seen.items) == total
    assert_applied_once(seen.items, {a["id"] for a in acks})


# -- clients inside Ray ------------------------------------------------------------------


async def test_a_client_inside_a_ray_task_and_inside_another_actor_works(
        shared: Deployment) -> None:
    key = fresh_key()
    db_path, namespace = shared.store, shared.namespace
    from_task = await ray.remote(num_cpus=0)(client_task).remote(
        db_path, namespace, SHARDS, key, 3)
    assert from_task == ["task-0", "task-1", "task-2"]
    actor: Any = ray.remote(num_cpus=0)(ClientActor).remote()
    try:
        from_actor = await actor.send.remote(db_path, namespace, SHARDS, key, 2)
    finally:
        ray.kill(actor)
    assert from_actor == ["task-0", "task-1", "task-2", "actor-0", "actor-1"]


# -- a shard actor dies mid-stream -------------------------------------------------------


async def stream_through_a_kill(rt: corral.Runtime, entity: type[Counter] | type[Heavy],
                                keys: list[str], kill: Callable[[Any, dict[str, Any]],
                                                                Awaitable[None]],
                                *, total: int = 400, senders: int = 8
                                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stream `total` signal-with-starts over `keys` (one actor); kill it a third of the way.

    Returns the actor's info before and after; asserts every ack applied exactly once.
    """
    etype = entity._corral_definition.name
    for key in keys:  # start them, so the actor hosts live entities when it dies
        await rt.ref(entity, key).signal_with_start(entity.add, Item(id=f"{key}-0"),
                                                    start=Start(tenant="t"),
                                                    message_id=f"{key}-0")
    actor = await backend(rt).actor(etype, keys[0])
    before = await actor.info.remote()
    acked: dict[str, set[str]] = {key: {f"{key}-0"} for key in keys}
    count = 0
    errors: list[BaseException] = []

    async def sender(s: int) -> None:
        nonlocal count
        for n in range(s, total, senders):
            key, mid = keys[n % len(keys)], f"s{s}-{n}"
            try:
                await rt.ref(entity, key).signal_with_start(
                    entity.add, Item(id=mid), start=Start(tenant="t"), message_id=mid)
            except Exception as err:
                errors.append(err)
            else:
                acked[key].add(mid)
                count += 1

    async def killer() -> None:
        async def a_third_acked() -> bool:
            return count >= total // 3
        await until(a_third_acked, "a third of the stream")
        await kill(actor, before)

    await asyncio.gather(killer(), *(sender(s) for s in range(senders)))
    assert not errors, f"senders saw errors: {errors[:3]}"
    after = await actor.info.remote()
    for key in keys:
        ref = rt.ref(entity, key)
        seen: Seen = await ref.query(entity.seen)
        assert_applied_once(seen.items, acked[key])
        info = await ref.describe()
        assert info.accepted_seq == info.applied_seq == len(acked[key])
    return before, after


async def kill_with_ray(actor: Any, before: dict[str, Any]) -> None:
    ray.kill(actor, no_restart=False)  # asynchronous: the old process may serve a while

    async def restarted() -> bool:  # so the restart lands mid-stream even on a slow machine
        with contextlib.suppress(ray.exceptions.RayActorError):
            return bool((await actor.info.remote())["pid"] != before["pid"])
        return False
    await until(restarted, "the killed actor to come back in a new process")


async def kill_the_process(actor: Any, before: dict[str, Any]) -> None:
    os.kill(before["pid"], signal.SIGKILL)  # the actor's process dies at once, mid-call

    async def restarted() -> bool:
        with contextlib.suppress(ray.exceptions.RayActorError):
            return bool((await actor.info.remote())["pid"] != before["pid"])
        return False
    await until(restarted, "the killed actor to come back in a new process")


@pytest.mark.parametrize("kill", [kill_with_ray, kill_the_process], ids=["ray.kill", "SIGKILL"])
async def test_a_shard_actor_killed_mid_stream_comes_back_and_applies_every_ack_once(
        db_path: str, namespace: str,
        kill: Callable[[Any, dict[str, Any]], Awaitable[None]]) -> None:
    async with ray_runtime(db_path, namespace) as rt:
        keys = keys_on(rt, "Counter", 0, 4)
        before, after = await stream_through_a_kill(rt, Counter, keys, kill)
    assert after["pid"] != before["pid"], "the actor was not restarted"
    assert after["epoch"] > before["epoch"], "the new incarnation took a new lease epoch"


async def test_a_passivated_entity_s_durable_timer_fires_after_its_shard_actor_restarts(
        db_path: str, namespace: str) -> None:
    async with ray_runtime(db_path, namespace) as rt:
        due = time.time() + 3.0
        ref = rt.ref(Alarm, fresh_key("alarm"))
        await ref.signal_with_start(Alarm.poke, start=Wake(at=due))

        async def passivated() -> bool:
            return not (await ref.describe()).hosted_here
        await until(passivated, "the sleeping entity to be passivated")
        actor = await backend(rt).actor("Alarm", ref.key)
        before = await actor.info.remote()
        ray.kill(actor, no_restart=False)

        async def restarted() -> bool:
            return bool((await actor.info.remote())["pid"] != before["pid"])
        await until(restarted, "the shard actor to restart")
        fired_at = await ref.result(timeout=60)  # only the durable timer can wake it now
    assert fired_at >= due


# -- fencing -----------------------------------------------------------------------------


async def test_a_restarted_host_takes_a_new_epoch_at_once_and_fences_out_its_predecessor(
        db_path: str) -> None:
    """Two incarnations of shard 0 on one store, as after a Ray restart with a live zombie."""
    definitions = {Counter._corral_definition.name: Counter._corral_definition}
    router = Router(SHARDS)
    stores = [await open_sqlite_store(db_path, shards=SHARDS) for _ in range(3)]
    hosts: list[LocalHost] = []
    try:
        def host(n: int, *, takeover: bool) -> LocalHost:
            h = LocalHost(stores[n], router, definitions, lease_ttl=60.0, poll_interval=0.005,
                          indices=(0,), takeover=takeover)
            hosts.append(h)
            return h

        old = host(0, takeover=True)
        await old.open()
        old_backend = LocalBackend(stores[0], definitions, old, router.shard_of)
        key = next(k for k in (fresh_key() for _ in range(100))
                   if router.shard_of("Counter", k) == 0)
        rt_old = corral.Runtime(old_backend, router, _boundary(definitions))
        ref_old = rt_old.ref(Counter, key)
        await ref_old.signal_with_start(Counter.add, Item(id="a"), start=Start(tenant="t"))
        assert await ref_old.update(Counter.add_and_count, Item(id="b"), update_id="u1") == 2
        old_fence = old.shards[0].fence

        # Without takeover, a live lease (60 s left) keeps a newcomer out.
        waiting = host(1, takeover=False)
        await waiting.open()
        assert waiting.shard(0) is None
        # With takeover, the new incarnation holds the shard at once, at a new epoch...
        new = host(2, takeover=True)
        await new.open()
        new_fence = new.shards[0].fence
        assert new_fence.epoch == old_fence.epoch + 1
        # ...and every fenced write of the old one is refused from now on.
        with pytest.raises(LeaseLostError):
            await stores[0].record_update(old_fence, "Counter", key, "u1", UpdateOutcome("9", None))
        with pytest.raises(LeaseLostError):
            await stores[0].write_snapshot(old_fence, "Counter", key, 1, applied_seq=2,
                                           state=b"zombie", keep=2)
        with pytest.raises(LeaseLostError):
            await stores[0].close_run(old_fence, "Counter", key, 1, applied_seq=2,
                                      status=RunStatus.COMPLETED, result=None, error=None)
        # The zombie may still accept (acceptance is open to any process), but only the
        # new incarnation applies and records: its answer reaches the caller.
        assert await ref_old.update(Counter.add_and_count, Item(id="c"), update_id="u2",
                                    timeout=30) == 3
        new_backend = LocalBackend(stores[2], definitions, new, router.shard_of)
        ref_new = corral.Runtime(new_backend, router, _boundary(definitions)).ref(Counter, key)
        seen: Seen = await ref_new.query(Counter.seen)
        assert seen.items == ["a", "b", "c"]
        assert (await ref_new.update(Counter.add_and_count, Item(id="b"), update_id="u1")) == 2
    finally:
        for h in reversed(hosts):
            await h.close()
        for store in stores:
            await store.close()


def _boundary(definitions: dict[str, Any]) -> Any:
    from corral.runtime.client._boundary import Boundary

    return Boundary(definitions, corral.Limits(), None)


async def test_a_second_shard_actor_incarnation_fences_out_the_first(
        db_path: str, namespace: str) -> None:
    async with ray_runtime(db_path, namespace, lease_ttl=3.0) as rt:
        key = keys_on(rt, "Counter", 0, 1)[0]
        ref = rt.ref(Counter, key)
        await ref.signal_with_start(Counter.add, Item(id="a"), start=Start(tenant="t"))
        first = await backend(rt).actor("Counter", key)
        first_info = await first.info.remote()
        # What Ray does on a restart while the old process still runs: a second actor
        # for shard 0 (under another name here, so the first stays reachable).
        second = shard_actor_class().options(
            name=f"corral/{namespace}/shard-0-second", namespace=namespace, num_cpus=0,
            lifetime="detached",
        ).remote(backend(rt).spec, backend(rt).release, 0)
        try:
            second_info = await second.info.remote()
            assert second_info["epoch"] == first_info["epoch"] + 1
            assert second_info["pid"] != first_info["pid"]
            store = await open_sqlite_store(db_path, shards=SHARDS)
            try:
                with pytest.raises(LeaseLostError):
                    await store.record_update(
                        Fence(0, first_info["owner"], first_info["epoch"]), "Counter", key, "x",
                        UpdateOutcome(None, None))
            finally:
                await store.close()
            # Calls still reach the first (the name is bound to it); what it accepts is
            # applied and recorded by the second, the lease holder.
            assert await ref.update(Counter.add_and_count, Item(id="b"), update_id="u",
                                    timeout=30) == 2
            items = await second.handle.remote(Query("Counter", key, 0, "seen", None))
            assert Seen.model_validate_json(items).items == ["a", "b"]

            async def first_evicted() -> bool:
                return bool((await first.info.remote())["hosted"] == 0)
            await until(first_evicted, "the fenced-out incarnation to let go of its entities")
        finally:
            ray.kill(second)


# -- dedicated placement -----------------------------------------------------------------


async def test_each_dedicated_entity_has_its_own_actor_with_the_same_guarantees(
        db_path: str, namespace: str) -> None:
    async with ray_runtime(db_path, namespace) as rt:
        keys = [fresh_key("heavy") for _ in range(2)]
        shared = rt.ref(Counter, fresh_key())
        await shared.signal_with_start(Counter.add, Item(id="x"), start=Start(tenant="t"))
        sends = [(key, n) for n in range(40) for key in keys]
        acks = await asyncio.gather(*(
            rt.ref(Heavy, key).signal_with_start(Heavy.add, Item(id=f"{key}-{n}"),
                                                 start=Start(tenant="t"),
                                                 message_id=f"{key}-{n}")
            for key, n in sends))
        pids = set()
        for key in keys:
            mine = [ack for (k, _), ack in zip(sends, acks, strict=True) if k == key]
            assert sum(a.started for a in mine) == 1
            assert {a.run_id for a in mine} == {1}
            assert sorted(a.seq for a in mine) == list(range(1, 41))
            seen: Seen = await rt.ref(Heavy, key).query(Heavy.seen)
            assert_applied_once(seen.items, {f"{key}-{n}" for n in range(40)})
            assert len(seen.items) == 40
            info = await rt.ref(Heavy, key).describe()
            assert info.shard >= SHARDS  # a pseudo-shard of its own, beyond the shard count
            pids.add(seen.pid)
        shared_seen: Seen = await shared.query(Counter.seen)
        assert len(pids | {shared_seen.pid}) == 3, "one process per dedicated entity"
        names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["namespace"] == namespace}
        assert sum(n.startswith(f"corral/{namespace}/dedicated-") for n in names) == 2


async def test_a_dedicated_entity_actor_killed_mid_stream_comes_back_and_applies_every_ack_once(
        db_path: str, namespace: str) -> None:
    async with ray_runtime(db_path, namespace) as rt:
        before, after = await stream_through_a_kill(rt, Heavy, [fresh_key("heavy")],
                                                    kill_with_ray, total=200)
    assert after["pid"] != before["pid"]
    assert after["epoch"] > before["epoch"]


async def test_a_dedicated_actor_ends_when_its_entity_is_done_and_a_new_run_gets_a_new_one(
        db_path: str, namespace: str) -> None:
    async with ray_runtime(db_path, namespace) as rt:
        b = backend(rt)
        b.spec = dataclasses.replace(b.spec, dedicated_idle_exit=0.3)
        ref = rt.ref(Heavy, fresh_key("heavy"))
        await ref.signal_with_start(Heavy.add, Item(id="a"), start=Start(tenant="t"))
        name = actor_name(b.spec, ref.shard)

        def alive() -> bool:
            return any(a["name"] == name for a in ray.util.list_named_actors(True))

        async def ended() -> bool:
            return not alive()

        first: Seen = await ref.query(Heavy.seen)
        # While its run is running the actor stays, well past the idle grace period.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert alive()
            await asyncio.sleep(0.1)
        await ref.terminate("done")
        await until(ended, "the dedicated actor to end after its run closed")
        ack = await ref.signal_with_start(Heavy.add, Item(id="b"), start=Start(tenant="t"))
        assert (ack.run_id, ack.started) == (2, True)
        second: Seen = await ref.query(Heavy.seen)
        assert second.items == ["b"]
        assert second.pid != first.pid


async def test_under_the_local_backend_placement_is_ignored(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES, shards=SHARDS) as rt:
        ref = rt.ref(Heavy, fresh_key("heavy"))
        assert ref.shard < SHARDS
        await ref.signal_with_start(Heavy.add, Item(id="a"), start=Start(tenant="t"))
        seen: Seen = await ref.query(Heavy.seen)
        assert seen.items == ["a"]
        assert seen.pid == os.getpid()


# -- the demo ----------------------------------------------------------------------------


def test_corral_demo_ray_runs_on_the_cluster_named_by_ray_address(
        ray_address: str, tmp_path: Path) -> None:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ray_address}
    corral_cmd = str(Path(sys.executable).with_name("corral"))
    out = subprocess.run([corral_cmd, "demo", "--ray", "--store", str(tmp_path / "demo.db")],
                         env=env, capture_output=True, text=True, timeout=100, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "host:  Ray actor corral/demo-" in out.stdout
    assert "5 accepted, 6 duplicate; 1 call started the run" in out.stdout
    assert "5. Outcome: resolved by" in out.stdout
    assert "5 replies answered (each once)" in out.stdout
    # The demo stops its actors: nothing of it is left on the cluster.
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True)
                if a["name"].startswith("corral/demo-")]


# -- placement is validated when the class is defined --------------------------------------


@pytest.mark.parametrize(("attrs", "message"), [
    ({"placement": "pinned"}, "placement must be 'shared'"),
    ({"ray_options": {"num_gpus": 1}}, "applies to dedicated actors only"),
    ({"placement": "dedicated", "ray_options": {"num_gpu": 1}}, "unknown option"),
    ({"placement": "dedicated", "ray_options": {"num_gpus": -1}}, "must be a number >= 0"),
    ({"placement": "dedicated", "ray_options": {"memory": True}}, "must be a number >= 0"),
    ({"placement": "dedicated", "ray_options": {"resources": {"tpu": "x"}}}, "resource names"),
    ({"placement": "dedicated", "ray_options": [("num_cpus", 1)]}, "must be a dict"),
])
def test_a_wrong_placement_or_ray_option_is_refused_when_the_class_is_defined(
        attrs: dict[str, Any], message: str) -> None:
    with pytest.raises(corral.EntityDefinitionError, match=message):
        type("Wrong", (corral.Entity,), dict(attrs))


def test_a_dedicated_entity_type_keeps_its_ray_options() -> None:
    definition = Heavy._corral_definition
    assert definition.placement == "dedicated"
    assert dict(definition.ray_options) == {"num_cpus": 0, "memory": 1024 * 1024}
    assert Counter._corral_definition.placement == "shared"


# -- stale entity code -------------------------------------------------------------------


async def _counter_actor(rt: corral.Runtime) -> Any:
    """The handle of the shard actor hosting a Counter just started."""
    ref = rt.ref(Counter, fresh_key())
    await ref.signal_with_start(Counter.add, Item(id="a"), start=Start(tenant="t"))
    backend = rt.backend
    assert isinstance(backend, RayBackend)
    return await backend._handle(ref.shard, "Counter")


async def test_a_client_of_another_corral_protocol_is_refused_before_its_first_call(
        db_path: str, namespace: str) -> None:
    """Detached actors outlive their clients: a client of an older corral (it sends the
    bare entity fingerprint, without `HOST_PROTOCOL`) is refused by the definition check,
    with the fix, before it sends an acceptance in a shape the actor does not read."""
    async with ray_runtime(db_path, namespace) as rt:
        handle = await _counter_actor(rt)
        older = {"Counter": Counter._corral_definition.fingerprint}
        with pytest.raises(ray.exceptions.RayTaskError) as caught:
            await handle.check_definitions.remote(older)
        assert isinstance(caught.value.cause, corral.DefinitionMismatchError)
        assert "another corral version" in str(caught.value.cause)
        await handle.check_definitions.remote(  # this client's own: accepted
            {"Counter": host_fingerprint(Counter._corral_definition)})


async def test_actors_serve_clients_of_older_and_newer_compatible_builds_and_refuse_others(
        db_path: str, namespace: str) -> None:
    """The definition check is the builds' compatibility check (`_build_registration`): an actor
    serves a client of a build it is a compatible successor of (an older release), and
    one of a compatible successor of its own (a newer release, during a roll); any
    other client is refused with the differences."""
    async with ray_runtime(db_path, namespace) as rt:
        handle = await _counter_actor(rt)
        ours = manifest(Counter._corral_definition)
        other = {"Counter": f"0123456789abcdef-p{HOST_PROTOCOL}"}
        older = dict(ours, handlers={n: h for n, h in ours["handlers"].items() if n != "add"})
        await handle.check_definitions.remote(other, {"Counter": json.dumps(older)})
        newer = dict(ours, handlers={**ours["handlers"], "extra": {
            "kind": "signal", "payload": None, "renamed_from": []}})
        await handle.check_definitions.remote(other, {"Counter": json.dumps(newer)})
        add = ours["handlers"]["add"]
        numbered = {**add, "payload": {**add["payload"], "properties": {
            "id": {"title": "Id", "type": "integer"}}}}
        retyped = dict(ours, handlers={**ours["handlers"], "add": numbered})
        with pytest.raises(ray.exceptions.RayTaskError) as caught:
            await handle.check_definitions.remote(other, {"Counter": json.dumps(retyped)})
        assert isinstance(caught.value.cause, corral.DefinitionMismatchError)
        assert "signal add: field id" in str(caught.value.cause)


async def test_a_client_with_new_code_is_served_by_the_release_and_refused_what_only_it_has(
        db_path: str, namespace: str) -> None:
    """A client of a compatible newer build works against hosts of the current
    release; a call of a handler only it has is refused at once
    (`HandlerNotHostedError` naming the release), until that build is deployed."""
    import ray_workers_v2

    key = fresh_key()
    async with ray_runtime(db_path, namespace) as rt:
        await rt.ref(Counter, key).signal_with_start(Counter.add, Item(id="a"),
                                                     start=Start(tenant="t"))
    new = ray_workers_v2.Counter
    assert new._corral_definition.fingerprint != Counter._corral_definition.fingerprint
    async with ray_runtime(db_path, namespace, entities=[new], deploy=False) as rt:
        ref = rt.ref(new, key)
        await ref.signal(new.add, Item(id="b"))
        with pytest.raises(corral.HandlerNotHostedError) as caught:
            await ref.query(new.how_many)
        assert "release 1" in str(caught.value)
        assert "corral deploy" in str(caught.value)
        assert backend(rt).retries["not_hosted"] == 0, "refused at once, not retried"
        await asyncio.to_thread(corral.runtime.roll_ray_hosts, namespace,  # the whole app
                                [new, *(e for e in ENTITIES if e is not Counter)])
        assert await ref.query(new.how_many) == 2
        assert backend(rt).retries["moved"] + backend(rt).retries["unavailable"] > 0


async def test_an_entity_mid_life_restarts_on_ray_under_code_with_a_new_attribute_and_field(
        db_path: str, namespace: str) -> None:
    import ray_workers
    import ray_workers_v2

    key = fresh_key()
    old, new = ray_workers.Ledger, ray_workers_v2.Ledger
    async with ray_runtime(db_path, namespace, entities=[old]) as rt:
        ref = rt.ref(old, key)
        for amount in (1, 2, 3):
            await ref.signal_with_start(old.book, ray_workers.Entry(amount=amount),
                                        start=Start(tenant="t"))
        await until(lambda: _snapshot_at(db_path, key, 2), "a snapshot at seq 2")
    stop_hosts(namespace)  # the deploy: new actors run the new code
    async with ray_runtime(db_path, namespace, entities=[new]) as rt:
        ref = rt.ref(new, key)
        await ref.signal(new.book, ray_workers_v2.Entry(amount=4, memo="refund"))
        assert await ref.query(new.lines) == ["1 EUR", "2 EUR", "3 EUR", "4 EUR refund"]
        assert (await ref.describe()).status is RunStatus.RUNNING


async def _snapshot_at(db_path: str, key: str, seq: int) -> bool:
    return sql(db_path, "SELECT count(*) FROM snapshots WHERE key=? AND applied_seq>=?",
               key, seq) == [(1,)]


async def test_a_shard_actor_collects_young_garbage_less_often_than_cpython_defaults(
        shared: Deployment) -> None:
    # Its process is corral's own; the driver's (the application's) is left as it was.
    driver = gc.get_threshold()
    key = fresh_key()
    async with ray_runtime(shared.store, shared.namespace) as rt:
        await rt.ref(Counter, key).signal_with_start(Counter.add, Item(id="1"),
                                                     start=Start(tenant="t"))
        info = await (await backend(rt).actor("Counter", key)).info.remote()
    assert tuple(info["gc_threshold"]) == (YOUNG_OBJECTS_PER_COLLECTION, *driver[1:])
    assert gc.get_threshold() == driver
