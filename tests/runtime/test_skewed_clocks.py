"""A host whose wall clock is off takes no shard from a live holder, and takes a dead or
hung holder's shards within about a lease term.

Lease expiry is never judged by the acquirer's wall clock: on SQLite by the holder's
renewals as the acquirer observes them, on its own monotonic clock (`_sightings`); on
PostgreSQL by the database server's clock. Both hosts are real processes (`hold` of
`tests/support/takeover_worker.py`), the skewed one with its whole wall clock
(`time.time`) 30 s off; the holder is SIGKILLed, or hangs (its event loop blocked in a
call that never returns: it keeps its OS lock or database session, so only expiry
frees its shards).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from procs import TESTS, Worker, spawner, wait_until
from stores import sql

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL and flock")

TTL = 1.0  # both hosts' lease term
SKEW = 30.0  # how far off the skewed host's wall clock is: many lease terms
TAKEOVER = 10.0  # about a lease term and a renewal round, with room for a loaded machine;
#                 a third of SKEW, so a takeover judged on the skewed clock would miss it


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, TESTS / "takeover_worker.py") as start:
        yield start


def leases(db_path: str) -> dict[int, tuple[str, float]]:
    """{shard: (owner, expires_at)} of the held leases."""
    return {s: (o, e) for s, o, e in sql(db_path, "SELECT shard, owner, expires_at FROM "
                                                   "leases WHERE owner <> ''")}


async def start_host(spawn: Callable[..., Worker], tmp_path: Path, db_path: str, name: str,
                     skew: float) -> tuple[Worker, str]:
    ready = tmp_path / f"{name}.ready"
    worker = spawn(name, "hold", db_path, str(ready), str(tmp_path / f"{name}.hang"),
                   str(skew), str(TTL))
    await wait_until(lambda: ready.exists() and ready.read_text() != "", f"{name} hosts",
                     alive=[worker])
    return worker, ready.read_text()


@pytest.mark.parametrize(("skew", "end"), [(SKEW, "killed"), (-SKEW, "hung")],
                         ids=["ahead-killed", "behind-hung"])
async def test_a_host_whose_clock_is_off_takes_no_shard_from_a_live_holder_and_takes_them_all_once_it_is_gone(  # noqa: E501
    db_path: str, tmp_path: Path, spawn: Callable[..., Worker], skew: float, end: str,
) -> None:
    holder, holder_name = await start_host(spawn, tmp_path, db_path, "holder", 0.0)
    assert {o for o, _ in leases(db_path).values()} == {holder_name}
    skewed, skewed_name = await start_host(spawn, tmp_path, db_path, "skewed", skew)

    # Both alive for three lease terms of the holder's renewals (one every third of a
    # term), while the skewed host looks for free shards every third of a term too.
    renewals: set[float] = set()
    while len(renewals) < 9:
        held = leases(db_path)
        assert {o for o, _ in held.values()} == {holder_name}, \
            f"the host whose clock is {skew:+} s off took a live holder's shard"
        assert len(held) == 4
        renewals.add(held[0][1])
        holder.check_alive()
        skewed.check_alive()
        await asyncio.sleep(0.01)

    if end == "killed":
        holder.sigkill()
    else:
        hang = tmp_path / "holder.hang"
        hang.touch()
        await wait_until(lambda: hang.read_text() == "hung", "the holder hangs",
                         alive=[holder])
    gone = time.monotonic()

    def all_taken() -> bool:
        held = leases(db_path)
        return len(held) == 4 and {o for o, _ in held.values()} == {skewed_name}
    await wait_until(all_taken, f"the skewed host takes the {end} holder's shards",
                     timeout=TAKEOVER, alive=[skewed])
    print(f"\n[skew {skew:+} s] the {end} holder's shards taken after "
          f"{time.monotonic() - gone:.2f} s")
