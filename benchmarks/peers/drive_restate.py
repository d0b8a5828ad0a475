"""Restate: the server from npm, the service under hypercorn (`restate_service.py`).

A signal (with or without start: the first message to a key creates the object) is a
one-way `POST /Counter/<key>/ping/send` with a fresh `idempotency-key`, answered once
the server has logged it; applied counts come from the shared `count` handler. The
service process and the server are counted as part of the system (W4, W6).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import _wl
import httpx


class RestateAdapter(_wl.Adapter):
    name = "restate"
    dists = ("restate-sdk", "hypercorn", "httpx")
    poll = 0.05
    mem_cap = 500

    async def open(self) -> None:
        self.http = httpx.AsyncClient(base_url=os.environ["RESTATE_INGRESS"], timeout=60,
                                      limits=httpx.Limits(max_connections=64))

    async def close(self) -> None:
        await self.http.aclose()

    async def sws(self, key: str, n: int, notify: bool = False) -> Any:
        resp = await self.http.post(f"/Counter/{key}/ping/send",
                                    json={"n": n, "port": self.port if notify else 0},
                                    headers={"idempotency-key": uuid.uuid4().hex})
        resp.raise_for_status()
        return None

    async def applied(self, key: str) -> int:
        resp = await self.http.post(f"/Counter/{key}/count", json=None)
        resp.raise_for_status()
        return int(resp.json())

    def runs(self, results: list[Any]) -> int | None:
        return None  # no start and no runs: the object exists once it has state


if __name__ == "__main__":
    _wl.main(RestateAdapter())
