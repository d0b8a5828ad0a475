"""The placer of a Ray deployment: which host actor holds which shard, and the moves.

Shards are units of placement, host actors are processes: a deployment has a fixed
number of shards (its store's) and a few host actors (`ShardHost`), by default one per
alive Ray node, each holding many shards. One detached named actor per deployment,
`corral/<ns>/placer` (created by `deploy`, `_deployment`; `max_restarts=-1`), decides
the assignment and is the only one that changes it, so two moves of one shard never
race. It holds no entity code: it runs the deployment's current release (`_release`),
which it reads from the store when it starts, so Ray restarting it on any node changes
nothing, and which only `declare` (called by `deploy`) changes. Its other state is the
directory (`_directory`, in Ray's GCS: shard -> host actor name, and the drained
nodes) and the named host actors: a restarted placer reads them again and goes on.

Host actors are named `corral/<ns>/host-<node id[:12]>-<n>@<release id>`, pinned to their
node (`NodeAffinitySchedulingStrategy(soft=False)`): a host never wanders to another
node when Ray restarts it, so "the shards of a node" stays true. `hosts=` (an int: the
total, spread over the nodes; or {node id: count}) changes how many.

Every round (`PLACER_PERIOD`, and at once when a client asks, `place`):

1. the hosts wanted: the release's `hosts` over the alive, undrained nodes, of the
   current release (created if missing, with its runtime_env: each imports the app);
2. shards no host holds yet go to the least-loaded hosts, and so do the shards of a
   host whose node is gone (taken over at a new epoch: the old holder is fenced out);
   both at once, whatever the limit: nobody serves them meanwhile;
3. shards on a host no longer wanted (its node drained, another release, one host too
   many) move, at most `limit` per round, preferring a host on the same node;
4. while the most-loaded host holds more than one shard more than the least-loaded,
   one shard moves from the first to the second, within the same limit (Akka's
   least-shard allocation with `rebalance-absolute-limit`);
5. host actors that hold nothing and are not wanted are stopped.

A move is always the same three steps, the ones a rolling deploy made from the start:
the receiving host takes the shard (`ShardHost.take`: the graceful hand-off, the old
holder draining its commits in flight and releasing the lease at the next epoch; or a
forced takeover when the holder's node is gone), the directory names the receiver, and
the old host retires the shard (later calls get `ShardMovedError` naming the receiver,
and the client re-routes). A client holding a stale name is redirected, never wrong:
only the lease holder applies, and every write is fenced by its epoch.

Rounds run every `PLACER_PERIOD`, and back to back while shards are misplaced (a roll
after `declare`, a drain): each moves at most `MOVES_PER_ROUND`, so a roll of 256
shards pauses 8 shards at a time, never all of them at once.

Known limit: a host actor that Ray restarts while a shard is being moved off it takes
that shard back (the directory still names it until the move's second step); the
mover's take is then fenced out and the next round moves the shard again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral._errors import (
    CorralError,
    DeploymentNotFoundError,
    IncompatibleBuildError,
    InvalidArgumentError,
)
from corral.persistence import Store, open_store

from .._build_registration import refused_release
from ._directory import assignment, drained_nodes, set_drained, set_host
from ._release import Release
from ._shard_host import RayHostSpec, shard_actor_class, start_failure_hint

__all__ = ["PLACER_PERIOD", "Placer", "RollStep", "host_name", "host_node_prefix",
           "placer_handle", "placer_name", "plan_moves", "release_of"]

log = logging.getLogger("corral.ray")

PLACER_PERIOD = 1.0
"""Seconds between the placer's rounds (node membership is read from Ray each round)."""

MOVES_PER_ROUND = 8
"""Shards moved gracefully per round at most (Akka's `rebalance-absolute-limit`): a
node joining takes its share over a few rounds, never all shards pausing at once."""


@dataclass(frozen=True, slots=True)
class RollStep:
    """One shard moved (by a roll, a rebalance or a drain).

    Attributes:
        shard: the shard index.
        old_actor, new_actor: the actor names it moved from and to (`old_actor` is ""
            for a shard placed for the first time).
        epoch: the lease epoch the new actor holds it at.
        pause: seconds from the old holder stopping the shard to the new one having
            taken it (its entities' pause; wall clocks of two processes).
        seconds: how long the whole step took.
    """

    shard: int
    old_actor: str
    new_actor: str
    epoch: int
    pause: float
    seconds: float


def host_name(namespace: str, node_id: str, n: int, tag: str) -> str:
    """`corral/<namespace>/host-<node id[:12]>-<n>@<build>`."""
    return f"corral/{namespace}/host-{node_id[:12]}-{n}@{tag}"


def host_node_prefix(name: str) -> str:
    """The node id prefix in a host actor's name (`host_name`'s `node_id[:12]`)."""
    return name.rsplit("/", 1)[-1][len("host-"):].split("-", 1)[0]


def release_of(name: str) -> str:
    """The release id in a host actor's name (`host_name`'s last part)."""
    return name.rsplit("@", 1)[-1]


def placer_name(namespace: str) -> str:
    """`corral/<namespace>/placer`."""
    return f"corral/{namespace}/placer"


def placer_handle(spec: RayHostSpec) -> Any:
    """Get or create the placer of `spec.namespace` (blocking: a GCS call). It holds
    no code: it runs the release the store names current (`deploy` declares one)."""
    import ray

    return ray.remote(Placer).options(
        name=placer_name(spec.namespace), namespace=spec.namespace, get_if_exists=True,
        lifetime="detached", max_restarts=-1, max_task_retries=-1, num_cpus=0,
    ).remote(spec)


Move = tuple[int, str, bool]
"""(shard, receiving host, forced): one move of a round's plan."""


def plan_moves(shards: int, directory: Mapping[int, str], wanted: Sequence[str],
               nodes: set[str], named: set[str], *, limit: int, balance: bool = True
               ) -> list[Move]:
    """The moves of one round (the module docstring's steps 2-4), decided from what the
    round observed: `directory` (shard -> host), the host actors `wanted` (one or more
    per usable node), the id prefixes of the alive `nodes`, the host actors `named` in
    Ray now. Pure: the placer carries the moves out.

    Example:
        a, b = host_name("ns", "n1", 0, "t"), host_name("ns", "n2", 0, "t")
        plan_moves(4, dict.fromkeys(range(4), a), [a, b], {"n1", "n2"}, {a, b}, limit=8)
        # -> [(3, b, False), (2, b, False)]: node n2 joined, it takes half
    """
    load: dict[str, list[int]] = {name: [] for name in wanted}
    forced: list[int] = []
    misplaced: list[int] = []
    for shard in range(shards):
        holder = directory.get(shard)
        if holder in load:
            load[holder].append(shard)
        elif holder is None or host_node_prefix(holder) not in nodes or holder not in named:
            forced.append(shard)  # never placed, or its node (or actor) is gone
        else:
            misplaced.append(shard)  # its node drained, an older build, a host too many
    plan: list[Move] = []

    def least(node: str | None = None) -> str:
        pool = [h for h in wanted if node is None or host_node_prefix(h) == node]
        return min(pool or wanted, key=lambda h: (len(load[h]), h))

    def move(shard: int, to: str, force: bool) -> None:
        plan.append((shard, to, force))
        load[to].append(shard)

    for shard in forced:  # all at once: nobody serves them
        move(shard, least(), True)
    for shard in misplaced[:limit]:  # to a host on the same node if there is one
        move(shard, least(host_node_prefix(directory[shard])), False)
    budget = limit - min(limit, len(misplaced))
    while balance and budget > 0:
        most = max(wanted, key=lambda h: (len(load[h]), h))
        to = least()
        if len(load[most]) - len(load[to]) <= 1:
            break
        move(load[most].pop(), to, False)
        budget -= 1
    return plan


class Placer:
    """The placer actor (see the module docstring)."""

    async def __init__(self, spec: RayHostSpec) -> None:  # type: ignore[misc]  # Ray awaits
        self.spec = spec
        self.store: Store = await open_store(spec.store, shards=spec.shards)
        releases = [Release.of_record(r)
                    for r in await self.store.releases(spec.namespace, limit=2)]
        self.release: Release | None = releases[0] if releases else None
        """The current release (None until the first `declare`)."""
        self.previous: Release | None = releases[1] if len(releases) > 1 else None
        # Ray restarted this placer (shards are placed): go on at once. A new one (the
        # deployment was stopped, its releases kept) places nothing until `deploy`
        # declares the release to run, or a client asks.
        self._placing = bool(await asyncio.to_thread(assignment, spec.namespace))
        self._lock = asyncio.Lock()  # one round (one set of moves) at a time
        self._wake = asyncio.Event()  # a round now: a release declared, or shards misplaced
        self._failed: CorralError | None = None  # why the last round's first move failed
        self.moved = 0  # moves made since start (`progress`)
        self.moves: collections.deque[RollStep] = collections.deque(maxlen=1024)
        """The latest moves, oldest first (for operators and benchmarks)."""
        self._loop_task = asyncio.create_task(self._loop(), name="corral-placer")
        if self.release is not None:
            log.info("placer %s: runs %s", spec.namespace, self.release)

    # -- what `deploy`, clients, `drain_node` call -----------------------------------

    async def declare(self, release: Release) -> tuple[Release, Release | None, list[str]]:
        """Make `release` the deployment's current release (recorded in the store) and
        roll every shard to it from the next rounds on; (current, previous, notes).
        Declaring the current release again changes nothing; a release that gives no
        `hosts` keeps the current one's.

        Raises:
            IncompatibleBuildError: the current release cannot be replaced by this one
                (naming each difference); nothing was recorded or moved.
        """
        async with self._lock:
            current = self.release
            if current is not None and release.hosts is None:  # not given: kept
                release = dataclasses.replace(release, hosts=current.hosts)
            if current is not None and current.key == release.key:
                self._placing = True
                self._wake.set()
                return current, self.previous, []
            notes: list[str] = []
            if current is not None:
                refused, notes = await refused_release(self.store, current.manifests,
                                                       release.manifests)
                if refused:
                    raise IncompatibleBuildError(
                        f"{release.app} ({release.id}) cannot replace the current "
                        f"{current}: " + "; ".join(refused) + ". Declare a compatible "
                        "release (see `corral builds` and the upgrade hooks), or stop the "
                        "deployment (corral deploy stop) and start it anew",
                        entity_type=refused[0].split(" ", 1)[0],
                        differences=tuple(refused))
            record = await self.store.declare_release(
                self.spec.namespace, release.key, release.body(),
                declared_by=release.declared_by)
            self.previous, self.release = current, Release.of_record(record)
            self._placing = True
            log.info("placer %s: %s declared by %s%s", self.spec.namespace, self.release,
                     release.declared_by, "".join(f"; {n}" for n in notes))
        self._wake.set()
        return self.release, self.previous, notes

    async def current(self) -> tuple[Release | None, Release | None]:
        """(the current release, the one before): what clients connect to."""
        return self.release, self.previous

    async def place(self) -> dict[int, str]:
        """Place every unplaced shard now (a client found one); the directory."""
        if self.release is None:
            raise DeploymentNotFoundError(
                f"the Ray deployment {self.spec.namespace!r} has no release: declare one "
                f"with `corral deploy --namespace {self.spec.namespace} --app ...`")
        self._placing = True
        async with self._lock:
            await self._round(limit=0)
        directory = await asyncio.to_thread(assignment, self.spec.namespace)
        if len(directory) < self.spec.shards and self._failed is not None:
            raise self._failed  # a host could not start: the client reports it
        return directory

    async def progress(self, since: int) -> tuple[int, list[RollStep], int, str]:
        """(moves made so far, the moves after the first `since` of them (those still
        kept), shards on the current release's hosts, why the last round's first move
        failed or ""): a roll's progress."""
        new = max(0, min(self.moved - since, len(self.moves)))
        steps = list(self.moves)[len(self.moves) - new:] if new else []
        directory = await asyncio.to_thread(assignment, self.spec.namespace)
        on = 0 if self.release is None else sum(
            1 for name in directory.values() if release_of(name) == self.release.id)
        return self.moved, steps, on, str(self._failed or "")

    async def drain(self, node_id: str) -> tuple[list[RollStep], list[str]]:
        """Move every shard off `node_id`'s hosts, stop them, and place nothing there
        again (until `undrain`); (the moves, the hosts stopped). `MOVES_PER_ROUND`
        shards at a time."""
        alive, _, drained, _ = await asyncio.to_thread(self._observe)
        if not alive - drained - {node_id}:
            raise InvalidArgumentError(
                f"draining node {node_id} would leave no node that can run the hosts of "
                f"{self.spec.namespace!r}: add a node first (or stop the deployment with "
                f"corral.runtime.stop_ray_hosts)")
        steps: list[RollStep] = []
        stopped: list[str] = []
        async with self._lock:
            # Marked under the round lock: a background round that saw the mark first
            # would make the moves and stop the hosts itself, and this drain would report
            # none of them (seen under load: `stopped` empty).
            await asyncio.to_thread(set_drained, self.spec.namespace, node_id, True)
            while True:
                moved, gone = await self._round(limit=MOVES_PER_ROUND, balance=False)
                steps += moved
                stopped += gone
                if not moved:
                    break
        return steps, stopped

    async def undrain(self, node_id: str) -> None:
        """Let the placer place shards on `node_id` again (from its next round)."""
        await asyncio.to_thread(set_drained, self.spec.namespace, node_id, False)

    async def state(self) -> dict[str, Any]:
        """The assignment, the settings and the latest moves (for operators, tests and
        benchmarks)."""
        directory = await asyncio.to_thread(assignment, self.spec.namespace)
        return {"directory": directory, "release": self.release, "previous": self.previous,
                "moves": [dataclasses.asdict(step) for step in self.moves],
                "drained": sorted(await asyncio.to_thread(drained_nodes,
                                                          self.spec.namespace))}

    async def spec_of(self) -> RayHostSpec:
        return self.spec

    async def shutdown(self) -> None:
        """Stop placing (`stop_ray_hosts` kills the placer before the hosts)."""
        self._loop_task.cancel()
        with contextlib.suppress(BaseException):
            await self._loop_task
        await self.store.close()

    # -- the rounds ---------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):  # not the builtin before 3.11
                await asyncio.wait_for(self._wake.wait(), PLACER_PERIOD)
            self._wake.clear()
            if self.release is None or not self._placing:
                continue
            try:
                async with self._lock:
                    steps, _ = await self._round(limit=MOVES_PER_ROUND)
            except Exception:
                log.exception("placer %s: a round failed", self.spec.namespace)
                continue
            if steps:  # more may be misplaced (a roll): the next round at once
                self._wake.set()

    def _wanted(self, nodes: list[str]) -> list[str]:
        """The host actor names wanted on `nodes` (alive, undrained; sorted)."""
        assert self.release is not None
        hosts = self.release.hosts
        counts: dict[str, int]
        if isinstance(hosts, int):
            counts = {node: hosts // len(nodes) + (i < hosts % len(nodes))
                      for i, node in enumerate(nodes)}
        else:
            per_node = dict(hosts or {})
            counts = {node: per_node.get(node, 1) for node in nodes}
        return [host_name(self.spec.namespace, node, n, self.release.id)
                for node in nodes for n in range(counts[node])]

    async def _round(self, *, limit: int, balance: bool = True
                     ) -> tuple[list[RollStep], list[str]]:
        """One round (the module docstring's steps 1-5); (moves made, hosts stopped)."""
        alive, directory, drained, named = await asyncio.to_thread(self._observe)
        nodes = sorted(n for n in alive if n not in drained)
        if not nodes:
            log.warning("placer %s: no alive, undrained node to place shards on",
                        self.spec.namespace)
            return [], []
        wanted = self._wanted(nodes)
        node_ids = {n[:12]: n for n in alive}
        plan = plan_moves(self.spec.shards, directory, wanted, set(node_ids), named,
                          limit=limit, balance=balance)
        for name in wanted:
            if name not in named:
                self._start(name, node_ids[host_node_prefix(name)])
        steps = await self._moves(plan, directory)
        self.moves.extend(steps)
        self.moved += len(steps)
        stopped = await self._sweep(set(wanted), named, alive, steps)
        if steps:
            log.info("placer %s: moved %d shards: %s", self.spec.namespace, len(steps),
                     ", ".join(f"{s.shard}->{s.new_actor}" for s in steps))
        return steps, stopped

    def _observe(self) -> tuple[set[str], dict[int, str], set[str], set[str]]:
        """(ids of the alive nodes that can run a host, the directory, drained node ids,
        host actors named): the GCS reads of one round, blocking. A node that lacks a
        resource the hosts ask for (`ray_options`) gets no host: it counts as gone."""
        import ray

        needs = self._needs()
        alive = {n["NodeID"] for n in ray.nodes()  # type: ignore[no-untyped-call]
                 if n["Alive"] and all(n["Resources"].get(r, 0) >= q for r, q in needs.items())}
        prefix = f"corral/{self.spec.namespace}/host-"
        named = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["namespace"] == self.spec.namespace and a["name"].startswith(prefix)}
        return (alive, assignment(self.spec.namespace), drained_nodes(self.spec.namespace),
                named)

    def _needs(self) -> dict[str, float]:
        """The resources one host actor asks for (the release's actor options)."""
        options = self.release.actor_options if self.release is not None else {}
        needs = dict(options.get("resources") or {})
        for option, resource in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
            if options.get(option):
                needs[resource] = float(options[option])
        return needs

    def _start(self, name: str, node_id: str) -> Any:
        """Get or create host actor `name` of the current release, pinned to `node_id`:
        it imports the release's app in the release's runtime_env."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        release = self.release
        assert release is not None
        options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 10_000,
                                   **release.actor_options}
        if release.runtime_env:
            options["runtime_env"] = release.runtime_env
        options.update(
            name=name, namespace=self.spec.namespace, get_if_exists=True,
            lifetime="detached", max_restarts=-1, max_task_retries=-1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
        return shard_actor_class().options(**options).remote(self.spec, release, None, name)

    def _handle(self, name: str) -> Any | None:
        import ray

        try:
            return ray.get_actor(name, namespace=self.spec.namespace)
        except ValueError:
            return None

    async def _moves(self, plan: list[tuple[int, str, bool]], directory: Mapping[int, str]
                     ) -> list[RollStep]:
        """Make the moves of `plan`, one `take` per receiver and kind, side by side."""
        groups: dict[tuple[str, bool], list[int]] = {}
        for shard, to, force in plan:
            groups.setdefault((to, force), []).append(shard)
        done = await asyncio.gather(*(self._move(shards, to, force, directory)
                                      for (to, force), shards in groups.items()),
                                    return_exceptions=True)
        steps: list[RollStep] = []
        self._failed = next((CorralError(str(e)) for e in done
                             if isinstance(e, BaseException)), None)
        for outcome in done:
            if isinstance(outcome, BaseException):
                log.warning("placer %s: a move failed (the next round tries again): %r",
                            self.spec.namespace, outcome)
            else:
                steps += outcome
        return steps

    async def _move(self, shards: list[int], to: str, force: bool,
                    directory: Mapping[int, str]) -> list[RollStep]:
        """`shards` to host `to`: take, record, retire (the module docstring)."""
        import ray

        began = time.monotonic()
        receiver = self._handle(to)
        if receiver is None:
            raise RuntimeError(f"{to} is not running")
        try:
            epochs, taken_at = await asyncio.wait_for(  # one that cannot start: next round
                receiver.take.remote(shards, force=force),
                timeout=max(60.0, 4 * self.spec.lease_ttl))
        except ray.exceptions.RayActorError as err:
            hint = start_failure_hint(err)
            raise CorralError(f"{to} failed to start{hint}: {err}") from err
        steps = []
        for shard in sorted(epochs):
            await asyncio.to_thread(set_host, self.spec.namespace, shard, to)
            old = directory.get(shard, "")
            handed_at = None
            retiring = self._handle(old) if old and not force else None
            if retiring is not None:
                with contextlib.suppress(ray.exceptions.RayError):
                    handed_at = await asyncio.wait_for(
                        retiring.retire.remote(shard, to), timeout=30.0)
            pause = max(0.0, taken_at - handed_at) if handed_at else 0.0
            steps.append(RollStep(shard, old, to, epochs[shard], pause,
                                  time.monotonic() - began))
        return steps

    async def _sweep(self, wanted: set[str], named: set[str], alive: set[str],
                     steps: list[RollStep]) -> list[str]:
        """Stop the host actors not wanted that the directory names for no shard."""
        directory = await asyncio.to_thread(assignment, self.spec.namespace)
        holding = set(directory.values())
        alive_prefixes = {n[:12] for n in alive}
        stopped = []
        for name in sorted(named - wanted - holding):
            handle = self._handle(name)
            if handle is None:
                continue
            if host_node_prefix(name) in alive_prefixes:
                await stop_actor(handle, 30.0)
            else:  # its node is gone: nothing to shut down cleanly
                with contextlib.suppress(ValueError):
                    import ray

                    ray.kill(handle, no_restart=True)
            stopped.append(name)
        return stopped


async def stop_actor(handle: Any, timeout: float) -> None:
    """Stop a host actor cleanly (it releases what it holds), then kill it for good."""
    import ray
    from ray import exceptions as rex

    with contextlib.suppress(rex.RayError, asyncio.TimeoutError):  # gone, or hung: killed
        await asyncio.wait_for(handle.shutdown.remote(), timeout)
    with contextlib.suppress(ValueError):
        ray.kill(handle, no_restart=True)
