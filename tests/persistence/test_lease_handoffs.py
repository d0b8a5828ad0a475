"""The store's side of a graceful shard hand-off (`persistence/_ops_handoff`), on both
engines, in the style of the store contract (`test_store_contract.py`): a requester asks,
the holder's tick sees the request, the holder releases to it, the heir takes the shard
at the next epoch and nobody else does until the reservation ends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import corral
from acceptances import opened
from corral.persistence import Fence, Store
from procs import wait_until

SHARDS = 16


@pytest.fixture
async def store(db_path: str) -> AsyncIterator[Store]:
    async with opened(db_path, SHARDS) as s:
        yield s


@pytest.fixture
async def other(db_path: str) -> AsyncIterator[Store]:
    """A second store on the same location: another process's."""
    async with opened(db_path, SHARDS) as s:
        yield s


async def test_a_requested_shard_is_handed_to_the_requester_at_the_next_epoch_and_to_no_one_else(
    store: Store, other: Store,
) -> None:
    assert await store.acquire_leases("a", [1, 2], 600.0) == {1: 1, 2: 1}
    assert await store.host_tick("a", 600.0) == {}
    await other.request_leases("b", [1], 600.0)
    assert await store.host_tick("a", 600.0) == {1: "b"}
    assert await other.lease_offers("b") == set()  # asked, not yet released
    assert await store.hand_off_leases({Fence(1, "a", 1): "b"}, 600.0) == {1}
    assert await store.host_tick("a", 600.0) == {}  # the request is met
    assert await other.lease_offers("b") == {1}
    # The holder's writes are refused from now on, and it does not take the shard back;
    # nor does a third host, though the shard's lock is free now: it is reserved for b.
    with pytest.raises(corral.LeaseLostError):
        await store.set_timer(Fence(1, "a", 1), "E", "k", 1, "t", 1.0)
    assert await store.renew_leases("a", {1: 1, 2: 1}, 600.0) == {2}
    assert await store.acquire_leases("a", [1], 600.0) == {}
    assert await other.acquire_leases("c", [1], 600.0) == {}
    assert await other.acquire_leases("b", [1, 2], 600.0) == {1: 2}  # 2 is a's, live
    assert await other.lease_offers("b") == set()
    await other.set_timer(Fence(1, "b", 2), "E", "k", 1, "t", 1.0)
    # A stale fence hands nothing; the others of the same call are handed.
    assert await store.hand_off_leases({Fence(1, "a", 1): "c", Fence(2, "a", 1): "c"},
                                       600.0) == {2}
    assert await store.acquire_leases("c", [1, 2], 600.0) == {2: 2}


async def test_a_request_of_a_requester_that_stopped_renewing_it_expires(
    store: Store, other: Store,
) -> None:
    assert await store.acquire_leases("a", [3], 600.0) == {3: 1}
    await other.request_leases("b", [3], 0.3)

    async def expired() -> bool:
        return await store.host_tick("a", 600.0) == {}
    assert not await expired()
    await wait_until(expired, "b's request expires")


async def test_a_shard_released_to_an_heir_that_never_takes_it_is_anyones_after_one_term(
    store: Store, other: Store,
) -> None:
    assert await store.acquire_leases("a", [4], 600.0) == {4: 1}
    await other.request_leases("b", [4], 600.0)
    assert await store.hand_off_leases({Fence(4, "a", 1): "b"}, 0.3) == {4}
    await other.request_leases("c", [4], 600.0)  # released already: c's ask is ignored
    assert await store.host_tick("a", 600.0) == {}

    async def taken() -> bool:
        return await other.acquire_leases("c", [4], 600.0) == {4: 2}
    assert not await taken()
    await wait_until(taken, "b's reservation ends")


async def test_hosts_alive_to_receive_shards_are_those_ticking_until_they_go(
    store: Store, other: Store,
) -> None:
    await store.host_tick("a", 600.0)
    await other.host_tick("b", 600.0)
    await other.host_tick("pinned", 600.0, alive=False)  # receives no hand-offs
    await other.host_tick("brief", 0.3)
    assert await other.live_hosts("x") == ["a", "b", "brief"]

    async def brief_gone() -> bool:
        return await other.live_hosts("x") == ["a", "b"]
    await wait_until(brief_gone, "brief's presence expires")
    assert await store.live_hosts("a") == ["b"]
    assert await other.live_hosts("x") == ["b"]  # a went when it asked: it is closing
    await other.release_leases("b")
    assert await store.live_hosts("x") == []


async def test_a_host_asking_for_a_shard_it_holds_asks_for_nothing(store: Store) -> None:
    assert await store.acquire_leases("a", [5], 600.0) == {5: 1}
    await store.request_leases("a", [5], 600.0)
    assert await store.host_tick("a", 600.0) == {}


async def test_a_shard_handed_over_is_locked_by_its_heir_at_once_so_no_third_host_takes_it(
    store: Store, other: Store, db_path: str,
) -> None:
    """The holder drops the shard's OS or advisory lock when it hands the shard over; the
    heir takes the lock with the lease, not at its next renewal: a host starting in
    between would find the lock free and take the shard as if its holder had died."""
    assert await store.acquire_leases("a", [6], 600.0) == {6: 1}
    await other.request_leases("b", [6], 600.0)
    assert await store.hand_off_leases({Fence(6, "a", 1): "b"}, 600.0) == {6}
    assert await other.acquire_leases("b", [6], 600.0) == {6: 2}
    async with opened(db_path, SHARDS) as third:
        assert await third.acquire_leases("c", [6], 600.0) == {}
