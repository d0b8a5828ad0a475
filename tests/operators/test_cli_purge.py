"""`corral purge`: `--dry-run` counts per type what retention would purge and stores
nothing; without it the closed runs past retention go, in batches, with progress.

The store is seeded by a runtime whose `Brief` has the name but not the retention of
the application's (`tests/support/retention_app.py`), so its hosts purge nothing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.cli import main
from entities import Inbox, Note
from procs import wait_until
from retention_app import ASKED, app
from stores import row_counts

TESTS = Path(__file__).resolve().parents[1] / "support"
CORRAL = Path(sys.executable).with_name("corral")
N = 7

Unretained = type("Brief", (Inbox,), {"__module__": __name__})  # `Brief` as once declared


def _purge(db_path: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    return subprocess.run([str(CORRAL), "purge", "--store", db_path, "--app",
                           "retention_app:app", *args], env=env, capture_output=True,
                          text=True, timeout=90, check=False)


def _json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def _seed(db_path: str) -> None:
    """N closed runs of `Brief` and of `Kept`, and one open `Brief`; `Brief`'s
    retention passed."""
    async with corral.open_runtime(db_path, entities=[Unretained, app[1]]) as rt:
        for etype in (Unretained, app[1]):
            for i in range(N):
                ref = rt.ref(etype, f"k{i}")
                await ref.signal_with_start(etype.note, Note(text="stop"), start=None)
                await ref.result(timeout=30)
        await rt.ref(Unretained, "open").signal_with_start(Unretained.note, Note(text="hi"),
                                                           start=None)
    closed = time.time()
    await wait_until(lambda: time.time() > closed + 0.5, "Brief's retention passed")


async def test_corral_purge_dry_run_counts_and_stores_nothing_then_purges_in_batches(
    db_path: str,
) -> None:
    await _seed(db_path)
    before = row_counts(db_path)

    dry = _json(_purge(db_path, "--dry-run", "--json"))
    assert [(d["entity_type"], d["runs"], d["entities"]) for d in dry] == [("Brief", N, N)]
    assert row_counts(db_path) == before

    done = _purge(db_path, "--batch", "3", "--json")
    [line] = _json(done)
    assert (line["runs"], line["entities"], line["dry_run"]) == (N, N, False)
    assert done.stderr.count("Brief: purged") == 3  # batches of 3, 3 and 1
    after = row_counts(db_path)
    assert sum(before.values()) - sum(after.values()) == line["rows"]
    assert _json(_purge(db_path, "--dry-run", "--json"))[0]["runs"] == 0

    kept = _purge(db_path, "--type", "Kept")
    assert kept.returncode == 2, kept.stderr
    assert "declares no retention" in kept.stderr
    assert row_counts(db_path) == after


def test_corral_purge_asks_the_authorize_hook_and_a_refusal_deletes_nothing(
    db_path: str, capsys: pytest.CaptureFixture[str],
) -> None:
    asyncio.run(_seed(db_path))
    before = row_counts(db_path)
    for extra, kind, name in ((["--dry-run"], "read", "purgeable"), ([], "purge", "purge")):
        ASKED.clear()
        status = main(["purge", "--store", db_path, "--app", "retention_app:refusing",
                       "--sender", "ops", *extra])
        out, err = capsys.readouterr()
        assert (status, out) == (1, ""), err
        assert err.startswith(f"error: UnauthorizedError: {kind} {name!r} to Brief"), err
        assert [(r.sender, r.kind, r.name, r.entity_type, r.key) for r in ASKED] == [
            ("ops", kind, name, "Brief", "")]
        assert row_counts(db_path) == before
