"""Worker for tests/runtime/test_schedules_processes.py.

`python schedule_worker.py host DB READY FINISH REPORT LEAVE`: a host of DB (2 shards,
lease term 2 s) that creates the schedule `beat` (every second, overlap allow, a
catch-up window of a minute: no tick is lost to a takeover) unless it exists, writes
its owner name to READY and hosts until SIGKILLed; until LEAVE appears, when it closes
(a graceful hand-off of its shards, as a rolling deploy stops a host); or until FINISH
appears: then it pauses the schedule, reads how many ticks the entity applied (a query
waits for every accepted tick) and writes {"applied": n} to REPORT.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import corral
from schedule_entities import Beat, Counter
from workers import install, write_json


async def host(db: str, ready: Path, finish: Path, report: Path, leave: Path) -> None:
    async with corral.open_runtime(db, entities=[Counter], shards=2, lease_ttl=2.0) as rt:
        assert rt.host is not None
        with contextlib.suppress(corral.ScheduleExistsError):
            await rt.schedules.create("beat", rt.ref(Counter, "c"), Counter.beat, Beat(),
                                      start=None, spec=corral.Interval(every=1),
                                      overlap=corral.Overlap.ALLOW, catchup_window=60)
        write_json(ready, rt.host.owner)
        while not finish.exists():  # noqa: ASYNC240 (a stat of a local file)
            if leave.exists():  # noqa: ASYNC240
                return
            await asyncio.sleep(0.005)
        await rt.schedules.pause("beat")
        applied = await rt.ref(Counter, "c").query(Counter.beats, timeout=60)
        write_json(report, {"applied": applied})


if __name__ == "__main__":
    install()
    asyncio.run(host(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]),
                     Path(sys.argv[6])))
