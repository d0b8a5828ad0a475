"""Worker for tests/runtime/test_steps_killed.py: `python step_worker.py host DB LOG N`
or `python step_worker.py relay DB`.

`host` opens DB (a SQLite file or a PostgreSQL URL) as a host and starts the
`Dispatcher` `k-1` (N steps, each logged to LOG, each followed by a send), idempotently:
a worker started again after a SIGKILL finds the run running and hosts it on. `relay`
hosts `Relay` entities (their handlers send) for signals the test sends. Both idle
until killed.
"""

from __future__ import annotations

import asyncio
import sys

import corral
from step_entities import AgentInput, Dispatcher, Escalation, Relay


async def host(db: str, log: str, steps: int) -> None:
    async with corral.open_runtime(db, entities=[Dispatcher, Escalation]) as rt:
        await rt.ref(Dispatcher, "k-1").start(
            start=AgentInput(log=log, steps=steps, pause=0.005), start_id="start-k-1")
        await asyncio.Event().wait()


async def relay(db: str) -> None:
    async with corral.open_runtime(db, entities=[Relay, Escalation], lease_ttl=2.0):
        await asyncio.Event().wait()


if __name__ == "__main__":
    if sys.argv[1] == "relay":
        asyncio.run(relay(sys.argv[2]))
    else:
        asyncio.run(host(sys.argv[2], sys.argv[3], int(sys.argv[4])))
