"""Worker for tests/runtime/test_takeover.py: `python takeover_worker.py host DB STATUS`.

Opens DB (a SQLite file or a PostgreSQL URL) as a host, starts an `Alarm` due 2.5 s
later, and once the alarm's durable timer is stored writes its due time to STATUS; then
idles until SIGKILLed.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import corral
from stores import sql
from takeover_entities import Alarm, AlarmInput


async def host(db: str, status: str) -> None:
    async with corral.open_runtime(db, entities=[Alarm]) as rt:
        due = time.time() + 2.5
        await rt.ref(Alarm, "alarm").start(start=AlarmInput(due_at=due))
        while True:  # until run() has stored its timer
            if sql(db, "SELECT count(*) FROM timers")[0][0]:
                break
            await asyncio.sleep(0.01)
        Path(status).write_text(repr(due))  # noqa: ASYNC240 (a test helper: tiny write)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(host(sys.argv[2], sys.argv[3]))
