"""Driver of tests/ray/test_ray_releases_cluster.py: releases of one package,
`ticketdesk`, on a multi-node Ray cluster whose only store is PostgreSQL.

    python ray_releases_cluster.py rolls --store URL --temp DIR --out FILE
    python ray_releases_cluster.py placer-loss --store URL --temp DIR --out FILE

A `ray.cluster_utils.Cluster` of a head and two worker nodes (`ray_clusters`); every
release is shipped by `working_dir` (`ticket_releases`), the same module name each time.

`rolls`: release 1 is deployed; tickets are opened; two client processes (one of each
release, `ticket_sender.py send`) and two Ray tasks (one of each) send notes the whole
time. A third process opens and closes a client 20 times (`ticket_sender.py churn`)
while nothing rolls. Then release 2 is deployed, release 1 again (a rollback), and
release 2 again. `placer-loss`: release 1 is deployed from a Ray task on a worker node
(so the placer starts there, off the head); during the roll to release 2 that node is
removed without grace (SIGKILL of its raylet and processes).

Each writes what it saw as JSON: the deploy reports and steps, every sender's log, what
each ticket applied, dead letters, the deployment's status at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ray_clusters import on_cluster

NAMESPACE = "releases"
SHARDS = 24
"""Three rounds of a roll (`_placer.MOVES_PER_ROUND` is 8): a node can be lost mid-roll."""
KEYS = [f"ticket-{i}" for i in range(SHARDS)]
HOST_OPTIONS = {"resources": {"corral": 0.01}}
"""Hosts on the worker nodes (the head has no `corral` resource: the drivers' tasks)."""
SENDER = str(Path(__file__).resolve().parent / "ticket_sender.py")


# -- what both scenarios share ---------------------------------------------------------


def declare(store: str, release: str, on_step: Callable[[Any], None] | None = None, *,
            runtime_env: dict[str, Any] | None = None) -> dict[str, Any]:
    """`corral.runtime.deploy` of `release` by `working_dir` (or `runtime_env`); its
    report as JSON."""
    from corral.runtime import deploy
    from ticket_releases import APP, working_dir

    report = deploy(NAMESPACE, app=APP, store=store,
                    runtime_env=runtime_env or working_dir(release),
                    actor_options=HOST_OPTIONS, shards=SHARDS, on_step=on_step)
    return {"release": release, "id": report.release.id, "tag": report.release.tag,
            "previous": report.previous.id if report.previous else None,
            "steps": [dataclasses.asdict(s) for s in report.steps],
            "skipped": list(report.skipped), "seconds": report.seconds,
            "unchanged": report.unchanged}


def status() -> dict[str, Any]:
    """`deploy_status` as JSON: the release declared, and which release each host runs."""
    from corral.runtime import deploy_status

    now = deploy_status(NAMESPACE)
    return {"release": now.release.id if now.release else None,
            "hosts": [{"name": h.name, "node_id": h.node, "release": h.release_id,
                       "shards": h.shards} for h in now.hosts],
            "on_release": now.on_release, "rolling": now.rolling, "text": repr(now)}


@contextlib.asynccontextmanager
async def client(store: str, agent: ModuleType) -> AsyncIterator[Any]:
    import corral

    async with corral.open_runtime(store, entities=[agent.Ticket], backend="ray",
                                   namespace=NAMESPACE, shards=SHARDS) as rt:
        yield rt


async def outcome(store: str) -> dict[str, Any]:
    """What each ticket applied (read with the last release's client), dead letters."""
    from stores import sql
    from ticket_releases import applied_notes, load_release

    r2 = load_release("r2")
    async with client(store, r2) as rt:
        applied = await applied_notes(rt, r2, KEYS)
        dead = [repr(d) for d in await rt.dead_letters(limit=1000)]
    stored_dead = sql(store, "SELECT count(*) FROM dead_letters")[0][0]
    return {"applied": applied, "dead_letters": dead, "dead_letters_stored": stored_dead}


def ship(release: str) -> dict[str, Any]:
    from ticket_releases import sender_env, shipped

    return shipped(sender_env(release))


# -- rolls: release 2, back to 1, forward to 2, under a stream ---------------------------


def spawn(role: str, release: str, who: str, address: str, store: str, temp: Path,
          **extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    out = temp / f"{who}.json"
    argv = [sys.executable, SENDER, role, "--release", release, "--address", address,
            "--namespace", NAMESPACE, "--store", store, "--shards", str(SHARDS),
            "--keys", ",".join(KEYS), "--who", who, "--out", str(out)]
    for flag, value in extra.items():
        argv += [f"--{flag}", value]
    with (temp / f"{who}.log").open("wb") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), out


def wait_exit(proc: subprocess.Popen[bytes], out: Path, timeout: float) -> dict[str, Any]:
    proc.wait(timeout=timeout)
    log = out.with_suffix(".log")
    assert proc.returncode == 0, f"{out.stem} exited {proc.returncode}:\n" + \
        log.read_text()[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return report


async def wait_ready(paths: list[Path], procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 120
    while not all(p.exists() for p in paths):
        assert all(p.poll() is None for p in procs), "a sender exited before it was ready"
        assert time.monotonic() < deadline, "the senders never got ready"
        await asyncio.sleep(0.1)


def hosts_of(actors: dict[str, tuple[str, int]]) -> dict[str, list[Any]]:
    return {n: list(v) for n, v in sorted(actors.items()) if not n.endswith("/placer")}


async def churn_while_watching(cluster: Any, store: str, temp: Path) -> dict[str, Any]:
    """The churn process, run to its end while the hosts are sampled (names and pids)."""
    from ticket_releases import live_actors

    before = hosts_of(live_actors(NAMESPACE))
    proc, out = spawn("churn", "r1", "churn", cluster.address, store, temp, cycles="20")
    samples: list[dict[str, list[Any]]] = []
    while proc.poll() is None:
        samples.append(hosts_of(await asyncio.to_thread(live_actors, NAMESPACE)))
        await asyncio.sleep(0.5)
    report = wait_exit(proc, out, 10)
    after = hosts_of(live_actors(NAMESPACE))
    changed = [s for s in samples if s != before]
    return {"before": before, "after": after, "samples": len(samples),
            "samples_changed": changed[:3], "log": report}


async def rolls(cluster: Any, store: str, temp: Path) -> dict[str, Any]:
    import ray

    from ticket_releases import SendLog, load_release, start_tickets, task_sender

    deploys = [await asyncio.to_thread(declare, store, "r1")]
    opened = SendLog()
    async with client(store, load_release("r1")) as rt:
        await start_tickets(rt, load_release("r1"), KEYS, opened)
    stop = temp / "stop"
    senders = [spawn("send", r, f"{r}-driver", cluster.address, store, temp, stop=str(stop))
               for r in ("r1", "r2")]
    await wait_ready([Path(f"{out}.ready") for _, out in senders], [p for p, _ in senders])
    tasks = [ray.remote(task_sender).options(runtime_env=ship(r), num_cpus=0,
                                             resources={"head": 0.01}).remote(
        store, NAMESPACE, SHARDS, KEYS, f"{r}-task", str(stop)) for r in ("r1", "r2")]
    churn = await churn_while_watching(cluster, store, temp)
    for release in ("r2", "r1", "r2"):
        deploys.append(await asyncio.to_thread(declare, store, release))
    await asyncio.sleep(2)  # a little of the stream on the last release
    stop.touch()
    logs = {out.stem: await asyncio.to_thread(wait_exit, proc, out, 300)
            for proc, out in senders}
    for name, log in zip(("r1-task", "r2-task"), await asyncio.to_thread(ray.get, tasks),
                         strict=True):
        logs[name] = log
    logs["churn"] = churn.pop("log")
    logs["opened"] = opened.as_json()
    return {"deploys": deploys, "churn": churn, "logs": logs, "status": status(),
            **await outcome(store)}


# -- placer-loss: the placer's node SIGKILLed during a roll ------------------------------


def placer_node(cluster: Any) -> Any | None:
    """The worker node (of `cluster`) running the placer; None if it runs on the head."""
    from ticket_releases import live_actors

    node_id, _ = live_actors(NAMESPACE)[f"corral/{NAMESPACE}/placer"]
    return next((n for n in cluster.worker_nodes if n.node_id == node_id), None)


def deploy_from_a_worker(store: str) -> dict[str, Any]:
    """Release 1 declared by a Ray task on a worker node: the placer it creates starts
    there (Ray places an actor on its creator's node when it can). Its `working_dir`
    is uploaded here (a task's own uploads are not what this test is about)."""
    import ray

    from ticket_releases import shipped, working_dir

    task = ray.remote(declare).options(num_cpus=0, resources={"corral": 0.01})
    report: dict[str, Any] = ray.get(task.remote(
        store, "r1", runtime_env=shipped(working_dir("r1"))))
    return report


def placer_on_a_worker(cluster: Any, store: str) -> None:
    """The deployment's placer, made before the first deploy (which then uses it), on a
    worker node (`soft`: Ray restarts it on another node once that one is gone), so
    the test can lose its node: where Ray would put it is not for the test to guess."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from corral.runtime.ray._deployment import MIN_POLL, store_location
    from corral.runtime.ray._placer import Placer, placer_name
    from corral.runtime.ray._shard_host import RayHostSpec

    spec = RayHostSpec(store_location(store), SHARDS, NAMESPACE, 10.0, MIN_POLL)
    node = next(iter(cluster.worker_nodes)).node_id  # a set: any one of them
    for _ in range(20):  # soft affinity may still start it elsewhere (a node not ready)
        placer = ray.remote(Placer).options(
            name=placer_name(NAMESPACE), namespace=NAMESPACE, get_if_exists=True,
            lifetime="detached", max_restarts=-1, max_task_retries=-1, num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=True)).remote(spec)
        ray.get(placer.spec_of.remote())
        if placer_node(cluster) is not None:
            return
        ray.kill(placer, no_restart=True)
        time.sleep(0.5)
    raise AssertionError("the placer never started on a worker node")


async def placer_loss(cluster: Any, store: str, temp: Path) -> dict[str, Any]:
    import ray

    from ticket_releases import SendLog, load_release, send_notes, start_tickets

    await asyncio.to_thread(placer_on_a_worker, cluster, store)
    first = await asyncio.to_thread(deploy_from_a_worker, store)
    victim = placer_node(cluster)
    assert victim is not None, "the placer started on the head node: cannot lose its node"
    r1, r2 = load_release("r1"), load_release("r2")
    logs = {"r1": SendLog(), "r2": SendLog()}
    async with client(store, r1) as rt1, client(store, r2) as rt2:
        await start_tickets(rt1, r1, KEYS, logs["r1"])
        done = asyncio.Event()
        stream = [asyncio.create_task(send_notes(rt, agent, KEYS, f"{name}-driver",
                                                 done.is_set, log=logs[name]))
                  for name, rt, agent in (("r1", rt1, r1), ("r2", rt2, r2))]
        killed: list[tuple[float, int]] = []  # (when, shards on release 2 then)

        def on_step(step: Any) -> None:
            """Lose the placer's node as soon as the roll moved a shard, once."""
            if not killed:
                killed.append((time.monotonic(), status()["on_release"]))
                cluster.remove_node(victim, False)

        try:
            deployer = {"report": await asyncio.to_thread(declare, store, "r2", on_step)}
        except Exception as err:  # the deployer's placer died under it: said, not hidden
            deployer = {"error": f"{type(err).__name__}: {err}"}
        assert killed, f"the roll never moved a shard: {deployer}"
        converged = await converge(lambda release: release not in (None, first["id"]),
                                   lost=victim.node_id)
        converged["seconds"] = time.monotonic() - killed[0][0]
        answered = {(await rt1.ref(r1.Ticket, key).query(r1.Ticket.history)).release
                    for key in KEYS}
        alive = {n["NodeID"]: n["Alive"] for n in ray.nodes()}
        await asyncio.sleep(2)  # a little of the stream on the converged deployment
        done.set()
        await asyncio.gather(*stream)
    return {"first": first, "victim": victim.node_id, "victim_alive": alive[victim.node_id],
            "shards": SHARDS, "on_release_at_kill": killed[0][1], "deployer": deployer,
            "answered_by": sorted(answered),
            "converged": converged, "logs": {n: log.as_json() for n, log in logs.items()},
            **await outcome(store)}


async def converge(declared: Callable[[str | None], bool], *, lost: str,
                   timeout: float = 300.0) -> dict[str, Any]:
    """Until a release for which `declared` holds is declared, every host runs it,
    every shard is held, and none by a host on the node `lost`; the status then."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            now = await asyncio.to_thread(status)
        except Exception as err:  # the placer restarting: asked again
            now = {"error": f"{type(err).__name__}: {err}"}
        else:
            release = now["release"]
            if declared(release) and now["on_release"] == SHARDS and \
                    sum(h["shards"] for h in now["hosts"]) == SHARDS and \
                    all(h["release"] == release for h in now["hosts"] if h["shards"]) and \
                    not any(lost.startswith(h["node_id"]) for h in now["hosts"]):
                return now
        assert time.monotonic() < deadline, f"never converged: {now}"
        await asyncio.sleep(0.5)


# -- the program -----------------------------------------------------------------------


SCENARIOS = {"rolls": rolls, "placer-loss": placer_loss}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    for flag in ("--store", "--temp", "--out"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args(argv)
    work = SCENARIOS[args.scenario]
    report = on_cluster(args.temp, NAMESPACE,
                        lambda cluster: work(cluster, args.store, Path(args.temp)))
    Path(args.out).write_text(json.dumps(report, default=repr))


if __name__ == "__main__":
    main(sys.argv[1:])
