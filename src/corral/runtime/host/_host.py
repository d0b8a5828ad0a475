"""`LocalHost`: this process's share of the shards, held through leases in the store.

Any process may accept messages; only the lease holder of a shard applies them. The
host renews its leases, takes over shards whose holder stopped renewing (a new epoch
fences the old holder out), hands shards over gracefully when another host asks for
them or when it closes (`_handoff`), and tails the journal for entries that other
processes accepted for its shards. During a rolling deploy the newest build hosts
(`_newest`): a host on it requests the shards of hosts on an older one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence

import corral.metrics as metrics
from corral._errors import LeaseLostError, StoreError
from corral.actors import EntityDefinition
from corral.persistence import Fence, Purged, Store, housekeeping

from .._clock import Clock, SystemClock
from ..client._router import Router
from . import _progress
from ._events import lifecycle
from ._handoff import hand_off, hand_off_all, request_shards
from ._newest import Plan, moves_per_round, plan, settled
from ._outbox import Postman
from ._progress import ProgressLog
from ._recovery_window import RecoveryWindow
from ._schedule_round import ScheduleRound
from ._shard import Shard, recover

__all__ = ["LocalHost"]

REQUEST_POLL = 0.25
"""Seconds between a host's reads of the hand-off requests for its shards (between
lease renewals; a read of a few rows, so four a second cost nothing measurable)."""

PURGE_EVERY = 1.0
"""Seconds between a host's retention rounds (`purge_closed`): one bounded purge per
type with a `Retention`, over the shards it holds."""

log = logging.getLogger("corral.host")


class LocalHost:
    """Runs the `Shard`s whose leases this process holds."""

    def __init__(self, store: Store, router: Router,
                 definitions: Mapping[str, EntityDefinition], *, lease_ttl: float,
                 poll_interval: float, timer_interval: float = 0.25,
                 indices: Sequence[int] | None = None, takeover: bool = False,
                 clock: Clock | None = None) -> None:
        """`indices`: the shards this host may hold (default: all of `router.shards`).
        `takeover`: take them at start even if another holder's lease is live (a new
        epoch fences it out); a restarted Ray shard actor starts this way."""
        self.store = store
        self.router = router
        self.owner = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._definitions = definitions
        self.lease_ttl = lease_ttl
        self._poll_interval = poll_interval
        self._timer_interval = timer_interval
        self.indices = tuple(range(router.shards) if indices is None else indices)
        self._takeover = takeover
        # A host that may hold any shard receives shards other hosts hand over when
        # they close, and hands its own over when it closes (a Ray shard actor, pinned
        # to its one shard, does neither).
        self._receives = indices is None and not takeover
        self.leasing = asyncio.Lock()  # one change of this host's set of shards at a time
        # The two polls of an idle host (requests for its shards, its due timers) tick at
        # the same rate: in turn, they never need two connections at once (`_pg_pool`).
        self._polling = asyncio.Lock()
        self.clock: Clock = clock or SystemClock()
        self.shards: dict[int, Shard] = {}
        self.postman = Postman(store, router, definitions, self.shard, self.clock)  # sends
        self.schedules = ScheduleRound(store, lambda: self.shards, self.clock, self._polling)
        self._cursor = 0
        self._tasks: list[asyncio.Task[None]] = []
        # Shards this host was fenced out of or handed over, and when (monotonic). Left
        # alone for one lease_ttl: the new holder takes the shard's OS or advisory lock
        # only at its next renewal, and until then the lock looks free, which would read
        # as "its holder died" and let this host take the shard straight back.
        self._lost: dict[int, float] = {}
        self._failures: dict[str, int] = {}  # a loop's failed rounds in a row
        self.handed_at: dict[int, float] = {}  # shard -> when its last hand-off began (epoch s)
        # A live host of a newer build supersedes this one: take only shards handed here.
        self._yielding = False
        self.progress = ProgressLog()
        # The shards' recoveries share it: a few activations at once, host-wide.
        self.recovery_window = RecoveryWindow()
        # Read at construction, so a benchmark may set it to None (never recorded).
        self.progress_interval: float | None = _progress.PROGRESS_INTERVAL

    async def open(self) -> None:
        metrics.track_residents(self)
        self._cursor = await self.store.journal_end()
        if self._receives:  # an old release started late takes no shard from the newest
            self._yielding = (await self._plan()).yielding
        async with self.leasing:
            await self.acquire(force=self._takeover)
        self._tasks = [asyncio.create_task(self._tail_journal(), name="corral-tail")]
        with housekeeping():  # the host's own rounds: unhurried for a store connection
            self._tasks += [
                asyncio.create_task(self._keep_leases(), name="corral-leases"),
                asyncio.create_task(self._housekeep(), name="corral-housekeeping"),
            ]
            if self.progress_interval is not None:
                self._tasks.append(asyncio.create_task(self._keep_progress(),
                                                       name="corral-progress"))
            if self._receives:
                self._tasks.append(asyncio.create_task(self._host_newest(),
                                                       name="corral-newest"))

    def shard(self, index: int) -> Shard | None:
        return self.shards.get(index)

    def assign(self, indexes: Iterable[int]) -> None:
        """Set the shards this host may hold: a Ray host actor's share, which its placer
        changes (`ray._placer`). A shard newly assigned may be taken at once even if this
        host handed it off lately; one left out is not taken again (the host hands it
        off when its next holder asks)."""
        wanted = set(indexes)
        for index in wanted - set(self.indices):
            self._lost.pop(index, None)
        self.indices = tuple(sorted(wanted))

    async def request_shards(self, indexes: Sequence[int], *, timeout: float | None = None
                             ) -> dict[int, int]:
        """Ask the holders of `indexes` to hand them here gracefully and wait until they
        have (or `timeout`, default two lease terms); {shard: epoch} held here now.

        Example:
            taken = await host.request_shards(range(4))  # {0: 2, 1: 2, 2: 2, 3: 2}
        """
        return await request_shards(self, indexes, timeout=timeout)

    async def hand_off(self, heirs: Mapping[int, str]) -> set[int]:
        """Drain the shards of `heirs` and release each lease to its heir host (which
        takes it at the next epoch); the shards handed.

        Example:
            await host.hand_off({3: other.owner})
        """
        async with self.leasing:
            return await self._hand_off(heirs)

    async def _hand_off(self, heirs: Mapping[int, str]) -> set[int]:
        left = set(heirs) & set(self.shards)
        stopping = time.time()
        handed = await hand_off(self, heirs)
        self.handed_at.update((index, stopping) for index in handed)
        now = time.monotonic()
        for index in left:  # the heir may lock the shard only at its next renewal
            self._lost[index] = now
        return handed

    async def close(self) -> None:
        """Stop in order: the host's own tasks (cancelled and awaited, wherever they
        were), then its shards (handed to the other live hosts, see `_handoff`, or
        stopped), then its leases. The store is closed only after this returns, so
        nothing of the host reaches a closed store; a task that had died of a bug is
        logged here, never raised out of the runtime's close."""
        metrics.untrack_residents(self)  # a closing host is not up
        for task in self._tasks:
            task.cancel()
        ended = await asyncio.gather(*self._tasks, return_exceptions=True)
        for task, outcome in zip(self._tasks, ended, strict=True):
            if isinstance(outcome, Exception):
                log.error("host %s: task %s had failed", self.owner, task.get_name(),
                          exc_info=outcome)
        self._tasks = []
        if self.progress_interval is not None:
            with contextlib.suppress(StoreError):  # where the shards' next holders start
                await self.record_progress()
        await self.postman.close()
        if self._receives and self.shards:
            async with self.leasing:
                await hand_off_all(self)
        await asyncio.gather(*(s.stop() for s in self.shards.values()))
        self.shards.clear()
        with contextlib.suppress(StoreError):
            await self.store.release_leases(self.owner)

    async def acquire(self, *, force: bool = False) -> None:
        """Take the shards free to take (call with `leasing` held)."""
        now = time.monotonic()
        free = [i for i in self.indices if i not in self.shards
                and now - self._lost.get(i, -self.lease_ttl) >= self.lease_ttl]
        if free and self._yielding and not force:
            offered = await self.store.lease_offers(self.owner)
            free = [i for i in free if i in offered]
        if not free:
            return
        taken = await self.store.acquire_leases(self.owner, free, self.lease_ttl, force=force)
        if taken:
            await self._host(taken)

    async def _host(self, taken: Mapping[int, int]) -> None:
        """Start hosting the shards just taken ({shard: epoch}): recover their entities,
        all in one recovery read (`_shard.recover`)."""
        shards = [Shard(Fence(index, self.owner, epoch), self.store, self._definitions,
                        self.clock, self.recovery_window)
                  for index, epoch in sorted(taken.items())]
        for shard in shards:
            shard.postman = self.postman
            self.shards[shard.index] = shard
        try:
            recovered = await recover(shards, self.store, self.clock.time())
        except BaseException:
            # The recovery read failed: hosting them now would strand their running
            # entities. Drop them and keep the leases: the next round takes them again
            # (already ours, same epoch) and recovers them then.
            for shard in shards:
                del self.shards[shard.index]
            await asyncio.gather(*(shard.stop() for shard in shards))
            raise
        for shard in shards:
            lifecycle("lease taken", shard=shard.index, epoch=shard.fence.epoch,
                      owner=self.owner)
            log.info("host %s: took shard %d (epoch %d), %d running entities", self.owner,
                     shard.index, shard.fence.epoch, recovered[shard.index])

    async def _keep_leases(self) -> None:
        """Every third of a lease term renew (`_tick`); between renewals, every
        `REQUEST_POLL`, hand over the shards other hosts asked for, so a request waits
        a fraction of a second rather than up to a third of a lease term."""
        renew_at = time.monotonic() + self.lease_ttl / 3
        while True:
            await asyncio.sleep(min(self.lease_ttl / 3, REQUEST_POLL))
            try:
                async with self.leasing:
                    if time.monotonic() >= renew_at:
                        renew_at = time.monotonic() + self.lease_ttl / 3
                        await self._tick()
                    else:
                        await self._serve_requests()
                self._failures.pop("lease renewal", None)
            except Exception as err:
                await self._backoff("lease renewal", err)

    async def _tick(self) -> None:
        """Renew the leases held, hand over the shards other hosts asked for, take the
        shards free to take (or released to this host)."""
        held = {i: s.fence.epoch for i, s in self.shards.items()}
        kept = await self.store.renew_leases(self.owner, held, self.lease_ttl)
        for index in set(held) - kept:
            log.warning("host %s: lost shard %d; evicting its entities", self.owner, index)
            lifecycle("lease lost", shard=index, owner=self.owner)
            self._lost[index] = time.monotonic()
            await self.shards.pop(index).stop()
        await self._serve_requests()
        await self.acquire()

    async def _serve_requests(self) -> None:
        """Hand over the shards held here that other hosts asked for (`_handoff`)."""
        if not self.shards:
            return
        async with self._polling:
            asked = await self.store.lease_requests(self.owner)
        if asked:
            await self._hand_off(asked)

    async def _plan(self) -> Plan:
        """This round's decision of `_newest.plan`, from the registry and the leases."""
        mine = {name: d.fingerprint for name, d in self._definitions.items()}
        decided = settled(mine, *await self.store.host_builds(self.owner))
        if decided is not None:  # every round but a rolling deploy's: O(1) rows read
            return decided
        return plan(self.owner, mine, await self.store.builds(),
                    await self.store.lease_holders(), limit=moves_per_round(len(self.indices)))

    async def _host_newest(self) -> None:
        """Every third of a lease term: yield to a live host of a newer build, or request
        a few shards of the hosts on older builds (see `_newest`)."""
        pause = self.lease_ttl / 3
        while True:
            await asyncio.sleep(pause)
            pause = self.lease_ttl / 3
            try:
                decided = await self._plan()
                self._yielding = decided.yielding
                if decided.requests and await self.request_shards(decided.requests,
                                                                  timeout=self.lease_ttl):
                    pause = 0  # a slice moved: plan the next one at once
                self._failures.pop("newest build", None)
            except Exception as err:
                await self._backoff("newest build", err)

    async def _housekeep(self) -> None:
        """Fire due durable timers of entities not in memory and due schedules; passivate
        idle ones; purge closed runs past their type's retention."""
        idle_timeouts = [d.idle_timeout for d in self._definitions.values() if d.idle_timeout]
        # Sweeping visits every resident entity: do it a few times per shortest timeout.
        sweep_every = min(max(min(idle_timeouts) / 4, 0.05), 5.0) if idle_timeouts else None
        next_sweep = next_purge = time.monotonic()
        while True:
            await asyncio.sleep(min(self._timer_interval, sweep_every or self._timer_interval))
            try:
                await self.fire_due_timers()
                await self.schedules.fire_due()
                if sweep_every is not None and time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + sweep_every
                    await self.passivate_idle()
                if time.monotonic() >= next_purge:
                    next_purge = time.monotonic() + PURGE_EVERY
                    await self.purge_closed()
                self._failures.pop("housekeeping", None)
            except Exception as err:
                await self._backoff("housekeeping", err)

    async def _keep_progress(self) -> None:
        """Record the shards' progress in the store every `progress_interval`."""
        assert self.progress_interval is not None
        while True:
            await asyncio.sleep(self.progress_interval)
            try:
                await self.record_progress()
                self._failures.pop("progress", None)
            except Exception as err:
                await self._backoff("progress", err)

    async def record_progress(self) -> int:
        """Record in the store the applied watermark and mailbox depth of the resident
        entities whose progress moved since last recorded (see `_progress`); the rows
        written."""
        return await self.progress.record(list(self.shards.values()), self.clock.time())

    async def fire_due_timers(self) -> int:
        """Activate the entities of our shards, not in memory, with a durable timer due."""
        async with self._polling:
            due = await self.store.due_timers(frozenset(self.shards), self.clock.time())
        fired = 0
        for etype, key in due:
            shard = self.shards.get(self.router.shard_of(etype, key))
            if shard is not None and etype in self._definitions \
                    and shard.get(etype, key) is None \
                    and shard.activate(etype, key) is not None:  # None: suspended
                metrics.timer_fired(etype)
                fired += 1
        return fired

    async def purge_closed(self) -> Purged:
        """One retention round: for each type with a `Retention`, purge at most its
        `batch` runs closed longer than `closed_for` ago, deleting at most its `rows`
        rows (one transaction), of the shards held here
        (fenced by their leases: a lost one refuses the round, nothing purged). Judged
        by the wall clock, which stamps a run's `closed_at`."""
        fences = [shard.fence for shard in list(self.shards.values())]
        purged = Purged()
        for etype, definition in self._definitions.items():
            retention = definition.retention
            if retention is None or not fences:
                continue
            try:
                purged += await self.store.purge_closed(
                    etype, time.time() - retention.closed_for, limit=retention.batch,
                    fences=fences, rows=retention.rows)
            except LeaseLostError:
                return purged  # the lease renewal finds out which shard went
        if purged.runs:
            log.debug("host %s: purged %s", self.owner, purged)
        return purged

    def residents(self) -> Iterator[tuple[str, int, int]]:
        """(entity type, resident entities, mailbox depth) of every type held here."""
        totals: dict[str, list[int]] = {}
        for shard in list(self.shards.values()):
            for act in shard.activations():
                t = totals.setdefault(act.entity_type, [0, 0])
                t[0] += 1
                t[1] += act.mailbox_depth
        for etype, (count, depth) in totals.items():
            yield etype, count, depth

    def suspended(self) -> Iterator[tuple[str, int]]:
        """(entity type, suspended runs) held by this host's shards (a gauge to alert on)."""
        totals: dict[str, int] = {}
        for shard in list(self.shards.values()):
            for etype, count in shard.held_runs().items():
                totals[etype] = totals.get(etype, 0) + count
        yield from totals.items()

    async def passivate_idle(self) -> int:
        """Passivate every resident entity idle past its type's `idle_timeout`."""
        passivated = 0
        for shard in list(self.shards.values()):
            passivated += await shard.passivate_idle()
        return passivated

    async def _tail_journal(self) -> None:
        """Deliver entries other processes accepted for our shards (pickup latency ~ interval)."""
        while True:
            try:
                if not await self.store.wait_foreign_commit(self._poll_interval):
                    continue
                before = -1
                while self._cursor != before:  # until a read returns nothing new
                    before = self._cursor
                    owned = frozenset(self.shards)
                    # The read is the host's own round (a connection it finds busy is
                    # waited for, never one more opened); what it routes is not.
                    with housekeeping():
                        self._cursor, entries = await self.store.journal_tail(self._cursor,
                                                                              owned)
                    for entry in entries:
                        shard = self.shards.get(self.router.shard_of(entry.entity_type, entry.key))
                        if shard is not None:
                            shard.route(entry)
                self._failures.pop("journal tail", None)
            except Exception as err:
                await self._backoff("journal tail", err)

    async def _backoff(self, what: str, err: Exception) -> None:
        """A round of one of the host's loops failed: log it and wait before the next,
        longer after each failure in a row (up to a second), so that a store refusing at
        once (down, or closed under the host) is neither hammered nor logged in a spin.
        A store error is the operator's news; anything else is a bug, with its trace."""
        failures = self._failures[what] = self._failures.get(what, 0) + 1
        delay = min(0.01 * 2 ** failures, 1.0)
        if isinstance(err, StoreError):
            log.warning("host %s: %s failed (%s); retrying in %.2fs", self.owner, what, err,
                        delay)
        else:
            log.error("host %s: %s failed; retrying in %.2fs", self.owner, what, delay,
                      exc_info=err)
        await asyncio.sleep(delay)
