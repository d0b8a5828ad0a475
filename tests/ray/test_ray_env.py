"""The traps of running one deployment from several processes (issue 25, item 4):
one store is hosted by one cluster (`runtime/host/_hosting`), the actors' environment
(`env_vars`), and the host actors' logs on the driver."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest

import corral
from procs import Worker, spawner
from ray_workers import ENTITIES, RUNTIME_ENV, Counter, Item, Seen, Start
from stores import reset_postgres, sql

DRIVER = Path(__file__).resolve().parents[1] / "support" / "ray_hosting_driver.py"


def _rows(path: Path, query: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


@pytest.fixture
def private_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drivers spawned meanwhile start Ray instances of their own (no RAY_ADDRESS; a
    short temp dir each is set by `_driver`)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")


def _driver(start: object, monkeypatch: pytest.MonkeyPatch, role: str, *args: str,
            temps: list[str]) -> Worker:
    temp = tempfile.mkdtemp(prefix="corral-r-")  # Ray's socket paths stay short
    temps.append(temp)
    monkeypatch.setenv("RAY_TMPDIR", temp)
    return start(role, role, *args)  # type: ignore[operator,no-any-return]


async def _wait(path: Path, worker: Worker, timeout: float = 240.0) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout
    while not path.exists():  # noqa: ASYNC240 (a stat, between sleeps)
        worker.check_alive()
        assert loop.time() < until, f"{path.name} never appeared:\n{worker.output}"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_second_driver_with_a_ray_instance_of_its_own_is_refused_and_the_first_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_ray: None, engine: str,
        request: pytest.FixtureRequest) -> None:
    """Two drivers, each `open_runtime(store, backend="ray", deploy=True)` with no
    address, so each with its own Ray instance, on one store. The first's hosts claim
    the store; the second's deploy is refused at open, before it starts anything, with
    `StoreHostedElsewhereError` naming the first's Ray instance; the first's signals
    are each applied once, and the second stored nothing."""
    store = str(tmp_path / "shared.db")
    if engine == "postgres":
        store = request.getfixturevalue("postgres_store_url")
        reset_postgres(store)
    folder = tmp_path / "steps"
    folder.mkdir()
    temps: list[str] = []
    args = ("--store", store, "--dir", str(folder))
    try:
        with spawner(tmp_path, DRIVER) as start:
            # The first deploys (its hosts claim the store), then the second tries.
            first = _driver(start, monkeypatch, "first", *args, temps=temps)
            await _wait(folder / "first-opened", first)
            second = _driver(start, monkeypatch, "second", *args, temps=temps)
            await _wait(folder / "second-started", second)
            (folder / "go1").write_text("")
            await _wait(folder / "first-sent1", first)
            (folder / "try").write_text("")
            await _wait(folder / "second.json", second)
            (folder / "go2").write_text("")
            await _wait(folder / "first.json", first)
            for worker in (first, second):
                await asyncio.to_thread(worker.proc.wait, 120)
                worker.check_exited_cleanly()
    finally:
        for temp in temps:
            shutil.rmtree(temp, ignore_errors=True)
    ours = json.loads((folder / "first.json").read_text())
    theirs = json.loads((folder / "second.json").read_text())
    assert "opened" not in theirs, theirs
    for refused in (theirs["on_open"],):
        assert refused["type"] == "StoreHostedElsewhereError", refused
        assert refused["cluster"] == f"ray:{ours['session']}"
        assert refused["address"] == ours["address"]
        assert ours["address"] in refused["holder"]
        assert "address=" in refused["message"]
        assert "ray start --head" in refused["message"]
    assert ours["statuses"] == ["accepted"] * 60
    applied = sorted(i for items in ours["applied"].values() for i in items)
    assert applied == sorted(f"first-{n}" for n in range(60))  # each once, none lost
    assert sql(store, "SELECT count(*) FROM dedupe") == [(60,)]  # the second's: none


def _store_rows(path: Path) -> list[list[tuple[object, ...]]]:
    return [_rows(path, f"SELECT * FROM {table} ORDER BY 1")
            for table in ("hosting", "build_processes", "leases", "dedupe")]


async def test_a_local_host_beside_a_ray_deployment_is_refused_and_a_pure_client_is_not(
        tmp_path: Path, namespace: str) -> None:
    """Local hosts would take the shards Ray's actors hold: refused at open, with
    nothing stored, the deployment untouched; a pure client (`host=False`) only sends,
    and the Ray hosts apply what it accepted."""
    import ray

    store = tmp_path / "s.db"
    async with corral.open_runtime(str(store), entities=ENTITIES, backend="ray", deploy=True,
                                   shards=2,
                                   namespace=namespace,
                                   env_vars=RUNTIME_ENV["env_vars"]) as rt:
        ref = rt.ref(Counter, "k")
        await ref.signal_with_start(Counter.add, Item(id="ray-1"), start=Start(tenant="t"))
        before = _store_rows(store)
        with pytest.raises(corral.StoreHostedElsewhereError) as refused:
            async with corral.open_runtime(str(store), entities=ENTITIES, shards=2):
                pass
        assert refused.value.cluster == f"ray:{ray.get_runtime_context().get_session_name()}"
        assert refused.value.address == ray.get_runtime_context().gcs_address
        assert "backend='ray'" in str(refused.value)
        assert "host=False" in str(refused.value)
        assert _store_rows(store) == before
        async with corral.open_runtime(str(store), entities=ENTITIES, shards=2,
                                       host=False) as client:
            await client.ref(Counter, "k").signal(Counter.add, Item(id="local-1"))
        await ref.signal(Counter.add, Item(id="ray-2"))
        for _ in range(200):
            seen: Seen = await ref.query(Counter.seen)
            if len(seen.items) == 3:
                break
            await asyncio.sleep(0.05)
        assert sorted(seen.items) == ["local-1", "ray-1", "ray-2"]


async def test_a_ray_deployment_beside_local_hosts_is_refused_before_any_actor_starts(
        tmp_path: Path, namespace: str) -> None:
    """The reverse: local hosts hold the store; `open_runtime(backend="ray")` is
    refused before it creates an actor, and the local hosts go on."""
    import ray

    store = tmp_path / "s.db"
    async with corral.open_runtime(str(store), entities=ENTITIES, shards=2) as local:
        ref = local.ref(Counter, "k")
        await ref.signal_with_start(Counter.add, Item(id="a"), start=Start(tenant="t"))
        before = _store_rows(store)
        with pytest.raises(corral.StoreHostedElsewhereError) as refused:
            async with corral.open_runtime(str(store), entities=ENTITIES, backend="ray",
                                           deploy=True, shards=2, namespace=namespace):
                pass
        assert (refused.value.cluster, refused.value.address) == ("local", None)
        assert "local host on" in refused.value.holder
        assert _store_rows(store) == before
        assert ray.is_initialized()  # the session's Ray, not started there: left alone
        assert not [a for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["namespace"] == namespace]
        await ref.signal(Counter.add, Item(id="b"))
        assert (await ref.update(Counter.add_and_count, Item(id="c"))) == 3


# -- the actors' environment -----------------------------------------------------------


async def test_env_vars_reach_the_handlers_of_shared_and_dedicated_actors(
        tmp_path: Path, namespace: str) -> None:
    from ray_env_entities import DedicatedProbe, Environ, Names, Probe

    names = Names(names=["CORRAL_TEST_GREETING", "CORRAL_TEST_UNSET"])
    async with corral.open_runtime(
            str(tmp_path / "s.db"), entities=[Probe, DedicatedProbe], backend="ray", deploy=True,
            shards=2, namespace=namespace, ray_options={"runtime_env": RUNTIME_ENV},
            env_vars={"CORRAL_TEST_GREETING": "hello, actor"}) as rt:
        for etype in (Probe, DedicatedProbe):
            seen: Environ = await rt.ref(etype, "p").update_with_start(
                etype.read, names, start=names)
            assert seen.values == {"CORRAL_TEST_GREETING": "hello, actor",
                                   "CORRAL_TEST_UNSET": None}


@pytest.mark.parametrize(("env_vars", "ray_options", "says"), [
    ({"A": 1}, None, "must be a str"),
    ({1: "x"}, None, "not an environment variable name"),
    ({"": "x"}, None, "not an environment variable name"),
    ({"A=B": "x"}, None, "not an environment variable name"),
    ({"A": "x\0y"}, None, "without NUL"),
    (["A"], None, "must be a dict"),
    (None, {"runtime_env": {"env_vars": {"A": 2}}}, "must be a str"),
    (None, {"runtime_env": "pip"}, "must be a dict"),
    ({"A": "1"}, {"runtime_env": {"env_vars": {"A": "2"}}}, "give the variable once"),
    ({"CORRAL_LIFECYCLE_EVENTS": "yes"}, None, "CORRAL_LIFECYCLE_EVENTS turns"),
    (None, {"runtime_env": {"env_vars": {"CORRAL_LIFECYCLE_EVENTS": "INFO"}}},
     "CORRAL_LIFECYCLE_EVENTS turns"),
])
async def test_bad_env_vars_are_refused_before_ray_is_touched(
        tmp_path: Path, env_vars: object, ray_options: object, says: str) -> None:
    with pytest.raises(corral.InvalidArgumentError, match=says):
        async with corral.open_runtime(str(tmp_path / "s.db"), entities=[Counter],
                                       backend="ray", deploy=True, env_vars=env_vars,  # type: ignore[arg-type]
                                       ray_options=ray_options):  # type: ignore[arg-type]
            pass
    assert not (tmp_path / "s.db").exists()


@pytest.mark.parametrize("via", ["roll_ray_hosts", "corral deploy roll"])
async def test_a_rolled_host_gets_the_env_vars_the_roll_gives(
        tmp_path: Path, namespace: str, via: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Hosts started with no `CORRAL_TEST_ROLLED` are rolled to release 2 with it
    (`env_vars=`, or `--env`); the new host actor sees it, beside the runtime_env's."""
    import ray_env_release2 as release2
    from corral._cli import main
    from ray_env_entities import Environ, Names, Probe

    names = Names(names=["CORRAL_TEST_ROLLED", "CORRAL_TEST_GREETING"])
    async with corral.open_runtime(
            str(tmp_path / "s.db"), entities=[Probe], backend="ray", deploy=True, shards=2,
            namespace=namespace, ray_options={"runtime_env": RUNTIME_ENV}) as rt:
        before: Environ = await rt.ref(Probe, "p").update_with_start(Probe.read, names,
                                                                      start=names)
        assert before.values == {"CORRAL_TEST_ROLLED": None, "CORRAL_TEST_GREETING": None}
        if via == "roll_ray_hosts":
            report = await asyncio.to_thread(
                corral.runtime.roll_ray_hosts, namespace, [release2.Probe],
                actor_options={"runtime_env": RUNTIME_ENV},
                env_vars={"CORRAL_TEST_ROLLED": "yes", "CORRAL_TEST_GREETING": "a=b"})
            assert len(report.steps) == 2
        else:
            argv = ["deploy", "roll", "--app", "ray_env_release2:ENTITIES", "--namespace",
                    namespace, "--runtime-env", json.dumps(RUNTIME_ENV),
                    "--env", "CORRAL_TEST_ROLLED=yes", "--env", "CORRAL_TEST_GREETING=a=b"]
            status = await asyncio.to_thread(main, argv)
            assert status == 0, capsys.readouterr().err
            assert "moved 2 shards" in capsys.readouterr().out.splitlines()[-1]
        after: Environ = await rt.ref(Probe, "p").update(Probe.read, names)
        assert after.pid != before.pid, "a host actor of release 2 answered"
        assert after.values == {"CORRAL_TEST_ROLLED": "yes", "CORRAL_TEST_GREETING": "a=b"}


@pytest.mark.parametrize(("env_vars", "actor_options", "says"), [
    ({"A=B": "x"}, None, "not an environment variable name"),
    ({"A": 1}, None, "must be a str"),
    ({"A": "1"}, {"runtime_env": {"env_vars": {"A": "2"}}},
     r"env_vars\['A'\] and actor_options\['runtime_env'\]\['env_vars'\]\['A'\] differ"),
    (None, {"runtime_env": "pip"}, r"actor_options\['runtime_env'\] must be a dict"),
])
def test_a_roll_with_bad_env_vars_is_refused_before_anything_moves(
        ray_address: str, env_vars: object, actor_options: object, says: str) -> None:
    with pytest.raises(corral.InvalidArgumentError, match=says):
        corral.runtime.roll_ray_hosts("no-such-deployment", [Counter],
                                      env_vars=env_vars,  # type: ignore[arg-type]
                                      actor_options=actor_options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("env", "says"), [
    (["NOEQUALS"], "--env takes KEY=VALUE, got 'NOEQUALS'"),
    (["A=1", "A=2"], "--env gives 'A' two values"),
    (["=x"], "not an environment variable name"),
])
def test_corral_deploy_roll_refuses_a_bad_env_in_one_line(
        ray_address: str, env: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    from corral._cli import main

    argv = ["deploy", "roll", "--app", "ray_roll_entities:ENTITIES", "--namespace", "nope"]
    assert main([*argv, *(a for e in env for a in ("--env", e))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: InvalidArgumentError: "), err
    assert says in err
    assert err.count("\n") == 1


# -- the host actors' logs on the driver -----------------------------------------------


async def test_a_poison_message_on_ray_is_logged_on_the_driver_with_its_traceback(
        tmp_path: Path, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    """The host actor's `corral.*` records reach the driver's logging under the same
    logger names and levels: the shard taken, each retry, and the dead letter with the
    handler's traceback; the actor's name is the record's `processName`."""
    from ray_workers import Brittle

    caplog.set_level(logging.INFO, logger="corral")
    async with corral.open_runtime(str(tmp_path / "s.db"), entities=[Brittle],
                                   backend="ray", deploy=True, shards=2, namespace=namespace,
                                   env_vars=RUNTIME_ENV["env_vars"]) as rt:
        ref = rt.ref(Brittle, "poisoned")
        await ref.signal_with_start(Brittle.add, Item(id="bad-1"), start=Start(tenant="t"))

        def dead_lettered() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.name == "corral.shard"
                    and "moved to dead letter" in r.getMessage()]
        for _ in range(600):
            if dead_lettered():
                break
            await asyncio.sleep(0.05)
        assert await ref.query(Brittle.seen) == []
    [record] = dead_lettered()
    assert record.levelno == logging.ERROR
    assert "Traceback (most recent call last)" in record.getMessage()
    assert "ValueError: cannot take bad-1" in record.getMessage()
    assert record.processName.startswith(f"corral/{namespace}/host-")  # a host actor
    assert getattr(record, "corral_relayed", False)
    retries = [r for r in caplog.records if "retrying in" in r.getMessage()]
    assert [r.levelno for r in retries] == [logging.WARNING]  # attempt 1 of 2
    assert any(r.name == "corral.ray" and "holds shard" in r.getMessage()
               for r in caplog.records)


async def test_lifecycle_events_of_host_actors_reach_the_driver_when_their_env_turns_them_on(
        tmp_path: Path, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    """A host actor's process cannot see the driver's logging configuration: with
    `CORRAL_LIFECYCLE_EVENTS=1` in `env_vars` it logs `corral.lifecycle` at INFO, and the
    events reach the driver (configured as locally) with their structured fields."""
    from procs import wait_until

    caplog.set_level(logging.INFO, logger="corral.lifecycle")
    async with corral.open_runtime(
            str(tmp_path / "s.db"), entities=[Counter], backend="ray", deploy=True, shards=1,
            namespace=namespace,
            env_vars={**RUNTIME_ENV["env_vars"], "CORRAL_LIFECYCLE_EVENTS": "1"}) as rt:
        ref = rt.ref(Counter, "life")
        await ref.signal_with_start(Counter.add, Item(id="a"), start=Start(tenant="t"))
        await ref.terminate("done")

        def events() -> dict[str, logging.LogRecord]:
            return {getattr(r, "event", ""): r for r in caplog.records
                    if r.name == "corral.lifecycle" and getattr(r, "corral_relayed", False)}
        await wait_until(lambda: {"lease taken", "run started", "run closed"} <= set(events()),
                         "the host actor's lifecycle events on the driver", timeout=60)
    started = events()["run started"]
    assert (started.entity_type, started.key, started.run_id) == ("Counter", "life", 1)  # type: ignore[attr-defined]
    assert started.processName.startswith(f"corral/{namespace}/host-")
    assert events()["run closed"].status == "terminated"  # type: ignore[attr-defined]


def _worker_stderr(pid: int) -> str:
    """What the Ray worker process `pid` of this session wrote on its stderr."""
    import ray

    logs = Path(ray._private.worker._global_node.get_logs_dir_path())  # type: ignore[attr-defined]
    files = list(logs.glob(f"worker-*-{pid}.err"))
    assert files, f"no stderr file of worker {pid} in {logs}"
    return "".join(f.read_text(errors="replace") for f in files)


async def test_a_host_actor_ships_its_logs_without_a_blocking_ray_get(
        tmp_path: Path, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    """Ray warns "Using blocking ray.get inside async actor" (on the actor's stderr, which
    Ray streams to drivers that keep `log_to_driver`) for a `ray.get` from any thread of
    an async actor's process: the log shipper waits on its call's future instead. Once a
    host's records reached the driver (the shipper's call returned), its stderr has no
    such warning."""
    from procs import wait_until

    caplog.set_level(logging.INFO, logger="corral")
    async with corral.open_runtime(str(tmp_path / "s.db"), entities=[Counter],
                                   backend="ray", deploy=True, shards=1, namespace=namespace,
                                   env_vars=RUNTIME_ENV["env_vars"]) as rt:
        await rt.ref(Counter, "k").signal_with_start(Counter.add, Item(id="a"),
                                                     start=Start(tenant="t"))

        def held() -> list[logging.LogRecord]:
            return [r for r in caplog.records if getattr(r, "corral_relayed", False)
                    and "holds shards" in r.getMessage()]
        await wait_until(lambda: bool(held()), "the host actor's records on the driver",
                         timeout=60)
        pids = {r.process for r in held()}
        for pid in pids:
            assert "blocking ray.get" not in _worker_stderr(pid)


async def test_stopping_the_last_deployment_stops_the_log_relay_and_the_next_starts_it(
        tmp_path: Path, ray_address: str) -> None:
    """The relay is the cluster's: `stop_ray_hosts` of one deployment keeps it while
    another has actors, and stops it with the last; a new deployment's logs reach its
    driver through a new relay."""
    import uuid

    import ray

    from corral.runtime import stop_ray_hosts
    from procs import wait_until

    def relay_alive() -> bool:
        try:
            handle = ray.get_actor("corral/log-relay", namespace="_corral")
            ray.get(handle.read.remote("none", 0, 0.0, 0.0), timeout=30)
        except (ValueError, ray.exceptions.RayActorError):
            return False
        return True

    def deployments() -> set[str]:
        return {a["namespace"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["name"].startswith(f"corral/{a['namespace']}/")}

    first, second, third = (f"relay-{uuid.uuid4().hex[:8]}" for _ in range(3))

    async def deploy(name: str) -> None:
        async with corral.open_runtime(str(tmp_path / f"{name}.db"), entities=[Counter],
                                       backend="ray", deploy=True, shards=1, namespace=name,
                                       ray_options={"runtime_env": RUNTIME_ENV}) as rt:
            await rt.ref(Counter, "k").signal_with_start(Counter.add, Item(id="a"),
                                                         start=Start(tenant="t"))

    try:
        await deploy(first)
        await deploy(second)
        assert deployments() == {first, second}, "another test left a deployment running"
        await wait_until(relay_alive, "the hosts to start the relay")
        await asyncio.to_thread(stop_ray_hosts, first)
        assert relay_alive(), "the second deployment still ships to it"
        await asyncio.to_thread(stop_ray_hosts, second)
        await wait_until(lambda: not relay_alive(), "the relay to stop with the last one")
        await deploy(third)
        await wait_until(relay_alive, "the next deployment to start a relay again")
    finally:
        for name in (first, second, third):
            await asyncio.to_thread(stop_ray_hosts, name)
