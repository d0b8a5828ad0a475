"""A lease judged by what the acquirer saw of it (`_sightings`, SQLite's expiry): the
take is decided again in the acquiring transaction, against the row as it is there.

The op runs on both engines (PostgreSQL judges expiry by its server's clock and never
passes `stale`, but the op is written once for both); the whole path, a host whose wall
clock is off beside a live or a hung holder, is `tests/runtime/test_skewed_clocks.py`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from acceptances import opened
from corral.persistence import Store
from corral.persistence._ops_leases import AcquireLeasesOp
from corral.persistence._sightings import LeaseSightings, lease_rows
from corral.persistence._store_core import StoreCore

SHARDS = 4


@pytest.fixture
async def holder(db_path: str) -> AsyncIterator[Store]:
    async with opened(db_path, SHARDS) as s:
        yield s


@pytest.fixture
async def acquirer(db_path: str) -> AsyncIterator[StoreCore]:
    async with opened(db_path, SHARDS) as s:
        assert isinstance(s, StoreCore)
        yield s


async def test_a_lease_seen_unchanged_is_taken_only_if_its_row_is_still_the_one_seen(
    holder: Store, acquirer: StoreCore,
) -> None:
    assert await holder.acquire_leases("a", [1, 2], 600.0) == {1: 1, 2: 1}
    seen = await acquirer.query(lease_rows, [1, 2, 3])
    assert seen[1] is not None
    assert seen[1][:2] == ("a", 1)
    assert await holder.renew_leases("a", {1: 1}, 600.0) == {1}  # renewed since seen
    stale = frozenset((s, row) for s, row in seen.items() if row is not None)  # 3 unleased
    taken = await acquirer.write(AcquireLeasesOp("b", (1, 2, 3), 600.0, SHARDS, stale=stale))
    assert taken == {2: 2, 3: 1}


def test_a_row_is_stale_only_once_seen_unchanged_for_a_whole_term() -> None:
    sightings = LeaseSightings()
    row = ("a", 1, 100.0)
    assert sightings.stale({1: row, 2: None}, 0.0) == {}  # first seen now
    assert sightings.stale({1: row, 2: None}, 0.0) == {1: row}  # unchanged since
    assert sightings.stale({1: ("a", 1, 101.0)}, 0.0) == {}  # renewed: seen afresh
    assert sightings.stale({1: ("a", 1, 101.0)}, 3600.0) == {}  # not a whole term yet
