"""`Shard`: the registry and host of every entity in one slice of the key space.

A shard lives on one event loop, which is the serialization point for its entities:
get-or-create of an activation is a dict lookup with no await in between, so it is
atomic. Only the process holding the shard's lease (its `Fence`) runs a `Shard`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence

import corral.metrics as metrics
from corral._errors import CorralError, StoreError
from corral.actors import EntityDefinition
from corral.persistence import (
    AcceptResult,
    EntryKind,
    Fence,
    JournalEntry,
    Store,
    Suspension,
    UpdateOutcome,
)

from .._clock import Clock
from ._activation import Activation
from ._events import lifecycle
from ._outbox import Postman
from ._recovery_window import RecoveryWindow
from ._residence import HeldRun

__all__ = ["Shard", "ShardStopped", "recover"]

log = logging.getLogger("corral.shard")
_Ident = tuple[str, str]
_DEAD_SEQS_CACHED = 4096  # runs whose dead-lettered seqs a shard keeps
_SENDS_RETRY = 1.0  # seconds before reading the undelivered sends again after an error


class ShardStopped(Exception):
    """Set on the update waiters of a shard that stops here (lease lost, host closing):
    the update is still durable, and the next owner applies and records it."""


class Shard:
    """Hosts the activations of one shard for as long as this process holds its lease."""

    def __init__(self, fence: Fence, store: Store,
                 definitions: Mapping[str, EntityDefinition], clock: Clock,
                 window: RecoveryWindow | None = None) -> None:
        self.fence = fence
        self.store = store
        self.clock = clock
        self._definitions = definitions
        self._activations: dict[_Ident, Activation] = {}
        # (etype, key, run_id) -> seqs with a dead letter, read once per run (see _poison).
        self._dead_seqs: OrderedDict[tuple[str, str, int], frozenset[int]] = OrderedDict()
        self._update_waiters: dict[tuple[str, str, str], list[asyncio.Future[UpdateOutcome]]] = {}
        self._later: set[asyncio.TimerHandle] = set()
        self._held: dict[_Ident, HeldRun] = {}  # suspended runs (see `_suspension`)
        self._stopped = False
        # Running entities it cannot host (a type not registered here), and whether its
        # recovery read is done (`backlog`).
        self._unhosted = 0
        self._recovered = False
        self.postman: Postman | None = None  # its host's, which delivers entities' sends
        # Recovery (`recover`): the running entities not activated yet, and the task
        # activating them in the background, as `window` admits them.
        self.window = window or RecoveryWindow()
        self._unrecovered: set[_Ident] = set()
        self._recovering: asyncio.Task[None] | None = None
        self._recovering_sends: asyncio.Task[None] | None = None
        self._recovering_rest: asyncio.Task[None] | None = None
        self._urgent: set[_Ident] = set()  # started by the first recovery read
        self._running = 0  # running entities the second one found
        self._release_hold: Callable[[], None] = lambda: None  # the window's (`recover`)
        # What reached the shard before its suspended runs were known (`recover`): done
        # then, in order, so no message or timer brings a suspended run back early.
        self._early: list[Callable[[], object]] | None = []
        # Set once its recovery reads listed every running entity (or it stopped).
        self._listed = asyncio.Event()

    @property
    def index(self) -> int:
        return self.fence.shard

    def hold_back(self) -> None:
        """Hold the window's other activations back until this shard's urgent ones
        loaded (`take_urgent`; `stop`): called before its recovery reads (`recover`)."""
        self._release_hold = self.window.hold_back()

    def take_urgent(self, suspended: list[Suspension], urgent: list[tuple[str, str]]
                     ) -> None:
        """Know the shard's suspended runs and start its urgent entities, as the first
        recovery read found them (see `recover`); what reached the shard before is done
        now (`_early`). The window's hold is released once they loaded."""
        for s in suspended:  # known before any of them is activated
            self._held[(s.entity_type, s.key)] = HeldRun(s.run_id, s.attempts, s.since)
        early, self._early = self._early or [], None
        for call in early if not self._stopped else ():
            call()
        line = [ident for ident in urgent if ident[0] in self._definitions]
        self._urgent = set(line)
        self._unrecovered.update(line)
        if self._stopped:
            self._release_hold()
            return
        self._recovering = asyncio.create_task(
            self._recovery_line(deque(line), urgent=True), name=f"corral-urgent-{self.index}")

    def take_up(self, running: list[tuple[str, str]]) -> int:
        """Take up the rest of the shard's running entities, as the second recovery read
        found them (see `recover`): how many are running. They load in the background,
        after every shard's urgent ones, as do the sends the previous holder left."""
        rest: list[_Ident] = []
        for etype, key in running:
            if etype not in self._definitions:
                self._unhosted += 1
                log.error("shard %d: entity type %r is not registered in this process; its "
                          "entity %r stays unhosted", self.index, etype, key)
            elif (etype, key) not in self._urgent:
                rest.append((etype, key))
        self._urgent, self._running = set(), len(running)
        self._unrecovered.update(rest)
        self._recovered = True  # its backlog is known once `_unrecovered` is empty
        self._listed.set()
        if self._stopped:
            return len(running)
        self._recovering_rest = asyncio.create_task(
            self._recovery_line(deque(rest), urgent=False),
            name=f"corral-recover-{self.index}")
        if self.postman is not None:
            self._recovering_sends = asyncio.create_task(
                self._recover_sends(self.postman), name=f"corral-recover-sends-{self.index}")
        return len(running)

    async def _recover_sends(self, postman: Postman) -> None:
        """Deliver the sends the shard's previous holder wrote and did not deliver, once
        the urgent activations of the host's recoveries loaded (their reads go first on
        the store; a handler's send is delivered at once, the postman reads the whole
        outbox of its sender), retried on a store error until the shard stops (its next
        holder delivers them then)."""
        await self.window.wait_urgent_loaded()
        while not self._stopped:
            try:
                await postman.recover(self.fence)
                return
            except StoreError as err:
                log.warning("shard %d: reading its undelivered sends failed (%s); retrying "
                            "in %.1fs", self.index, err, _SENDS_RETRY)
                await asyncio.sleep(_SENDS_RETRY)

    async def _recovery_line(self, line: deque[_Ident], *, urgent: bool) -> None:
        """Activate the entities of `line` in order, as the window admits them (a few
        workers per shard; the window bounds them host-wide), skipping those that were
        activated on demand meanwhile; the urgent line releases the window's hold once
        they all loaded."""
        async def worker() -> None:
            while line and not self._stopped:
                await self._recover_one(line.popleft(), urgent)
        try:
            await asyncio.gather(*(worker() for _ in range(min(self.window.size, len(line)))))
        finally:
            if urgent:
                self._release_hold()
        if not urgent and not self._stopped:
            lifecycle("shard recovered", shard=self.index, epoch=self.fence.epoch,
                      running=self._running)

    async def _recover_one(self, ident: _Ident, urgent: bool) -> None:
        """Activate the entity of the shard's recovery when the window admits it, and
        wait until it loaded (unless activated on demand meanwhile)."""
        if ident not in self._unrecovered:
            return
        async with self.window.slot(urgent=urgent):
            if self._stopped or ident not in self._unrecovered:
                return  # stopped, or activated on demand while it waited for a slot
            act = self.activate(*ident)
            self._unrecovered.discard(ident)  # None: suspended, back on its own
            if act is not None:
                await act.wait_settled()

    @property
    def recovering(self) -> int:
        """Running entities of the shard's recovery not activated yet."""
        return len(self._unrecovered)

    def backlog(self) -> dict[str, tuple[int, int, float | None]] | None:
        """The shard's backlog by type, from its activations: type -> (messages behind,
        entities behind, oldest unapplied accepted_at) of the types with some; None
        while some running entity's backlog is not known here: before its recovery
        read them or while some are not activated yet (`recover` activates them in the
        background), a type not registered here, a suspended run waiting for its next
        attempt (its entries stay in the journal), an activation not built yet or
        reading its journal."""
        if not self._recovered or self._unrecovered or self._unhosted \
                or any(held.waiting for held in self._held.values()):
            return None
        totals: dict[str, tuple[int, int, float | None]] = {}
        for act in self._activations.values():
            if act.is_finished:
                continue
            known = act.backlog()
            if known is None:
                return None
            behind, oldest = known
            if behind:
                messages, entities, first = totals.get(act.entity_type, (0, 0, None))
                totals[act.entity_type] = (messages + behind, entities + 1, oldest
                                           if first is None or (oldest is not None
                                                                and oldest < first) else first)
        return totals

    async def stop(self) -> None:
        self._stopped = True
        self._early = None  # durable: the shard's next holder reads them
        self._listed.set()
        recovering = [t for t in (self._recovering, self._recovering_rest,
                                  self._recovering_sends) if t is not None]
        for task in recovering:  # no more background activations: they'd stop
            task.cancel()
        await asyncio.gather(*recovering, return_exceptions=True)
        self._recovering = self._recovering_rest = self._recovering_sends = None
        self._release_hold()  # the line may have been cancelled before it ran
        self._unrecovered.clear()
        for handle in self._later:
            handle.cancel()
        self._later.clear()
        for held in self._held.values():
            if held.handle is not None:
                held.handle.cancel()
        self._held.clear()
        acts = list(self._activations.values())
        self._activations.clear()
        await asyncio.gather(*(a.stop() for a in acts))
        for waiters in self._update_waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_exception(ShardStopped(f"shard {self.index} stopped here"))
        self._update_waiters.clear()

    # -- routing entries to activations ----------------------------------------------

    def route(self, entry: JournalEntry) -> None:
        """Queue an accepted journal entry in its entity's activation, activating the
        entity if needed (`Activation.queue`: never applied here).

        A suspended run's entries stay in the journal until its next attempt (they never
        bring it back early); a `RESUME` or `TERMINATE` entry brings it back at once.
        """
        if self._early is not None:
            self._early.append(lambda: self.route(entry))
            return
        ident = (entry.entity_type, entry.key)
        held = self._held.get(ident)
        if held is not None and held.waiting:
            if entry.run_id > held.run_id:
                self.release(*ident, held.run_id)  # a newer run: the suspended one closed
            elif entry.kind is EntryKind.RESUME or entry.kind is EntryKind.TERMINATE:
                self.resume(*ident)
            else:
                return
        act = self._activations.get(ident)
        if act is None or act.is_finished or (act.is_ready and entry.run_id > act.run_id):
            act = self._get_or_create(*ident, force_new=True)
        act.queue(entry)

    def take_accepted(self, result: AcceptResult, start_input: str | None) -> None:
        """Host what this process just accepted for this shard: the run it started
        (`start_input`: its start), or the new entry (a duplicate: nothing)."""
        if result.started:
            self.route_started(result.entry, start_input)
        elif not result.duplicate:
            self.route(result.entry)

    def route_started(self, entry: JournalEntry, start_input: str | None) -> None:
        """Host a run this process just started, from its first entry (no store read)."""
        if self._early is not None:
            self._early.append(lambda: self.route_started(entry, start_input))
            return
        ident = (entry.entity_type, entry.key)
        held = self._held.get(ident)
        if held is not None:
            self.release(*ident, held.run_id)  # that run closed, or this one is new
        previous = self._activations.get(ident)
        if previous is not None and not previous.is_finished and (
                previous.run_id >= entry.run_id or not previous.is_ready):
            # Already loading it from the store: the journal tail may hand over an entry
            # this process committed before the accept that committed it gets here. A
            # loading activation does not know its run yet (run id 0); it reads the
            # latest, and forwards entries of a newer run to a successor itself.
            previous.queue(entry)
            return
        self._unrecovered.discard(ident)
        self._activations[ident] = Activation(
            self._residence(*ident), previous, entry, start_input)

    def route_to_successor(self, act: Activation, entry: JournalEntry) -> None:
        """`act` met an entry of a newer run: the newer run gets its own activation."""
        ident = (act.entity_type, act.key)
        if self._activations.get(ident) is act:
            self._get_or_create(*ident, force_new=True)
        self._activations[ident].queue(entry)

    def _get_or_create(self, etype: str, key: str, *, force_new: bool = False) -> Activation:
        ident = (etype, key)
        act = self._activations.get(ident)
        if act is None or force_new or act.is_finished:
            self._unrecovered.discard(ident)
            act = Activation(self._residence(etype, key), previous=act)
            self._activations[ident] = act
        return act

    async def activate_for_query(self, etype: str, key: str, *, wake: bool
                                 ) -> Activation | None:
        """The entity's activation for a query, once the shard's recovery listed its
        running entities: one still waiting for its turn in the background is activated
        now, a passivated one only if `wake`. (Answered by a replica meanwhile, a query
        replayed the entity's handlers beside its activation and missed its dead
        letters.)"""
        await self._listed.wait()
        if wake or (etype, key) in self._unrecovered:
            return self.activate(etype, key)
        return self._activations.get((etype, key))

    def activate(self, etype: str, key: str) -> Activation | None:
        """Bring the entity into memory (a due timer, the next run after continue-as-new);
        None while it is suspended and waits for its next attempt, or while the shard
        has not read its suspended runs yet (it is activated once they are known)."""
        if self._early is not None:
            self._early.append(lambda: self.activate(etype, key))
            return None
        held = self._held.get((etype, key))
        if held is not None and held.waiting:
            return None
        return self._get_or_create(etype, key)

    # -- suspended runs ------------------------------------------------------------------

    def suspended(self, etype: str, key: str) -> HeldRun | None:
        """The entity's suspended run, if it has one (waiting, or being retried)."""
        return self._held.get((etype, key))

    def hold(self, record: Suspension, delay: float) -> None:
        """Keep the (evicted) entity out of memory for `delay` seconds, then retry it."""
        ident = (record.entity_type, record.key)
        old = self._held.get(ident)
        if old is not None and old.handle is not None:
            old.handle.cancel()
        held = self._held[ident] = HeldRun(record.run_id, record.attempts, record.since)
        if not self._stopped:
            held.handle = asyncio.get_running_loop().call_later(delay, self.resume, *ident)

    def resume(self, etype: str, key: str) -> bool:
        """Retry a suspended run now (its next attempt is due, or `EntityRef.resume()`);
        whether it was waiting. Its note stays until the attempt gets past the point."""
        held = self._held.get((etype, key))
        if held is None or held.handle is None:
            return False
        held.handle.cancel()
        held.handle = None
        if not self._stopped:
            self._get_or_create(etype, key)
        return True

    def release(self, etype: str, key: str, run_id: int) -> None:
        """Forget the suspension of run `run_id` (or an older one) of the entity."""
        held = self._held.get((etype, key))
        if held is not None and held.run_id <= run_id:
            if held.handle is not None:
                held.handle.cancel()
            del self._held[(etype, key)]

    def held_runs(self) -> dict[str, int]:
        """Suspended runs held here, by entity type."""
        counts: dict[str, int] = {}
        for etype, _ in self._held:
            counts[etype] = counts.get(etype, 0) + 1
        return counts

    def activate_later(self, etype: str, key: str, delay: float) -> None:
        """Activate the entity after `delay` seconds unless it is in memory by then (an
        activation evicted by a store failure, whose run is still running)."""
        def fire() -> None:
            self._later.discard(handle)
            if not self._stopped and self.get(etype, key) is None:
                self.activate(etype, key)
        handle = asyncio.get_running_loop().call_later(delay, fire)
        self._later.add(handle)

    async def passivate_idle(self) -> int:
        """Passivate every activation idle for longer than its type's `idle_timeout`."""
        idle = [a for a in self._activations.values()
                if a.definition.idle_timeout is not None
                and a.idle_for >= a.definition.idle_timeout]
        for act in idle:
            await act.passivate()
        return len(idle)

    def resident(self) -> list[Activation]:
        """The activations in memory."""
        return list(self._activations.values())

    def get(self, etype: str, key: str) -> Activation | None:
        act = self._activations.get((etype, key))
        return None if act is None or act.is_finished else act

    def applied_seq(self, etype: str, key: str) -> int | None:
        """The applied seq of this shard's live activation of the entity (None: none);
        a bounded type's backlog is counted from it (`Entity.max_backlog`)."""
        act = self.get(etype, key)
        return None if act is None else act.applied_seq

    def known_applied(self, etype: str, key: str) -> int | None:
        """The applied seq this shard knows for the entity: its live activation's; 0
        when it has none and is not about to load it (passivated, closed or suspended:
        the latest snapshot tells the rest); None while its recovery has not reached it
        (a schedule waits rather than guess whether its previous tick is applied)."""
        applied = self.applied_seq(etype, key)
        if applied is not None:
            return applied
        if not self._recovered or (etype, key) in self._unrecovered:
            return 0 if (etype, key) in self._held else None
        return 0

    def activations(self) -> list[Activation]:
        """The live activations (loading or ready)."""
        return [a for a in self._activations.values() if not a.is_finished]

    def forget(self, act: Activation) -> None:
        ident = (act.entity_type, act.key)
        if self._activations.get(ident) is act:
            del self._activations[ident]

    def __len__(self) -> int:
        return len(self._activations)

    # -- services for activations ------------------------------------------------------

    def _residence(self, etype: str, key: str) -> ShardResidence:
        return ShardResidence(self, self._definitions[etype], key)

    async def record_update(self, home: ShardResidence, entry: JournalEntry,
                            outcome: UpdateOutcome, *, replaying: bool) -> None:
        """Record an applied update's outcome and answer its callers waiting here."""
        if replaying:  # the first application may have recorded it before a crash
            recorded = await self.store.update_outcome(home.entity_type, home.key,
                                                       entry.message_id)
            if recorded is not None:
                outcome = recorded
            else:
                await self.store.record_update(self.fence, home.entity_type, home.key,
                                               entry.message_id, outcome)
        else:
            await self.store.record_update(self.fence, home.entity_type, home.key,
                                           entry.message_id, outcome)
        for fut in self._update_waiters.pop((home.entity_type, home.key, entry.message_id), ()):
            if not fut.done():
                fut.set_result(outcome)

    def wait_update(self, etype: str, key: str, message_id: str
                    ) -> asyncio.Future[UpdateOutcome]:
        """A future resolved when this shard applies the update `message_id`."""
        fut: asyncio.Future[UpdateOutcome] = asyncio.get_running_loop().create_future()
        self._update_waiters.setdefault((etype, key, message_id), []).append(fut)
        return fut

    def fail_waiters(self, etype: str, key: str, run_id: int, error: type[CorralError],
                     message: str) -> None:
        """Fail every update waiting on the entity: each waiter gets its own `error`
        (never one exception object raised in several tasks), naming its update."""
        for ident in [w for w in self._update_waiters if w[:2] == (etype, key)]:
            for fut in self._update_waiters.pop(ident):
                if not fut.done():
                    fut.set_exception(error(
                        f"{message}; update {ident[2]!r} was not applied",
                        entity_type=etype, key=key, run_id=run_id, message_id=ident[2]))

    async def dead_letter_seqs(self, etype: str, key: str, run_id: int) -> frozenset[int]:
        """The run's dead-lettered seqs: read once per lease epoch (only the lease
        holder writes dead letters, and it adds each one it writes)."""
        ident = (etype, key, run_id)
        seqs = self._dead_seqs.get(ident)
        if seqs is None:
            seqs = self._dead_seqs[ident] = await self.store.dead_letter_seqs(*ident)
            while len(self._dead_seqs) > _DEAD_SEQS_CACHED:
                self._dead_seqs.popitem(last=False)
        else:
            self._dead_seqs.move_to_end(ident)
        return seqs

    async def record_dead_letter(self, entry: JournalEntry, *, error: str, traceback: str,
                                 attempts: int) -> None:
        """Move `entry` to the dead letters (fenced) and add it to the cached seqs."""
        dead_id = await self.store.record_dead_letter(
            self.fence, entry, error=error, traceback=traceback, attempts=attempts,
            failed_at=self.clock.time())
        metrics.dead_lettered(entry.entity_type)
        lifecycle("dead-lettered", entry.entity_type, entry.key, entry.run_id, seq=entry.seq,
                  message_id=entry.message_id, dead_letter=dead_id)
        ident = (entry.entity_type, entry.key, entry.run_id)
        if ident in self._dead_seqs:
            self._dead_seqs[ident] = self._dead_seqs[ident] | {entry.seq}
        log.error("%s %r: %s %r (seq %d) moved to dead letter %d after %d attempts: %s\n%s",
                  entry.entity_type, entry.key, entry.kind.value, entry.name, entry.seq,
                  dead_id, attempts, error, traceback)


async def recover(shards: Sequence[Shard], store: Store, now: float) -> dict[int, int]:
    """Take up the running entities of `shards`, taken together (a restart, a takeover,
    a hand-off): {shard: how many}. Returns once the urgent ones are started and the
    rest are in line.

    Two reads for all of them, each on one connection (a seek per shard), first side by
    side: their suspended runs and their urgent entities (a backlog, a timer due, a step
    recorded: `persistence._reads.URGENT`), few rows however many are running. Those
    start at once; then the read of every running entity (O(running): ~50 ms of rows at
    10,000 on PostgreSQL, off the first message's path) lines up the rest, which load
    after every shard's urgent ones, never more at once than the host's
    `RecoveryWindow` admits. Two reads per shard had put 32 at once on a PostgreSQL pool
    still opening its connections (16 shards: ~60 ms before the first activation could
    read). An entity is also activated on demand (a message routed to it, a due timer,
    a query), but not before the suspensions are known. Suspended runs are among them:
    this host may run the fixed code; their count of attempts goes on from the store's.
    On a failed read the caller stops the shards (that releases their holds).
    """
    for shard in shards:
        shard.hold_back()
    indexes = [shard.index for shard in shards]
    suspended, urgent = await asyncio.gather(store.suspensions(indexes),
                                             store.urgent_entities(indexes, now))
    for shard in shards:
        shard.take_urgent(suspended[shard.index], urgent[shard.index])
    running = await store.running_entities(indexes)
    return {shard.index: shard.take_up(running[shard.index]) for shard in shards}


class ShardResidence:
    """The `Residence` a shard gives one entity: the shard, bound to its definition and
    key once (an activation's only way to its host)."""

    __slots__ = ("_shard", "clock", "definition", "entity_type", "fence", "key", "store")

    def __init__(self, shard: Shard, definition: EntityDefinition, key: str) -> None:
        self._shard = shard
        self.definition = definition
        self.entity_type = definition.name
        self.key = key
        self.store, self.fence, self.clock = shard.store, shard.fence, shard.clock

    def route(self, entry: JournalEntry) -> None:
        self._shard.route(entry)

    def route_to_successor(self, act: object, entry: JournalEntry) -> None:
        assert isinstance(act, Activation)
        self._shard.route_to_successor(act, entry)

    def activate(self) -> None:
        self._shard.activate(self.entity_type, self.key)

    def activate_later(self, delay: float) -> None:
        self._shard.activate_later(self.entity_type, self.key, delay)

    def forget(self, act: object) -> None:
        assert isinstance(act, Activation)
        self._shard.forget(act)

    def suspended(self) -> HeldRun | None:
        return self._shard.suspended(self.entity_type, self.key)

    def hold(self, record: Suspension, delay: float) -> None:
        self._shard.hold(record, delay)

    def post(self, run_id: int) -> None:
        if self._shard.postman is not None:
            self._shard.postman.post(self._shard.fence, self.entity_type, self.key, run_id)

    def release(self, run_id: int) -> None:
        self._shard.release(self.entity_type, self.key, run_id)

    async def record_update(self, entry: JournalEntry, outcome: UpdateOutcome, *,
                            replaying: bool) -> None:
        await self._shard.record_update(self, entry, outcome, replaying=replaying)

    async def record_dead_letter(self, entry: JournalEntry, *, error: str, traceback: str,
                                 attempts: int) -> None:
        await self._shard.record_dead_letter(entry, error=error, traceback=traceback,
                                             attempts=attempts)

    async def dead_letter_seqs(self, run_id: int) -> frozenset[int]:
        return await self._shard.dead_letter_seqs(self.entity_type, self.key, run_id)

    def fail_waiters(self, run_id: int, error: type[CorralError], message: str) -> None:
        self._shard.fail_waiters(self.entity_type, self.key, run_id, error, message)
