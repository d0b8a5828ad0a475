"""The traps of running one deployment from several processes (issue 25, item 4):
one store is hosted by one cluster (`runtime/_hosting`), the actors' environment
(`env_vars`), and the host actors' logs on the driver."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import corral
from procs import Worker, spawner
from ray_workers import ENTITIES, RUNTIME_ENV, Counter, Item, Seen, Start

DRIVER = Path(__file__).resolve().parents[1] / "support" / "ray_hosting_driver.py"


def _rows(path: Path, query: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


@pytest.fixture
def private_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Drivers spawned meanwhile start Ray instances of their own (no RAY_ADDRESS; a
    short temp dir each is set by `_driver`)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    yield


def _driver(start: object, monkeypatch: pytest.MonkeyPatch, role: str, *args: str,
            temps: list[str]) -> Worker:
    temp = tempfile.mkdtemp(prefix="corral-r-")  # Ray's socket paths stay short
    temps.append(temp)
    monkeypatch.setenv("RAY_TMPDIR", temp)
    return start(role, role, *args)  # type: ignore[operator,no-any-return]


async def _wait(path: Path, worker: Worker, timeout: float = 240.0) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout
    while not path.exists():
        worker.check_alive()
        assert loop.time() < until, f"{path.name} never appeared:\n{worker.output}"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(600)
async def test_a_second_driver_with_a_ray_instance_of_its_own_is_refused_and_the_first_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_ray: None) -> None:
    """Two drivers, each `open_runtime(store, backend="ray")` with no address, so each
    with its own Ray instance, on one SQLite store. The second opens before the first
    has actors (nothing to refuse it yet): its first send is refused by its actor, which
    checks before taking a lease; a runtime it opens afterwards is refused at open.
    Both refusals are `StoreHostedElsewhereError` naming the first's Ray instance; the
    first's signals are each applied once, and the second stored nothing."""
    store = tmp_path / "shared.db"
    folder = tmp_path / "steps"
    folder.mkdir()
    temps: list[str] = []
    args = ("--store", str(store), "--dir", str(folder))
    try:
        with spawner(tmp_path, DRIVER) as start:
            first = _driver(start, monkeypatch, "first", *args, temps=temps)
            await _wait(folder / "first-opened", first)
            second = _driver(start, monkeypatch, "second", *args, temps=temps)
            await _wait(folder / "second-opened", second)
            (folder / "go1").write_text("")
            await _wait(folder / "first-sent1", first)
            (folder / "try").write_text("")
            await _wait(folder / "second.json", second)
            (folder / "go2").write_text("")
            await _wait(folder / "first.json", first)
            for worker in (first, second):
                await asyncio.to_thread(worker.proc.wait, 120)
                worker.check_exited_cleanly()
    finally:
        for temp in temps:
            shutil.rmtree(temp, ignore_errors=True)
    ours = json.loads((folder / "first.json").read_text())
    theirs = json.loads((folder / "second.json").read_text())
    assert "statuses" not in theirs and "opened_again" not in theirs, theirs
    for refused in (theirs["on_send"], theirs["on_open"]):
        assert refused["type"] == "StoreHostedElsewhereError", refused
        assert refused["cluster"].startswith(f"ray:{ours['address']}/session_")
        assert ours["address"] in refused["holder"]
        assert "address=" in refused["message"]
        assert "ray start --head" in refused["message"]
    assert ours["statuses"] == ["accepted"] * 60
    applied = sorted(i for items in ours["applied"].values() for i in items)
    assert applied == sorted(f"first-{n}" for n in range(60))  # each once, none lost
    assert _rows(store, "SELECT count(*) FROM dedupe") == [(60,)]  # the second's: none
