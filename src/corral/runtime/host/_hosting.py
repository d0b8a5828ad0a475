"""One cluster hosts a store: a host claims it for its cluster before taking a lease.

Hosts of two clusters on one store (two Ray instances, or local hosts beside a Ray
deployment) would take the same shards' leases from each other: Ray host actors take
theirs at once (`takeover`, to fence out a restarted predecessor), local hosts take
the ones that lapse or are handed to them. So every host process holds a claim in the
store (`persistence/_hosting`) while it hosts, and a host of another cluster is refused
with `StoreHostedElsewhereError` before it takes a lease or, on Ray, before its client
creates an actor (`check_hosting`). Pure clients (`host=False`) claim nothing: they
only accept, which is open to every process.

Clusters: `"local"` (every local host, on any machine: they share through leases) or
`"ray:<session>"` (one Ray instance, `ray._env.ray_cluster`).

The host's half of hosting; the store's half (the claims and their ops) is
`persistence/_hosting`, hence the shared name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time

from corral._errors import StoreError, StoreHostedElsewhereError
from corral.persistence import HostingClaim, Store
from corral.persistence._hosting import MIGRATION_CLUSTER

from .._build_registration import process_id

__all__ = ["LOCAL", "RAY_HOLDER", "HostingKeeper", "check_hosting", "local_holder", "refusal"]

log = logging.getLogger("corral.hosting")

LOCAL = "local"
"""The cluster of every local host."""


def local_holder() -> str:
    """How a local host describes itself in its claim."""
    return f"local host on {socket.gethostname()}, pid {os.getpid()}"


RAY_HOLDER = "Ray instance at "
"""How a Ray host's description begins; its GCS address follows."""


def _ray_address(claim: HostingClaim) -> str | None:
    """The GCS address of a Ray host's Ray instance (None for a local host)."""
    if not claim.holder.startswith(RAY_HOLDER):
        return None
    return claim.holder[len(RAY_HOLDER):].split(" ", 1)[0]


def refusal(claim: HostingClaim, cluster: str) -> StoreHostedElsewhereError:
    """The error refusing a host of `cluster` because of `claim` (another cluster's),
    with the fix for this pair of clusters."""
    address = _ray_address(claim)
    lapse = time.strftime("%H:%M:%S", time.localtime(claim.expires_at))
    if claim.cluster == MIGRATION_CLUSTER:
        fix = ("a store is not hosted while it is copied (`corral migrate`, `corral "
               "restore`): wait for the copy to end, or complete an interrupted one with "
               "--resume, then open the store it was copied to (or, to roll back, the "
               "one it was copied from)")
    elif address is None:
        fix = ("close those local hosts (or open them with host=False: pure clients "
               "may send beside a Ray deployment) before hosting it on Ray")
    elif cluster == LOCAL:
        fix = (f"open this runtime with backend='ray', address={address!r} to use that "
               f"deployment, or with host=False to only send (its actors apply)")
    else:
        fix = (f"connect this process to that Ray instance: open_runtime(..., "
               f"address={address!r}) or RAY_ADDRESS={address}. A Ray instance that "
               f"a driver's ray.init() started ends with that driver: start one with "
               f"`ray start --head` once and open every runtime with address='auto'")
    return StoreHostedElsewhereError(
        f"the store is hosted by another cluster: {claim.holder}. Hosts of two "
        f"clusters would take its shards from each other, so this one is refused; "
        f"{fix}. (That claim lapses at {lapse} unless its hosts renew it: they do "
        f"while they live.)",
        holder=claim.holder, cluster=claim.cluster, address=address,
        expires_at=claim.expires_at)


async def check_hosting(store: Store, cluster: str) -> None:
    """Refuse (a read: nothing is written) when a live host of another cluster holds
    `store`: what a client checks before it starts hosts of `cluster`.

    Raises:
        StoreHostedElsewhereError: naming the other cluster's host and the fix.
    """
    for claim in await store.hosting_claims():
        if claim.cluster != cluster:
            raise refusal(claim, cluster)


class HostingKeeper:
    """A host process's claim on its store (see the module docstring): taken by `open`
    (refused if another cluster holds the store), renewed every quarter of `ttl`, and
    released by `close`.

    Example:
        keeper = HostingKeeper(store, cluster=LOCAL, holder=local_holder(), ttl=20.0)
        await keeper.open()  # before the host takes a lease
        ...
        await keeper.close()  # after it released them
    """

    def __init__(self, store: Store, *, cluster: str, holder: str, ttl: float) -> None:
        self.store = store
        self.cluster = cluster
        self.holder = holder
        self.process = process_id()
        self._ttl = ttl
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Claim the store for this cluster and keep the claim live.

        Raises:
            StoreHostedElsewhereError: a live host of another cluster holds it; nothing
                was written.
        """
        other = await self._claim()
        if other is not None:
            raise refusal(other, self.cluster)
        self._task = asyncio.create_task(self._keep(), name="corral-hosting")

    async def _claim(self) -> HostingClaim | None:
        return await self.store.claim_hosting(self.process, self.cluster, self.holder,
                                              ttl=self._ttl)

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self._ttl / 4)
            try:
                other = await self._claim()
            except StoreError as err:  # the next round tries again; ttl covers three
                log.warning("%s: hosting claim not renewed (%s)", self.holder, err)
                continue
            if other is not None:  # ours lapsed (a long outage) and another took over
                log.error("%s", refusal(other, self.cluster))

    async def close(self) -> None:
        """Stop renewing and release the claim (a store outage leaves it to lapse)."""
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        with contextlib.suppress(StoreError):
            await self.store.release_hosting(self.process)
