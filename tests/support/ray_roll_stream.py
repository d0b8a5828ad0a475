"""A rolling deploy under a stream of signals, shared by `tests/ray/test_ray_roll.py`
(the session's Ray, SQLite) and `ray_roll_cluster.py` (a multi-node cluster, PostgreSQL).

Release 1 is `ray_workers.Counter`, release 2 `ray_roll_entities.Counter` (one more
signal, `tag`). While `roll_ray_hosts` moves every shard to release 2, three release-1
senders and two release-2 senders (`add`, and `tag` which only release 2 has) signal
from the driver, and two Ray tasks of release 1 signal too. "Applied once" is checked
on the entity's own record (`Counter.items`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import ray

import corral
import ray_roll_entities as release2
import ray_workers as release1
from corral.runtime import RollStep, roll_ray_hosts
from corral.runtime.ray._directory import assignment, host_of
from ray_workers import RUNTIME_ENV, Item, Seen, Start


@dataclass(frozen=True)
class Deployment:
    store: str
    namespace: str
    shards: int
    keys: list[str]
    ray_options: dict[str, Any] = field(default_factory=lambda: {"runtime_env": RUNTIME_ENV})
    lease_ttl: float = 3.0


@dataclass
class RollRun:
    """What `roll_under_stream` saw."""

    steps: list[RollStep]
    applied: dict[str, list[str]]
    """Each entity's record of what it applied, in order."""
    acked: set[tuple[str, str]]
    """(key, item) of every acknowledged signal (`tag:<id>` for `tag`)."""
    errors: list[str]
    """What the callers saw fail (none expected)."""
    refused: int
    """Sends of `tag` refused (`HandlerNotHostedError`, typed and retryable) before
    release 2 was declared: the release then lacked the handler."""
    before: dict[int, dict[str, Any]]
    """`info()` of each shard's actor before the roll."""
    retries: dict[str, int]


@contextlib.asynccontextmanager
async def client(dep: Deployment, entity: type[corral.Entity], *, deploy: bool = True
                 ) -> AsyncIterator[corral.Runtime]:
    """A runtime on the deployment; with `deploy`, its release declared first (the
    entity's code), else a pure client of whatever release is current."""
    async with corral.open_runtime(
            dep.store, backend="ray", namespace=dep.namespace, shards=dep.shards,
            entities=[entity], **({"deploy": True, "lease_ttl": dep.lease_ttl,
                                   "ray_options": dep.ray_options} if deploy else {})) as rt:
        yield rt


async def actors(dep: Deployment) -> dict[int, dict[str, Any]]:
    """`info()` of the actor hosting each shard now (as the directory says)."""
    found = {}
    for index in range(dep.shards):
        name = await asyncio.to_thread(host_of, dep.namespace, index, "")
        found[index] = await ray.get_actor(name, namespace=dep.namespace).info.remote()
    return found


async def start_all(rt: corral.Runtime, keys: list[str]) -> None:
    """Start every entity (so every shard has an actor of release 1)."""
    assert {rt.router.shard_of("Counter", k) for k in keys} == set(range(rt.router.shards))
    for key in keys:
        await rt.ref(release1.Counter, key).signal_with_start(
            release1.Counter.add, Item(id=f"{key}-first"), start=Start(tenant="t"),
            message_id=f"{key}-first")


async def roll_under_stream(dep: Deployment, during: Callable[[], Any] | None = None,
                            task_options: dict[str, Any] | None = None) -> RollRun:
    """Roll `dep` to release 2 under the stream; `during` runs in a thread beside it."""
    async with client(dep, release1.Counter) as rt1, \
            client(dep, release2.Counter, deploy=False) as rt2:
        await start_all(rt1, dep.keys)
        before = await actors(dep)
        acked = {(k, f"{k}-first") for k in dep.keys}
        errors: list[str] = []
        refused = [0]
        stop = asyncio.Event()

        async def sender(rt: corral.Runtime, entity: Any, handler: Any, who: str,
                         mark: str = "") -> None:
            n = 0
            while not stop.is_set() or n < 20:
                key, mid = dep.keys[n % len(dep.keys)], f"{who}-{n}"
                n += 1
                try:
                    await rt.ref(entity, key).signal(handler, Item(id=mid), message_id=mid)
                except corral.HandlerNotHostedError:  # release 1 current: lacks it
                    refused[0] += 1
                    await asyncio.sleep(0.05)
                except Exception as err:
                    errors.append(f"{mid}: {type(err).__name__}: {err}")
                else:
                    acked.add((key, f"{mark}{mid}"))

        remote = ray.remote(release2.task_stream).options(
            **(task_options or {"runtime_env": RUNTIME_ENV}))
        tasks = [remote.remote(dep.store, dep.namespace, dep.shards, dep.keys, f"task{t}", 60)
                 for t in range(2)]
        r1, r2 = release1.Counter, release2.Counter
        senders = [asyncio.create_task(sender(rt1, r1, r1.add, f"r1s{s}")) for s in range(3)]
        senders += [asyncio.create_task(sender(rt2, r2, r2.add, "r2s")),
                    asyncio.create_task(sender(rt2, r2, r2.tag, "r2t", "tag:"))]
        steps: list[RollStep] = []
        report, _ = await asyncio.gather(
            asyncio.to_thread(roll_ray_hosts, dep.namespace, [r2],
                              actor_options=dep.ray_options, on_step=steps.append),
            asyncio.to_thread(during) if during else asyncio.sleep(0))
        stop.set()
        await asyncio.gather(*senders)
        for acks in await asyncio.to_thread(ray.get, tasks):
            acked.update((k, m) for k, m in acks)
        assert list(report.steps) == steps
        applied = {key: await _applied(rt2.ref(r2, key)) for key in dep.keys}
        retries = dict(rt1.backend.retries + rt2.backend.retries)  # type: ignore[attr-defined]
        return RollRun(steps, applied, acked, errors, refused[0], before, retries)


async def _applied(ref: Any) -> list[str]:
    deadline = time.monotonic() + 60
    while (d := await ref.describe()).applied_seq != d.accepted_seq:
        assert time.monotonic() < deadline, f"{ref.key}: not all applied"
        await asyncio.sleep(0.05)
    seen: Seen = await ref.query(release2.Counter.seen)
    return seen.items


def assert_each_ack_applied_once(applied: dict[str, list[str]],
                                 acked: set[tuple[str, str]]) -> None:
    for key, items in applied.items():
        twice = sorted({i for i in items if items.count(i) > 1})
        assert not twice, f"{key}: applied twice: {twice[:5]}"
        missing = sorted(m for k, m in acked if k == key and m not in items)
        assert not missing, f"{key}: acknowledged but never applied: {missing[:5]}"


def hosts_now(namespace: str) -> set[str]:
    """The host actors the directory names now (before a roll: release 1's)."""
    return set(assignment(namespace).values())


__all__ = ["Deployment", "RollRun", "actors", "assert_each_ack_applied_once",
           "client", "hosts_now", "roll_under_stream", "start_all"]
