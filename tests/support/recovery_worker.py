"""Worker for tests/runtime/test_recovery_order.py.

`python recovery_worker.py idle DB READY N`: hosts DB with N `Idle` entities and a
`Ledger`, all resident and applied, its progress recorded (so the store knows nothing
of theirs is pending); writes READY, then idles until SIGKILLed.

`python recovery_worker.py waits DB READY N`: hosts DB with N `Alarm`s ringing 2 s after
it started and N `Order`s waiting for their approval, every one's timer or wait
stored; writes READY, then idles until SIGKILLed.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import corral
from recovery_entities import Idle, Ledger
from stores import sql
from takeover_entities import Alarm, AlarmInput
from wait_entities import Order, OrderInput
from workers import install


async def idle(db: str, ready: str, n: int) -> None:
    async with corral.open_runtime(db, entities=[Idle, Ledger]) as rt:
        host = rt.host
        assert host is not None
        for first in range(0, n, 1000):
            await rt.signal_many([corral.SignalItem(rt.ref(Idle, f"idle-{i}"), Idle.poke,
                                                    start=None)
                                  for i in range(first, min(n, first + 1000))])
        await rt.ref(Ledger, "ledger").start(start=None)
        while sum(a.is_ready and a.applied_seq >= 1 and a.mailbox_depth == 0
                  for s in host.shards.values() for a in s.activations()) < n + 1:
            await asyncio.sleep(0.02)
        while await host.record_progress():  # a round records at most PROGRESS_ROWS
            pass
        Path(ready).write_text("ready")  # noqa: ASYNC240 (a test helper: tiny write)
        await asyncio.Event().wait()


async def waits(db: str, ready: str, n: int) -> None:
    async with corral.open_runtime(db, entities=[Alarm, Order]) as rt:
        due = time.time() + 2.0
        for i in range(n):
            await rt.ref(Alarm, f"alarm-{i}").start(start=AlarmInput(due_at=due))
            await rt.ref(Order, f"order-{i}").start(start=OrderInput())
        while sql(db, "SELECT count(*) FROM timers")[0][0] < n or \
                sql(db, "SELECT count(*) FROM signal_waits")[0][0] < n:
            await asyncio.sleep(0.02)
        Path(ready).write_text("ready")  # noqa: ASYNC240 (a test helper: tiny write)
        await asyncio.Event().wait()


if __name__ == "__main__":
    install()
    if sys.argv[1] == "idle":
        asyncio.run(idle(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    else:
        asyncio.run(waits(sys.argv[2], sys.argv[3], int(sys.argv[4])))
