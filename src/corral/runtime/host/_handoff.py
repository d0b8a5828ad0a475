"""Graceful shard hand-off between `LocalHost`s (the store's side: `_ops_handoff`).

A receiver *requests* shards (`request_shards`); each holder sees the request within
`_host.REQUEST_POLL` (a quarter second) and hands the shard over (`hand_off`): it
stops taking work for the shard (new entries wait in the store's journal), stops the
shard's activations (their writes already queued commit before the release, which is
queued after them), and releases the lease to the requester, which takes it at the
next epoch as soon as it sees the offer (it polls for it while it waits) and recovers
the shard from the store.
A host closing gracefully hands its shards to the other live hosts the same way
(`hand_off_all`); they take them on their next renewal tick.

What callers see meanwhile: sends are accepted by the store as always (any process
accepts; the new holder applies them); an update waiting on the old holder is answered
by the new one (its outcome is durable); a query is answered from the store's
snapshot and journal while no process hosts the entity. Nothing fails for the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from typing import Protocol

from corral._errors import InvalidArgumentError, StoreError
from corral.persistence import Store

from ._events import lifecycle
from ._shard import Shard

__all__ = ["Holder", "hand_off", "hand_off_all", "request_shards"]


class Holder(Protocol):
    """What a hand-off uses of a `LocalHost` (which calls in here)."""

    store: Store
    owner: str
    shards: dict[int, Shard]
    lease_ttl: float
    indices: tuple[int, ...]
    leasing: asyncio.Lock

    async def acquire(self, *, force: bool = False) -> None: ...

_OFFER_POLL = 0.005  # seconds between a requester's reads for its offers (a short pause)


async def hand_off(host: Holder, heirs: Mapping[int, str]) -> set[int]:
    """Drain the shards of `heirs` held here and release each to its heir, in one
    transaction; the shards handed (not those this host no longer held, or was fenced
    out of meanwhile). Call with `host.leasing` held."""
    shards = {i: host.shards.pop(i) for i in sorted(heirs) if i in host.shards}
    if not shards:
        return set()
    stopped_at = time.time()
    await asyncio.gather(*(s.stop() for s in shards.values()))  # entries wait in the journal
    handed = await host.store.hand_off_leases(
        {shard.fence: heirs[index] for index, shard in shards.items()}, host.lease_ttl)
    for index, shard in shards.items():
        lifecycle("lease handed off", shard=index, epoch=shard.fence.epoch,
                  owner=host.owner, heir=heirs[index], handed=index in handed,
                  stopped_at=stopped_at)
    return handed


async def hand_off_all(host: Holder) -> set[int]:
    """Hand every shard held here to the other live hosts, in turn; the shards handed.
    None alive (or the store unreachable): none handed, the caller releases them."""
    with contextlib.suppress(StoreError):
        alive = await host.store.live_hosts(host.owner)
        if alive:
            return await hand_off(host, {index: alive[n % len(alive)]
                                         for n, index in enumerate(sorted(host.shards))})
    return set()


async def request_shards(host: Holder, indexes: Iterable[int], *,
                         timeout: float | None = None) -> dict[int, int]:
    """Ask the holders of `indexes` to hand them here and wait until they have, or
    until `timeout` (default: two lease terms); {shard: epoch} of those held here now.

    The request is renewed every third of a lease term while waiting, so it expires
    one lease term after this host stops waiting (or dies). Free shards are taken too.

    Raises:
        InvalidArgumentError: a shard this host may not hold.
    """
    asked = sorted(set(indexes))
    beyond = [i for i in asked if i not in host.indices]
    if beyond:
        raise InvalidArgumentError(f"shards {beyond} are not among those this host may "
                                   f"hold ({len(host.indices)} shards from {host.indices[:1]})")
    deadline = time.monotonic() + (2 * host.lease_ttl if timeout is None else timeout)
    renew_at = 0.0
    while (wanted := set(asked) - set(host.shards)) and time.monotonic() < deadline:
        renew = time.monotonic() >= renew_at
        if renew:
            await host.store.request_leases(host.owner, sorted(wanted), host.lease_ttl)
            renew_at = time.monotonic() + host.lease_ttl / 3
        if renew or await host.store.lease_offers(host.owner) & wanted:
            async with host.leasing:
                await host.acquire()
        else:
            await asyncio.sleep(_OFFER_POLL)
    return {i: host.shards[i].fence.epoch for i in asked if i in host.shards}
