"""A Ray deployment is a declared release, owned by no client (issue 41): clients
connect and route, and never start, change or stop a host; a restarted placer runs
the release the store names; a handler the release lacks is refused at once.

Releases here are the session's test modules (`ray_workers.Counter`, release 1;
`ray_roll_entities.Counter`, release 2 with one more signal); the same-module-name
releases shipped by `working_dir` are `test_ray_releases.py`'s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import ray

import corral
import ray_roll_entities as release2
import ray_workers as release1
from corral._cli import main
from corral.runtime import deploy, deploy_status
from corral.runtime.ray._placer import placer_name
from ray_workers import RUNTIME_ENV, Item, Start

SHARDS = 2
TESTS = Path(__file__).resolve().parents[1]


def _deploy(store: str, namespace: str, entity: Any) -> corral.runtime.DeployReport:
    return deploy(namespace, app=f"{entity.__name__}:Counter", store=store,
                  runtime_env=RUNTIME_ENV, shards=SHARDS, lease_ttl=3.0, timeout=120)


def _hosts(namespace: str) -> dict[str, int]:
    """{host actor name: pid} of the deployment's hosts now."""
    found = {}
    for host in deploy_status(namespace).hosts:
        info = ray.get(ray.get_actor(host.name, namespace=namespace).info.remote())
        found[host.name] = info["pid"]
    return found


async def test_a_client_never_starts_a_deployment(tmp_path: Path, namespace: str) -> None:
    with pytest.raises(corral.DeploymentNotFoundError, match="corral deploy"):
        async with corral.open_runtime(str(tmp_path / "s.db"), entities=[release1.Counter],
                                       backend="ray", namespace=namespace):
            pass  # pragma: no cover (refused)
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == namespace], "nothing was started"


async def test_a_release_setting_given_to_a_client_is_refused_naming_corral_deploy(
        tmp_path: Path) -> None:
    for setting in ({"hosts": 2}, {"ray_options": {"num_cpus": 1}}, {"env_vars": {"A": "1"}}):
        with pytest.raises(corral.InvalidArgumentError, match="corral deploy"):
            async with corral.open_runtime(str(tmp_path / "s.db"), entities=[release1.Counter],
                                           backend="ray", **setting):  # type: ignore[arg-type]
                pass  # pragma: no cover (refused)


def test_clients_that_connect_and_close_stop_no_host(
        tmp_path: Path, namespace: str, ray_address: str) -> None:
    """Each client process calls `ray.init` itself (to connect) and closes: the hosts
    run on, the same processes, and answer the next client."""
    store = str(tmp_path / "s.db")
    _deploy(store, namespace, release1)
    before = _hosts(namespace)
    script = (
        "import asyncio, sys, corral, ray_workers as r\n"
        "async def main():\n"
        "    async with corral.open_runtime(sys.argv[1], entities=[r.Counter], backend='ray',"
        " address=sys.argv[2], namespace=sys.argv[3]) as rt:\n"
        "        await rt.ref(r.Counter, 'k').signal_with_start(\n"
        "            r.Counter.add, r.Item(id=sys.argv[4]), start=r.Start(tenant='t'),\n"
        "            message_id=sys.argv[4])\n"
        "asyncio.run(main())\n")
    env = {"PYTHONPATH": f"{TESTS / 'support'}:{TESTS}", "RAY_AUTH_MODE": "disabled",
           "PATH": "/usr/bin:/bin"}
    for n in range(3):
        done = subprocess.run([sys.executable, "-c", script, store, ray_address, namespace,
                               f"m{n}"], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
    assert _hosts(namespace) == before, "no client's close stopped or restarted a host"


def test_a_restarted_placer_runs_the_release_in_the_store(
        tmp_path: Path, namespace: str) -> None:
    store = str(tmp_path / "s.db")
    _deploy(store, namespace, release1)
    second = _deploy(store, namespace, release2)
    assert second.release.seq == 2
    assert second.previous is not None
    hosts = _hosts(namespace)
    placer = ray.get_actor(placer_name(namespace), namespace=namespace)
    ray.kill(placer, no_restart=False)  # Ray restarts it from its creation arguments
    deadline = time.monotonic() + 60
    while True:
        try:
            status = deploy_status(namespace)
            break
        except Exception:
            assert time.monotonic() < deadline, "the placer did not come back"
            time.sleep(0.2)
    assert status.release is not None
    assert status.release.seq == 2
    assert status.release.id == second.release.id
    time.sleep(3 * 1.0)  # a few rounds of the restarted placer
    assert _hosts(namespace) == hosts, "the restarted placer changed no host"
    assert deploy_status(namespace).on_release == SHARDS


async def test_a_handler_the_current_release_lacks_is_refused_at_once_naming_it(
        tmp_path: Path, namespace: str) -> None:
    store = str(tmp_path / "s.db")
    _deploy(store, namespace, release1)
    async with corral.open_runtime(store, entities=[release2.Counter], backend="ray",
                                   namespace=namespace) as rt:
        ref = rt.ref(release2.Counter, "k")
        await ref.signal_with_start(release2.Counter.add, Item(id="a"),
                                    start=Start(tenant="t"))
        began = time.monotonic()
        with pytest.raises(corral.HandlerNotHostedError, match="release 1") as refused:
            await ref.signal(release2.Counter.tag, Item(id="b"))
        assert time.monotonic() - began < 10, "refused at once, not retried"
        assert refused.value.retryable
        history = await ref.history()
        assert [m.name for m in history.messages.items] == ["add"], "nothing stored"


def test_the_cli_deploys_shows_and_stops_a_deployment(
        tmp_path: Path, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s.db")
    env = json.dumps(RUNTIME_ENV)
    assert main(["deploy", "--namespace", namespace, "--app", "ray_workers:Counter",
                 "--store", store, "--runtime-env", env]) == 0
    first = capsys.readouterr().out
    assert "release 1" in first, first
    assert "is current" in first, first
    assert main(["deploy", "--namespace", namespace, "--app", "ray_workers:Counter",
                 "--runtime-env", env]) == 0
    assert "nothing changed" in capsys.readouterr().out
    assert main(["deploy", "status", "--namespace", namespace, "--json"]) == 0
    status: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert status["release"]["seq"] == 1
    assert status["on_release"] == status["shards"]
    assert main(["deploy", "status", "--namespace", namespace]) == 0
    assert "current" in capsys.readouterr().out
    assert main(["deploy", "stop", "--namespace", namespace]) == 0
    assert "stopped" in capsys.readouterr().out
    assert main(["deploy", "status", "--namespace", namespace]) != 0


def test_check_snapshots_refuses_a_release_whose_code_cannot_restore_the_stored_state(
        tmp_path: Path, namespace: str) -> None:
    """The strict release's manifests are compatible (a validator is not in a schema),
    so only restoring the stored snapshots with its code shows it would suspend them."""
    import asyncio

    store = str(tmp_path / "s.db")
    first = deploy(namespace, app="ray_workers:Ledger", store=store, runtime_env=RUNTIME_ENV,
                   shards=SHARDS, timeout=120)

    async def book() -> None:
        async with corral.open_runtime(store, entities=[release1.Ledger], backend="ray",
                                       namespace=namespace) as rt:
            ref = rt.ref(release1.Ledger, "l")
            for amount in (1, 2, 3):
                await ref.signal_with_start(release1.Ledger.book,
                                            release1.Entry(amount=amount),
                                            start=Start(tenant="t"))
            while (await ref.describe()).applied_seq < 3:
                await asyncio.sleep(0.05)
    asyncio.run(book())
    with pytest.raises(corral.SnapshotRestoreError, match="do not restore"):
        deploy(namespace, app="ray_ledger_strict:Ledger", runtime_env=RUNTIME_ENV,
               check_snapshots=True, timeout=120)
    status = deploy_status(namespace)
    assert status.release is not None
    assert status.release.id == first.release.id, "nothing was declared"
    report = deploy(namespace, app="ray_ledger_strict:Ledger", runtime_env=RUNTIME_ENV,
                    timeout=120)  # without the check: declared (what the check is for)
    assert report.release.seq == 2


def test_a_release_that_gives_no_hosts_keeps_the_current_count(
        tmp_path: Path, namespace: str) -> None:
    store = str(tmp_path / "s.db")
    first = deploy(namespace, app="ray_workers:Counter", store=store, runtime_env=RUNTIME_ENV,
                   shards=SHARDS, hosts=2, timeout=120)
    assert first.release.hosts == 2
    second = deploy(namespace, app="ray_roll_entities:Counter", runtime_env=RUNTIME_ENV,
                    timeout=120)
    assert second.release.hosts == 2
    assert len([h for h in deploy_status(namespace).hosts if h.shards]) == 2


async def test_a_client_goes_on_after_the_deployment_is_stopped_and_deployed_again(
        tmp_path: Path, namespace: str) -> None:
    """Between the stop and the next deploy the client is told there is no deployment
    (typed); after it, the same runtime reaches the new placer and hosts."""
    import asyncio

    from corral.runtime import stop_ray_hosts

    store = str(tmp_path / "s.db")
    await asyncio.to_thread(_deploy, store, namespace, release1)
    async with corral.open_runtime(store, entities=[release1.Counter], backend="ray",
                                   namespace=namespace) as rt:
        ref = rt.ref(release1.Counter, "k")
        await ref.signal_with_start(release1.Counter.add, Item(id="a"),
                                    start=Start(tenant="t"))
        await asyncio.to_thread(stop_ray_hosts, namespace)
        with pytest.raises(corral.DeploymentNotFoundError):
            await ref.signal(release1.Counter.add, Item(id="b"))
        await asyncio.to_thread(_deploy, store, namespace, release1)
        await ref.signal(release1.Counter.add, Item(id="c"))
        while (d := await ref.describe()).applied_seq != d.accepted_seq:
            await asyncio.sleep(0.05)
        assert (await ref.query(release1.Counter.seen)).items == ["a", "c"]
