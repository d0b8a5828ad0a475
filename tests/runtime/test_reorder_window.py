"""A reorder window (`corral.signal(Reply, order_by="at", hold=...)`): `run()` takes
mailbox payloads in the order of a payload field, each held `hold` seconds after its
acceptance; one ordered before a payload already released is delivered flagged `late`,
never dropped; held payloads survive a SIGKILL and release in the same order."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import corral
import corral.testing
from procs import TESTS, Worker, spawner, wait_until
from window_entities import HOLD, Inbox, Reply
from workers import wait_for_file


async def _send(ref: corral.EntityRef, n: int, at: float) -> None:
    await ref.signal_with_start(Inbox.replies, Reply(n=n, at=at), start=None,
                                message_id=f"r{n}")


async def test_replies_within_the_window_reach_run_in_field_order_and_a_later_one_is_late(
) -> None:
    async with corral.testing.open_test_runtime(entities=[Inbox]) as env:
        ref = env.runtime.ref(Inbox, "t")
        for n, at in ((3, 30.0), (1, 10.0), (2, 20.0)):  # arrival order 3, 1, 2
            await _send(ref, n, at)
        await env.advance(HOLD * 0.9)
        assert (await ref.query(Inbox.seen)).order == []  # all still held
        await env.advance(HOLD * 0.2)
        assert (await ref.query(Inbox.seen)).order == [(1, False), (2, False), (3, False)]
        # Beyond the window: 2.5 came after 3 was released, so it is late, not dropped;
        # 40 is in order.
        await _send(ref, 25, 25.0)
        await _send(ref, 4, 40.0)
        await env.advance(HOLD * 1.1)
        assert (await ref.query(Inbox.seen)).order == [
            (1, False), (2, False), (3, False), (25, True), (4, False)]


async def test_a_payload_released_by_a_later_ones_hold_comes_out_first() -> None:
    """A payload accepted later but ordered first is released with the earlier one
    whose hold ran out: held payloads are released up to the highest due key."""
    async with corral.testing.open_test_runtime(entities=[Inbox]) as env:
        ref = env.runtime.ref(Inbox, "t")
        await _send(ref, 2, 20.0)
        await env.advance(HOLD * 0.5)
        await _send(ref, 1, 10.0)  # its own hold runs out later; 2's is due first
        await env.advance(HOLD * 0.6)
        assert (await ref.query(Inbox.seen)).order == [(1, False), (2, False)]


def test_a_window_is_checked_when_the_signal_is_declared() -> None:
    with pytest.raises(corral.EntityDefinitionError, match="order_by must name a field"):
        corral.signal(Reply, order_by="when", hold=1.0)
    with pytest.raises(corral.EntityDefinitionError, match="hold must be"):
        corral.signal(Reply, order_by="at", hold=0)
    with pytest.raises(corral.EntityDefinitionError, match="hold must be"):
        corral.signal(Reply, order_by="at")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, TESTS / "window_worker.py") as start:
        yield start


async def test_held_replies_survive_a_sigkill_and_release_in_the_same_order(
    db_path: str, tmp_path: Path, spawn: Callable[..., Worker],
) -> None:
    ready = tmp_path / "ready"
    host = spawn("host", "host", "--db", db_path, "--ready", str(ready))
    await wait_for_file(ready)
    async with corral.open_runtime(db_path, entities=[Inbox], host=False) as client:
        ref = client.ref(Inbox, "t")
        for n, at in ((3, 30.0), (1, 10.0), (2, 20.0)):
            await _send(ref, n, at)
    host.sigkill()  # with the replies held (each for HOLD seconds after its acceptance)
    async with corral.open_runtime(db_path, entities=[Inbox], lease_ttl=2.0) as rt:
        ref = rt.ref(Inbox, "t")

        async def all_taken() -> bool:
            return len((await ref.query(Inbox.seen)).order) == 3

        await wait_until(all_taken, "the held replies released after the restart")
        assert (await ref.query(Inbox.seen)).order == [(1, False), (2, False), (3, False)]


async def test_late_is_judged_against_what_was_released_before_a_sigkill(
    db_path: str, tmp_path: Path, spawn: Callable[..., Worker],
) -> None:
    """The released watermark is in the snapshot: after the host is SIGKILLed with
    replies held, one ordered before a reply released before the kill is still late."""
    ready = tmp_path / "ready"
    host = spawn("host", "host", "--db", db_path, "--ready", str(ready))
    await wait_for_file(ready)
    async with corral.open_runtime(db_path, entities=[Inbox], host=False) as client:
        ref = client.ref(Inbox, "t")
        for n, at in ((1, 10.0), (2, 20.0)):
            await _send(ref, n, at)

        async def released() -> bool:
            return len((await ref.query(Inbox.seen)).order) == 2

        await wait_until(released, "1 and 2 released and taken", alive=[host])
        await _send(ref, 3, 30.0)
        await _send(ref, 15, 15.0)  # ordered before 2, released before the kill
    host.sigkill()  # with 3 and 15 held
    async with corral.open_runtime(db_path, entities=[Inbox], lease_ttl=2.0) as rt:
        ref = rt.ref(Inbox, "t")

        async def all_taken() -> bool:
            return len((await ref.query(Inbox.seen)).order) == 4

        await wait_until(all_taken, "the held replies released after the restart")
        assert (await ref.query(Inbox.seen)).order == [
            (1, False), (2, False), (15, True), (3, False)]
