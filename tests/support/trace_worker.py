"""Worker for tests/runtime/test_tracing.py: `python trace_worker.py host DB` hosts the
`Case` and `Notifier` entities of DB until it is killed (a short lease: the test's
next host takes its shards soon after)."""

from __future__ import annotations

import asyncio
import sys

import corral
from trace_entities import Case, Notifier


async def host(db: str) -> None:
    async with corral.open_runtime(db, entities=[Case, Notifier], lease_ttl=2.0):
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(host(sys.argv[2]))
