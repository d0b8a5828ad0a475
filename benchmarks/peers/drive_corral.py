"""corral through its public API (`open_runtime`, `signal_with_start`, `signal`).

`drive_corral.py CONFIG` runs on a SQLite file (WAL, synchronous=FULL) in a temp dir;
with `"store": ":memory:"` in CONFIG on the non-durable in-memory store (the fair
opponent of Pykka). This process hosts the entities and applies every signal.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

import _wl
from pydantic import BaseModel

import corral


class Start(BaseModel):
    tenant: str


class Ping(BaseModel):
    n: int
    notify: bool = False


class Counter(corral.Entity):
    def __init__(self, init: Start) -> None:
        self.tenant = init.tenant
        self.count = 0

    @corral.signal
    def ping(self, p: Ping) -> None:
        self.count += 1
        _wl.applied_here(self.key, p.n, p.notify)


START = Start(tenant="acme")


class CorralAdapter(_wl.Adapter):
    dists = ("corral", "pydantic")
    def __init__(self, store: str) -> None:
        self.name = "corral" if store != ":memory:" else "corral-mem"
        self._store = store
        self._tmp = tempfile.TemporaryDirectory(prefix="corral-peers-")

    async def open(self) -> None:
        location = self._store or os.path.join(self._tmp.name, "bench.db")
        self._cm = corral.open_runtime(location, entities=[Counter])
        self.rt = await self._cm.__aenter__()

    async def close(self) -> None:
        await self._cm.__aexit__(None, None, None)
        self._tmp.cleanup()

    async def sws(self, key: str, n: int, notify: bool = False) -> Any:
        return await self.rt.ref(Counter, key).signal_with_start(
            Counter.ping, Ping(n=n, notify=notify), start=START)

    async def signal(self, key: str, n: int, notify: bool = False) -> Any:
        return await self.rt.ref(Counter, key).signal(Counter.ping, Ping(n=n, notify=notify))

    def runs(self, results: list[Any]) -> int:
        return sum(1 for r in results if not isinstance(r, BaseException) and r.started)


if __name__ == "__main__":
    _wl.main(CorralAdapter(json.loads(sys.argv[1]).get("store", "")))
