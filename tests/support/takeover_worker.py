"""Worker for tests/runtime/test_takeover.py and test_skewed_clocks.py.

`python takeover_worker.py host DB STATUS`: opens DB (a SQLite file or a PostgreSQL
URL) as a host, starts an `Alarm` due 2.5 s later, and once the alarm's durable timer
is stored writes its due time to STATUS; then idles until SIGKILLed.

`python takeover_worker.py hold DB READY HANG SKEW TTL`: a host whose wall clock
(`time.time`, for everything in the process) reads SKEW seconds off, of 4 shards with
lease term TTL; writes its owner name to READY once started, then hosts until
SIGKILLed, or hangs for good (its event loop blocked, every lock and session kept, as a
host stuck in a blocking call is) once the file HANG appears, writing `hung` to it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path


def skew_clock(seconds: float) -> None:
    """Make this process's wall clock read `seconds` off: before corral is imported, so
    a default argument bound to `time.time` reads the skewed clock too."""
    real = time.time
    time.time = lambda: real() + seconds


if __name__ == "__main__" and sys.argv[1] == "hold":
    skew_clock(float(sys.argv[5]))

import corral  # noqa: E402
from stores import sql  # noqa: E402
from takeover_entities import Alarm, AlarmInput  # noqa: E402
from workers import install  # noqa: E402


async def host(db: str, status: str) -> None:
    async with corral.open_runtime(db, entities=[Alarm]) as rt:
        due = time.time() + 2.5
        await rt.ref(Alarm, "alarm").start(start=AlarmInput(due_at=due))
        while True:  # until run() has stored its timer
            if sql(db, "SELECT count(*) FROM timers")[0][0]:
                break
            await asyncio.sleep(0.01)
        # Written aside, then renamed: the test waits for the file to exist and reads it
        # at once, and a file created empty and then written was read as '' (seen at load).
        part = Path(status + ".part")
        part.write_text(repr(due))  # noqa: ASYNC240 (a test helper: tiny write)
        part.replace(status)  # noqa: ASYNC240 (atomic: the reader never sees it empty)
        await asyncio.Event().wait()


async def hold(db: str, ready: str, hang: str, ttl: float) -> None:
    async with corral.open_runtime(db, entities=[Alarm], shards=4, lease_ttl=ttl) as rt:
        assert rt.host is not None
        Path(ready).write_text(rt.host.owner)  # noqa: ASYNC240 (a test helper: tiny write)
        while not Path(hang).exists():  # noqa: ASYNC240
            await asyncio.sleep(0.01)
        Path(hang).write_text("hung")  # noqa: ASYNC240
        time.sleep(3600)  # noqa: ASYNC251 (the point: a host stuck in a blocking call)


if __name__ == "__main__":
    install()
    if sys.argv[1] == "hold":
        asyncio.run(hold(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[6])))
    else:
        asyncio.run(host(sys.argv[2], sys.argv[3]))
