"""Releases of one package on Ray (`corral.runtime.deploy`, issue 41): every release is
`ticketdesk` (`tests/support/releases/`), the same module name each time, shipped by
`working_dir` or `py_modules`, so only what Ray ships decides which code a host runs.

The session's Ray instance and a SQLite store keep these fast;
`test_ray_releases_cluster.py` rolls back and forth on a multi-node cluster on
PostgreSQL, and loses the placer's node mid-roll.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import ray

import corral
from corral.runtime import deploy, deploy_status, stop_ray_hosts
from ticket_releases import (
    APP,
    SendLog,
    applied_notes,
    assert_applied_exactly_once,
    importable_here,
    live_actors,
    load_release,
    py_modules,
    send_notes,
    sender_env,
    shipped,
    start_tickets,
    task_sender,
    working_dir,
)

SHARDS = 2
KEYS = [f"ticket-{i}" for i in range(6)]


@pytest.fixture
def namespace(ray_address: str) -> Iterator[str]:
    name = f"rel-{uuid.uuid4().hex[:8]}"
    yield name
    stop_ray_hosts(name)


@pytest.fixture
def store(tmp_path: Path) -> str:
    return str(tmp_path / "corral.db")


def declare(namespace: str, store: str, runtime_env: dict[str, Any]) -> Any:
    return deploy(namespace, app=APP, store=store, runtime_env=runtime_env, shards=SHARDS)


@contextlib.asynccontextmanager
async def client(store: str, namespace: str, agent: ModuleType
                 ) -> AsyncIterator[corral.Runtime]:
    async with corral.open_runtime(store, entities=[agent.Ticket], backend="ray",
                                   namespace=namespace, shards=SHARDS) as rt:
        yield rt


async def opened(store: str, namespace: str) -> SendLog:
    """Every ticket opened by a client of release 1."""
    log, r1 = SendLog(), load_release("r1")
    async with client(store, namespace, r1) as rt:
        await start_tickets(rt, r1, KEYS, log)
    return log


async def under_stream(store: str, namespace: str, log: SendLog,
                       declarations: list[Callable[[], Any]]) -> list[Any]:
    """Each declaration (a `deploy`) in turn, while clients of release 1 and 2 and a Ray
    task of release 2 send notes; their reports."""
    r1, r2 = load_release("r1"), load_release("r2")
    stop = Path(store).with_name("stop")
    async with client(store, namespace, r1) as rt1, client(store, namespace, r2) as rt2:
        done = asyncio.Event()
        senders = [asyncio.create_task(send_notes(rt, agent, KEYS, who, done.is_set, log=log))
                   for rt, agent, who in ((rt1, r1, "r1s"), (rt2, r2, "r2s"))]
        task = ray.remote(task_sender).options(
            runtime_env=shipped(sender_env("r2")), num_cpus=0).remote(
            store, namespace, SHARDS, KEYS, "r2t", str(stop))
        reports = [await asyncio.to_thread(declare_one) for declare_one in declarations]
        done.set()
        await asyncio.to_thread(stop.touch)
        await asyncio.gather(*senders)
        log.add(await asyncio.to_thread(ray.get, task))
    return reports


async def history(store: str, namespace: str, agent: ModuleType, key: str) -> Any:
    async with client(store, namespace, agent) as rt:
        return await rt.ref(agent.Ticket, key).query(agent.Ticket.history)


def hosts(namespace: str) -> dict[str, tuple[str, int]]:
    return {n: v for n, v in live_actors(namespace).items() if not n.endswith("/placer")}


def test_the_ticketdesk_package_is_importable_only_from_a_release_ray_ships(
        ray_address: str) -> None:
    load_release("r1")
    assert importable_here() is None, "the tests must not see ticketdesk on sys.path"
    assert ray.get(ray.remote(importable_here).remote()) is None, "nor the session's workers"

    def release() -> str:
        import ticketdesk

        return str(ticketdesk.RELEASE)
    shipped_by = {
        "working_dir": ray.remote(release).options(runtime_env=shipped(working_dir("r1"))),
        "py_modules": ray.remote(release).options(runtime_env=shipped(py_modules("r2")))}
    assert ray.get([f.remote() for f in shipped_by.values()]) == ["r1", "r2"]


@pytest.mark.timeout(300)  # three rolls under a stream, then each ticket read
async def test_release_2_of_the_same_package_rolled_by_working_dir_back_and_forth_loses_nothing(
        store: str, namespace: str) -> None:
    first = await asyncio.to_thread(declare, namespace, store, working_dir("r1"))
    log = await opened(store, namespace)
    forward, back, again = await under_stream(store, namespace, log, [
        lambda r=release: declare(namespace, store, working_dir(r))
        for release in ("r2", "r1", "r2")])
    for report in (forward, back, again):
        assert report.steps, f"nothing moved: {report}"
        assert not report.skipped
        assert not report.unchanged
    assert forward.release.tag != first.release.tag
    assert back.release.id == first.release.id, "a rollback declares release 1 again"
    assert again.release.id == forward.release.id
    assert not log.errors, log.errors[:5]
    r2 = load_release("r2")
    async with client(store, namespace, r2) as rt:
        applied = await applied_notes(rt, r2, KEYS)
        dead = await rt.dead_letters()
    assert_applied_exactly_once(applied, log)
    assert dead == [], [(d.key, d.name, d.message_id, d.error[:80]) for d in dead[:5]]
    assert any(n.startswith("label:") for ns in applied.values() for n in ns), \
        "release 2's new handler was applied"
    assert log.retries["HandlerNotHostedError"] > 0, "release 1 refused release 2's handlers"
    # Release 2's code answers, whoever asks (a body that differs between the releases).
    assert (await history(store, namespace, load_release("r1"), KEYS[0])).release == "r2"
    status = await asyncio.to_thread(deploy_status, namespace)
    assert status.release.id == forward.release.id
    assert {h.release_id for h in status.hosts if h.shards} == {forward.release.id}
    unchanged = await asyncio.to_thread(declare, namespace, store, working_dir("r2"))
    assert unchanged.unchanged
    assert not unchanged.steps


async def test_release_2_of_the_same_package_rolls_over_release_1_by_py_modules(
        store: str, namespace: str) -> None:
    await asyncio.to_thread(declare, namespace, store, py_modules("r1"))
    log = await opened(store, namespace)
    report = await asyncio.to_thread(declare, namespace, store, py_modules("r2"))
    assert report.steps
    assert not report.skipped
    r2 = load_release("r2")
    async with client(store, namespace, r2) as rt:
        await send_notes(rt, r2, KEYS, "r2s", lambda: True, least=2 * len(KEYS), log=log)
        applied = await applied_notes(rt, r2, KEYS)
    assert not log.errors, log.errors[:5]
    assert not log.refused, "release 2 hosts release 2's handlers"
    assert_applied_exactly_once(applied, log)
    assert (await history(store, namespace, load_release("r1"), KEYS[0])).release == "r2"


async def test_a_body_only_fix_of_a_run_bug_rolls_and_the_suspended_runs_go_on(
        store: str, namespace: str) -> None:
    first = await asyncio.to_thread(declare, namespace, store, working_dir("fix1"))
    fix1 = load_release("fix1")
    notes = {key: [f"{key}-a", f"urgent-{key}", f"{key}-b"] for key in KEYS}
    async with client(store, namespace, fix1) as rt:
        for key, ids in notes.items():
            ref = rt.ref(fix1.Ticket, key)
            await ref.signal_with_start(fix1.Ticket.comment, fix1.Note(id=ids[0]),
                                        start=fix1.Opened(customer=key))
            for note in ids[1:]:
                await ref.signal(fix1.Ticket.comment, fix1.Note(id=note))
        for key in KEYS:
            await until(lambda k=key: suspended(rt, fix1, k), f"{key}'s run is suspended")
        fixed = await asyncio.to_thread(declare, namespace, store, working_dir("fix2"))
        assert fixed.release.tag != first.release.tag, "a body-only change is a new build"
        assert fixed.steps, "the fix rolled"
        assert not fixed.skipped
        for key, ids in notes.items():
            ref = rt.ref(fix1.Ticket, key)
            await until(lambda r=ref, i=ids: seen_all(r, fix1, i),
                        f"{key}'s run went on and triaged every note")
            assert (await ref.describe()).suspension is None


async def suspended(rt: corral.Runtime, agent: ModuleType, key: str) -> bool:
    return (await rt.ref(agent.Ticket, key).describe()).suspension is not None


async def seen_all(ref: Any, agent: ModuleType, ids: list[str]) -> bool:
    return bool(await ref.query(agent.Ticket.seen) == ids)


async def until(predicate: Callable[[], Any], what: str, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        assert loop.time() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


async def test_a_state_type_change_without_an_upgrade_hook_is_refused_before_anything_moves(
        store: str, namespace: str) -> None:
    first = await asyncio.to_thread(declare, namespace, store, working_dir("r1"))
    log = await opened(store, namespace)
    before = hosts(namespace)
    assert before
    with pytest.raises(corral.IncompatibleBuildError) as caught:
        await asyncio.to_thread(declare, namespace, store, working_dir("bad"))
    assert any("notes" in d for d in caught.value.differences), caught.value.differences
    assert hosts(namespace) == before, "no host started or stopped"
    status = await asyncio.to_thread(deploy_status, namespace)
    assert status.release.id == first.release.id
    r1 = load_release("r1")
    async with client(store, namespace, r1) as rt:
        await send_notes(rt, r1, KEYS, "after", lambda: True, least=len(KEYS), log=log)
        assert_applied_exactly_once(await applied_notes(rt, r1, KEYS), log)
    assert not log.errors, log.errors[:5]


async def test_a_handler_the_release_lacks_is_refused_at_once_naming_the_release(
        store: str, namespace: str) -> None:
    first = await asyncio.to_thread(declare, namespace, store, working_dir("r1"))
    await opened(store, namespace)
    r2 = load_release("r2")
    async with client(store, namespace, r2) as rt:
        with pytest.raises(corral.HandlerNotHostedError) as caught:
            await rt.ref(r2.Ticket, KEYS[0]).signal(r2.Ticket.label, r2.Note(id="x"))
        assert caught.value.retryable
        assert first.release.id in str(caught.value)
        notes = (await applied_notes(rt, r2, KEYS[:1]))[KEYS[0]]
    assert notes == [f"{KEYS[0]}-first"], "nothing of the refused signal was stored"
