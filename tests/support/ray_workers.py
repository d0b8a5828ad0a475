"""Entities and driver programs for the Ray backend tests.

Shard actors import this module by name (the tests put `tests/` on the workers'
`PYTHONPATH` through `runtime_env`), exactly as an application ships its entity module.

As a program it is one Ray driver of a storm (`tests/ray/test_ray_backend.py`):

    python ray_workers.py storm --address ADDR --namespace NS --store PATH --shards S
        --key KEY --who NAME --count C --ready FILE --go FILE --out FILE

It connects to the running Ray instance, writes the ready file, waits for the go file,
sends `C` concurrent `signal_with_start` calls to `KEY`, and writes its acks as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import corral

TESTS_DIR = str(Path(__file__).resolve().parent)
CORRAL_DIR = str(Path(corral.__file__).resolve().parents[1])
"""Where the corral under test is imported from: the workers import the same one (a
checkout run with `PYTHONPATH=src` beside an installed corral, say)."""
RUNTIME_ENV: dict[str, Any] = {"env_vars": {
    "PYTHONPATH": os.pathsep.join([TESTS_DIR, CORRAL_DIR]), "RAY_AUTH_MODE": "disabled"}}
"""How the tests ship this module to Ray workers (an application may use `py_modules`)."""


class Start(BaseModel):
    tenant: str


class Item(BaseModel):
    id: str


class Seen(BaseModel):
    items: list[str]
    pid: int
    starts: int


class Counter(corral.Entity):
    """Records every signal it applies, in order (applied-once is checked on this list)."""

    def __init__(self, init: Start) -> None:
        self.tenant = init.tenant
        self.items: list[str] = []

    @corral.signal
    def add(self, item: Item) -> None:
        self.items.append(item.id)

    @corral.update
    def add_and_count(self, item: Item) -> int:
        self.items.append(item.id)
        return len(self.items)

    @corral.query
    def seen(self) -> Seen:
        return Seen(items=self.items, pid=os.getpid(), starts=0)


class Heavy(corral.Entity):
    """A dedicated entity: each key gets its own Ray actor (with its own resources)."""

    placement = "dedicated"
    ray_options = {"num_cpus": 0, "memory": 1024 * 1024}

    def __init__(self, init: Start) -> None:
        self.items: list[str] = []

    @corral.signal
    def add(self, item: Item) -> None:
        self.items.append(item.id)

    @corral.query
    def seen(self) -> Seen:
        return Seen(items=self.items, pid=os.getpid(), starts=0)


class Tally(corral.Entity):
    """A shared type that some clients do not list (shard actors learn it on first use)."""

    def __init__(self) -> None:
        self.items: list[str] = []

    @corral.signal
    def add(self, item: Item) -> None:
        self.items.append(item.id)

    @corral.query
    def seen(self) -> Seen:
        return Seen(items=self.items, pid=os.getpid(), starts=0)


class Metered(Tally):
    """`Tally` under a type name only the metrics tests (`tests/ray/test_ray_metrics.py`)
    send to, so its series count those tests' sends alone."""

class Wake(BaseModel):
    at: float


class Alarm(corral.Entity):
    """Sleeps under a durable timer until `at`, passivated meanwhile (idle after 0.2 s)."""

    idle_timeout = 0.2

    def __init__(self, init: Wake) -> None:
        self.at = init.at

    @corral.signal
    def poke(self) -> None:
        pass

    async def run(self) -> float:
        await self.sleep_until(self.at)
        return time.time()


class Verdict(BaseModel):
    approved: bool
    by: str


class Gate(corral.Entity):
    """Waits for one durable signal, then returns it (idle after 0.2 s: passivated)."""

    idle_timeout = 0.2
    verdict = corral.wait(Verdict)

    def __init__(self, init: Start) -> None:
        self.tenant = init.tenant

    async def run(self) -> Verdict:
        return await self.wait_for_signal(Gate.verdict, timeout=600)


class Brittle(corral.Entity):
    """Takes items; one whose id starts with "bad" raises until it is dead-lettered."""

    retry = corral.RetryPolicy(max_attempts=2, initial_backoff=0.001, max_backoff=0.001)

    def __init__(self, init: Start) -> None:
        self.items: list[str] = []

    @corral.signal
    def add(self, item: Item) -> None:
        if item.id.startswith("bad"):
            raise ValueError(f"cannot take {item.id}")
        self.items.append(item.id)

    @corral.query
    def seen(self) -> list[str]:
        return self.items


class Patchy(corral.Entity):
    """`run()` answers items in order, and has a bug: an item whose id starts with "bug"
    raises until an item "patch" has arrived (the fix, shipped as data: a Ray actor runs
    the code it was started with). Suspended runs are retried an hour later, unless
    resumed."""

    run_retry = corral.RetryPolicy(max_attempts=None, initial_backoff=3600, max_backoff=3600)

    def __init__(self, init: Start) -> None:
        self.inbox: list[str] = []
        self.answered: list[str] = []

    @corral.signal
    def add(self, item: Item) -> None:
        self.inbox.append(item.id)

    @corral.query
    def seen(self) -> list[str]:
        return self.answered

    async def run(self) -> None:
        while True:
            await self.wait_for(lambda: self.inbox)
            while self.inbox:
                if self.inbox[0].startswith("bug") and "patch" not in self.inbox:
                    raise RuntimeError(f"cannot answer {self.inbox[0]}")
                self.answered.append(self.inbox.pop(0))


ENTITIES: list[type[corral.Entity]] = [Counter, Heavy, Alarm, Gate, Brittle, Patchy]


# -- a storm sender (a driver process or a Ray task) -----------------------------------


async def signal_counted(rt: corral.Runtime, key: str, mid: str, errors: list[str]) -> bool:
    """`Counter.add` with start to `key`, message id `mid`; whether it was acknowledged
    (a failure is recorded in `errors`)."""
    try:
        await rt.ref(Counter, key).signal_with_start(
            Counter.add, Item(id=mid), start=Start(tenant="t"), message_id=mid)
    except Exception as err:
        errors.append(f"{mid}: {type(err).__name__}: {err}")
        return False
    return True


async def host_info(namespace: str, shard: int) -> dict[str, Any] | None:
    """`info(shard)` of the host actor the directory names for `shard` now, or None
    while it cannot answer (its node just died, or it is moving)."""
    import ray

    from corral.runtime.ray._directory import host_of

    name = await asyncio.to_thread(host_of, namespace, shard, "")
    try:
        info: dict[str, Any] = await ray.get_actor(name, namespace=namespace).info.remote(shard)
    except (ValueError, ray.exceptions.RayError):
        return None
    return info if info["epoch"] is not None else None


def wait_for_file(path: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.002)


async def _send_storm(store: str, namespace: str, shards: int, key: str, who: str,
                      count: int, ready: Path, go: Path) -> list[dict[str, Any]]:
    async with corral.open_runtime(store, entities=ENTITIES, backend="ray",  # a client of
                                   namespace=namespace, shards=shards) as rt:  # the test's
        ref = rt.ref(Counter, key)  # release
        await asyncio.to_thread(ready.write_text, who)
        await asyncio.to_thread(wait_for_file, go)
        acks = await asyncio.gather(*(
            ref.signal_with_start(Counter.add, Item(id=f"{who}-{n}"),
                                  start=Start(tenant=who), message_id=f"{who}-{n}")
            for n in range(count)
        ))
    return [{"id": f"{who}-{n}", "status": a.status, "run_id": a.run_id, "seq": a.seq,
             "started": a.started} for n, a in enumerate(acks)]


def storm(store: str, namespace: str, shards: int, key: str, who: str, count: int,
          ready: str, go: str) -> list[dict[str, Any]]:
    """Report ready, wait for `go`, then send `count` concurrent signal-with-starts to `key`.

    Runs as a Ray task (Ray is initialized there) or in a driver process (`main`).
    """
    return asyncio.run(_send_storm(store, namespace, shards, key, who, count, Path(ready),
                                   Path(go)))


# -- clients inside Ray ---------------------------------------------------------------


async def _send_and_read(store: str, namespace: str, shards: int, key: str, who: str,
                         count: int) -> list[str]:
    async with corral.open_runtime(store, entities=ENTITIES, backend="ray",  # a client
                                   namespace=namespace, shards=shards) as rt:
        ref = rt.ref(Counter, key)
        for n in range(count):
            await ref.signal_with_start(Counter.add, Item(id=f"{who}-{n}"),
                                        start=Start(tenant=who), message_id=f"{who}-{n}")
        seen: Seen = await ref.query(Counter.seen)
        return seen.items


def client_task(store: str, namespace: str, shards: int, key: str, count: int) -> list[str]:
    """A Ray task using corral: Ray is initialized there, so the runtime just connects."""
    return asyncio.run(_send_and_read(store, namespace, shards, key, "task", count))


class Entry(BaseModel):
    amount: int


class Ledger(corral.Entity):
    """Snapshots every 2 entries; `ray_workers_v2.Ledger` is its next release (a new
    attribute and a new optional field), deployed over entities mid-life."""

    snapshots = corral.SnapshotPolicy(every=2, keep=1)
    entries: list[Entry]

    def __init__(self, init: Start) -> None:
        self.entries = []

    @corral.signal
    def book(self, entry: Entry) -> None:
        self.entries.append(entry)


class ClientActor:
    """An async Ray actor using corral from its own event loop."""

    async def send(self, store: str, namespace: str, shards: int, key: str, count: int
                   ) -> list[str]:
        return await _send_and_read(store, namespace, shards, key, "actor", count)


# -- a cluster losing the node of a shard ---------------------------------------------


async def _node_loss(cluster: Any, store: str, namespace: str, before_loss: int,
                     after_recovery: int, senders: int) -> dict[str, Any]:
    import ray

    shards = 2
    async with corral.open_runtime(
        store, entities=ENTITIES, backend="ray", deploy=True, namespace=namespace, shards=shards,
        lease_ttl=30.0,  # a stale lease never expires here: takeover is by fencing
        ray_options={"runtime_env": RUNTIME_ENV, "resources": {"corral": 0.01}},
    ) as rt:
        keys = [k for k in (f"node-loss-{i}" for i in range(100))
                if rt.router.shard_of("Counter", k) == 0][:4]
        for key in keys:
            await rt.ref(Counter, key).signal_with_start(
                Counter.add, Item(id=f"{key}-first"), start=Start(tenant="t"),
                message_id=f"{key}-first")
        before = await host_info(namespace, 0)
        assert before is not None
        victim = next(n for n in cluster.worker_nodes if n.node_id == before["node_id"])
        acked: list[tuple[str, str, float]] = []
        errors: list[str] = []
        removed_at: list[float] = []

        recovered_at: list[float] = []
        done = asyncio.Event()

        async def sender(s: int) -> None:
            n = s
            while not done.is_set():
                key, mid = keys[n % len(keys)], f"s{s}-{n}"
                n += senders
                if await signal_counted(rt, key, mid, errors):
                    acked.append((key, mid, time.monotonic()))
                    if recovered_at and sum(t > recovered_at[0] for _, _, t in
                                            acked[-after_recovery:]) >= after_recovery:
                        done.set()

        async def remover() -> None:
            deadline = time.monotonic() + 60
            while len(acked) < before_loss:
                if time.monotonic() > deadline:
                    raise TimeoutError("the stream never got going")
                await asyncio.sleep(0.01)
            removed_at.append(time.monotonic())
            await asyncio.to_thread(cluster.remove_node, victim, False)
            # Recovered = the shard answers from another node (a restarted incarnation).
            try:
                while (now := await host_info(namespace, 0)) is None or \
                        now["node_id"] == before["node_id"]:
                    if time.monotonic() > deadline:
                        raise TimeoutError("shard 0 never came back on another node")
                    await asyncio.sleep(0.02)
                recovered_at.append(time.monotonic())
            except BaseException:
                done.set()
                raise

        await asyncio.gather(remover(), *(sender(s) for s in range(senders)))
        after = await host_info(namespace, 0)
        t0 = removed_at[0]
        later = sorted(t for _, _, t in acked if t > t0)
        gaps = [b - a for a, b in zip([t0, *later], later, strict=False)]
        applied: dict[str, list[str]] = {}
        for key in keys:
            seen: Seen = await rt.ref(Counter, key).query(Counter.seen)
            applied[key] = seen.items
        described = [await rt.ref(Counter, key).describe() for key in keys]
        _ = ray  # the driver is connected to the cluster
    return {
        "before": before, "after": after, "acked": [[k, m] for k, m, _ in acked],
        "errors": errors, "applied": applied,
        "settled": all(d.applied_seq == d.accepted_seq for d in described),
        "longest_gap_s": max(gaps) if gaps else None,
        "recovery_s": recovered_at[0] - t0,
        "acked_after_removal": len(later),
        "acked_after_recovery": sum(t > recovered_at[0] for _, _, t in acked),
    }


def node_loss(store: str, temp: str, before_loss: int, after_recovery: int, senders: int
              ) -> dict[str, Any]:
    """Head + 2 worker nodes; remove the node hosting shard 0 mid-stream; report."""
    from ray_clusters import on_cluster  # here: it imports RUNTIME_ENV from this module

    return on_cluster(temp, "node-loss", lambda cluster: _node_loss(
        cluster, store, "node-loss", before_loss, after_recovery, senders))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    roles = parser.add_subparsers(dest="role", required=True)
    storm_args = roles.add_parser("storm")
    for flag in ("--address", "--namespace", "--store", "--key", "--who", "--ready", "--go",
                 "--out"):
        storm_args.add_argument(flag, required=True)
    storm_args.add_argument("--shards", type=int, required=True)
    storm_args.add_argument("--count", type=int, required=True)
    loss_args = roles.add_parser("node-loss")
    for flag in ("--store", "--temp", "--out"):
        loss_args.add_argument(flag, required=True)
    loss_args.add_argument("--before-loss", type=int, default=200)
    loss_args.add_argument("--after-recovery", type=int, default=200)
    loss_args.add_argument("--senders", type=int, default=8)
    args = parser.parse_args(argv)
    if args.role == "node-loss":
        _write_json(Path(args.out), node_loss(args.store, args.temp, args.before_loss,
                                              args.after_recovery, args.senders))
        return
    import ray

    # No _node_ip_address here: a driver joining a running instance takes the node's own
    # address from it (forcing another one makes it look for a raylet that is not there).
    ray.init(address=args.address, namespace=args.namespace, runtime_env=RUNTIME_ENV,
             log_to_driver=False)
    try:
        acks = storm(args.store, args.namespace, args.shards, args.key, args.who, args.count,
                     args.ready, args.go)
    finally:
        ray.shutdown()
    _write_json(Path(args.out), acks)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


if __name__ == "__main__":  # the module's own classes, not __main__'s: a release names
    import ray_workers  # them by import path (`deploy=True` refuses a script's classes)

    ray_workers.main(sys.argv[1:])
