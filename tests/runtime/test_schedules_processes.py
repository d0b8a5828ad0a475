"""Schedules across real processes: the host holding a schedule's shard is SIGKILLed
just before a tick and, after a takeover, the next holder just after one; or hosts are
replaced one by one, each closing gracefully (a rolling deploy); every tick from the
first to the last is delivered once and applied once."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from procs import TESTS, Worker, spawner, wait_until
from stores import sql


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, TESTS / "schedule_worker.py") as start:
        yield start


def beats(db_path: str) -> list[str]:
    return [r[0] for r in sql(db_path, "SELECT message_id FROM journal WHERE message_id "
                                       "LIKE 'schedule:beat@%' ORDER BY seq")]


def holder(db_path: str) -> str:
    rows = sql(db_path, "SELECT owner FROM leases WHERE shard = (SELECT shard FROM "
                        "schedules WHERE id = 'beat')")
    return str(rows[0][0]) if rows else ""


async def _just_before_a_tick() -> None:
    """Until 50 ms before the next whole second (a tick of an every-second schedule)."""
    frac = time.time() % 1.0
    await asyncio.sleep(0.95 - frac if frac < 0.95 else 1.95 - frac)


async def test_every_tick_is_applied_once_when_holders_die_just_before_and_after_ticks(
        db_path: str, tmp_path: Path, spawn: Callable[..., Worker]) -> None:
    def start(name: str) -> tuple[Worker, Path]:
        ready = tmp_path / f"{name}.ready"
        return spawn(name, "host", db_path, str(ready), str(tmp_path / "finish"),
                     str(tmp_path / f"{name}.json"), str(tmp_path / f"{name}.leave")), ready

    first, first_ready = start("first")
    await wait_until(first_ready.exists, "the first host is up", alive=[first], timeout=60)
    second, second_ready = start("second")
    await wait_until(second_ready.exists, "the second host is up", alive=[second], timeout=60)
    owners = {json.loads(first_ready.read_text()): first,
              json.loads(second_ready.read_text()): second}
    await wait_until(lambda: len(beats(db_path)) >= 3, "three ticks", timeout=60)

    # The holder dies 50 ms before a tick: the other host takes the shard over (lease
    # term 2 s) and fires what it missed, inside the catch-up window.
    await _just_before_a_tick()
    dead = owners.pop(holder(db_path))
    dead.sigkill()
    before = len(beats(db_path))
    await wait_until(lambda: len(beats(db_path)) >= before + 3, "ticks after the takeover",
                     timeout=60)
    third, third_ready = start("third")
    await wait_until(third_ready.exists, "the third host is up", alive=[third], timeout=60)
    owners[json.loads(third_ready.read_text())] = third

    # The next holder dies just after a tick was committed.
    count = len(beats(db_path))
    await wait_until(lambda: len(beats(db_path)) > count, "a tick", timeout=30)
    owners.pop(holder(db_path)).sigkill()
    after = len(beats(db_path))
    await wait_until(lambda: len(beats(db_path)) >= after + 3, "ticks after the second "
                     "takeover", timeout=60)

    (tmp_path / "finish").write_text("")
    (last,) = owners.values()
    report = tmp_path / f"{last.name}.json"
    await wait_until(report.exists, "the survivor's report", alive=[last], timeout=90)
    ids = beats(db_path)
    ticks = [tick_of(i) for i in ids]
    assert len(ids) == len(set(ids))
    assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))  # none lost, in order
    assert json.loads(report.read_text()) == {"applied": len(ids)}


def tick_of(message_id: str) -> int:
    """The tick of a message id `schedule:beat@2026-...Z`, in epoch seconds."""
    text = message_id.split("@", 1)[1]
    return int(dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=dt.timezone.utc).timestamp())


async def test_every_tick_is_applied_once_through_a_rolling_replacement_of_the_hosts(
        db_path: str, tmp_path: Path, spawn: Callable[..., Worker]) -> None:
    """Five hosts in turn: each new one starts, then the holder closes (its shards
    handed to the newcomer), during per-second ticks."""

    def start(name: str) -> tuple[Worker, Path]:
        ready = tmp_path / f"{name}.ready"
        worker = spawn(name, "host", db_path, str(ready), str(tmp_path / "finish"),
                       str(tmp_path / f"{name}.json"), str(tmp_path / f"{name}.leave"))
        return worker, ready

    live, ready = start("h0")
    await wait_until(ready.exists, "h0 is up", alive=[live], timeout=60)
    await wait_until(lambda: len(beats(db_path)) >= 2, "two ticks", timeout=60)
    for n in range(1, 5):
        newcomer, ready = start(f"h{n}")
        await wait_until(ready.exists, f"h{n} is up", alive=[newcomer], timeout=60)
        (tmp_path / f"{live.name}.leave").write_text("")
        await wait_until(lambda w=live: w.proc.poll() is not None,
                         f"{live.name} closes", timeout=60)
        live.check_exited_cleanly()
        live = newcomer
        count = len(beats(db_path))
        await wait_until(lambda c=count: len(beats(db_path)) >= c + 2,
                         f"ticks on h{n}", alive=[live], timeout=60)
    (tmp_path / "finish").write_text("")
    report = tmp_path / f"{live.name}.json"
    await wait_until(report.exists, "the last host's report", alive=[live], timeout=90)
    ids = beats(db_path)
    ticks = [tick_of(i) for i in ids]
    assert len(ids) == len(set(ids))
    assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))  # none lost, in order
    assert json.loads(report.read_text()) == {"applied": len(ids)}
