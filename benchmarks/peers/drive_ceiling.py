"""The raw ceiling: accept.py's plain aiosqlite group-commit writer, the same rows.

Per signal a journal row and a dedupe row (the runs row when the key is new, one
entities upsert per key per batch), one transaction and one commit per batch. It
validates, reads and applies nothing: "applied" here means committed, and it has no
entity semantics, so W3 (race) and W4 (memory per entity) do not apply.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _wl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: accept.py
import accept

from corral.persistence import canonical_json, payload_hash
from corral.runtime.client._boundary import new_message_id
from corral.runtime.client._router import Router


class CeilingAdapter(_wl.Adapter):
    name = "ceiling"
    dists = ("aiosqlite",)
    w3 = False
    w4 = False

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="corral-peers-")
        self._router = Router(16)
        self._start = canonical_json({"tenant": "acme"})
        self._state: dict[str, list[int]] = {}

    async def open(self) -> None:
        self.writer = accept.CeilingWriter(os.path.join(self._tmp.name, "ceiling.db"))
        await self.writer.open()

    async def close(self) -> None:
        await self.writer.close()
        self._tmp.cleanup()

    async def sws(self, key: str, n: int, notify: bool = False) -> Any:
        now = time.time()
        payload = canonical_json({"n": n, "notify": notify})
        st = self._state.get(key)
        runs_row = None
        etype = accept.ETYPE
        if st is None:
            st = self._state[key] = [1, self._router.shard_of(etype, key)]
            runs_row = (etype, key, 1, self._start, now, 1)
        seq, shard = st
        st[0] = seq + 1
        mid = new_message_id()
        await self.writer.write((
            (etype, key, seq, 1, shard, "signal", "ping", mid, payload, None, now),
            (etype, key, mid, seq, 1, payload_hash("ping", payload), None, now),
            runs_row,
            (etype, key, shard, 1, "running", seq + 1),
        ))
        _wl.applied_here(key, n, notify)  # committed = as far as the ceiling goes


if __name__ == "__main__":
    _wl.main(CeilingAdapter())
