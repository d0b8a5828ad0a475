"""Lifecycle events: one structured log line each on `corral.lifecycle`, quiet by default."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import corral
from procs import TESTS, wait_until
from test_metrics import Item, Meter, Roll


async def test_each_lifecycle_event_is_one_line_with_its_entity_type_key_and_run(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="corral.lifecycle")
    async with corral.open_runtime(str(tmp_path / "s.db"), entities=[Meter], shards=2) as rt:
        ref = rt.ref(Meter, "log-1")
        await ref.signal_with_start(Meter.add, Item(id="a"), start=Roll())
        await ref.signal(Meter.add, Item(id="boom"))
        await ref.signal(Meter.roll)
        await wait_until(lambda: _events(caplog, "continue-as-new"), "the run continued")
        await ref.terminate("done")
        await wait_until(lambda: _events(caplog, "run closed"), "the run closed")
    records = [r for r in caplog.records if r.name == "corral.lifecycle"]
    by_event = {r.event: r for r in records}  # type: ignore[attr-defined]
    assert [r.shard for r in records if r.event == "lease taken"] == [0, 1]  # type: ignore[attr-defined]
    for event, run_id in (("run started", 1), ("dead-lettered", 1), ("continue-as-new", 1),
                          ("run closed", 2)):
        r = by_event[event]
        assert (r.entity_type, r.key, r.run_id) == ("Meter", "log-1", run_id), event  # type: ignore[attr-defined]
        assert r.getMessage().startswith(f"{event} Meter 'log-1' run {run_id}")
        assert "\n" not in r.getMessage()
    assert by_event["run closed"].status == "terminated"  # type: ignore[attr-defined]
    assert by_event["continue-as-new"].next_run == 2  # type: ignore[attr-defined]


def _events(caplog: pytest.LogCaptureFixture, event: str) -> bool:
    return any(getattr(r, "event", None) == event for r in caplog.records)


def test_lifecycle_lines_are_quiet_by_default(tmp_path: Path) -> None:
    script = (
        "import asyncio, corral\n"
        "from test_metrics import Item, Meter, Roll\n"
        "async def main():\n"
        f"    async with corral.open_runtime({str(tmp_path / 'q.db')!r}, entities=[Meter]) as rt:\n"
        "        ref = rt.ref(Meter, 'q')\n"
        "        await ref.signal_with_start(Meter.add, Item(id='a'), start=Roll())\n"
        "        await ref.terminate('done')\n"
        "asyncio.run(main())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(TESTS)}  # procs, which test_metrics imports
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "run started" not in done.stderr + done.stdout
    assert "lease taken" not in done.stderr + done.stdout
