"""Worker for tests/runtime/test_handoff.py: `python handoff_worker.py ROLE DB STATUS TTL`.

- `host`: host every shard of DB (a SQLite file or a PostgreSQL URL) with lease term
  TTL, write {"owner": ...} to STATUS, and idle; SIGTERM closes the runtime gracefully
  (its shards handed to the live hosts) and exits 0. Lifecycle events go to the log.
- `receive`: host, ask for every shard (`request_shards`), write {"owner", "taken"}
  to STATUS once they are here, and idle until SIGKILLed.
- `request`: no host: ask for every shard through the store (renewing the request)
  until a holder released one to this process, write {"owner", "offered"} to STATUS,
  and idle until SIGKILLed (an heir dying before it takes its shards).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import uuid
from pathlib import Path

import corral
from corral.persistence import open_store
from handoff_entities import Tally
from workers import install, write_json

SHARDS = 4


async def host(db: str, status: Path, ttl: float) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with corral.open_runtime(db, entities=[Tally], shards=SHARDS, lease_ttl=ttl) as rt:
        assert rt.host is not None
        write_json(status, {"owner": rt.host.owner, "shards": sorted(rt.host.shards)})
        await stop.wait()


async def receive(db: str, status: Path, ttl: float) -> None:
    async with corral.open_runtime(db, entities=[Tally], shards=SHARDS, lease_ttl=ttl) as rt:
        assert rt.host is not None
        taken = await rt.host.request_shards(range(SHARDS), timeout=60)
        write_json(status, {"owner": rt.host.owner, "taken": taken})
        await asyncio.Event().wait()


async def request(db: str, status: Path, ttl: float) -> None:
    owner = f"requester-{uuid.uuid4().hex[:8]}"
    store = await open_store(db, shards=SHARDS)
    try:
        while not (offered := await store.lease_offers(owner)):
            await store.request_leases(owner, range(SHARDS), ttl)
            await asyncio.sleep(0.01)
        write_json(status, {"owner": owner, "offered": sorted(offered)})
        await asyncio.Event().wait()
    finally:
        await store.close()


if __name__ == "__main__":
    install()
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
    logging.getLogger("corral.lifecycle").setLevel(logging.INFO)
    role, db, status, ttl = sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])
    asyncio.run({"host": host, "receive": receive, "request": request}[role](db, status, ttl))
