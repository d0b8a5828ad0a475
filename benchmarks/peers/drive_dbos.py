"""DBOS on a SQLite system database, a workflow per entity in this process.

DBOS has no signal-with-start: the closest is `start_workflow` under the key as its
workflow id (a started id returns the existing handle) followed by `send` with a fresh
idempotency key; the workflow loops on `recv`. The notification poll is lowered from
its 1 s default to 10 ms, or an idle `recv` wakes up only once a second (its CPU is
counted in W6).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

import _wl
from dbos import DBOS, SetWorkflowID

STARTS: dict[str, int] = {}


@DBOS.workflow()
async def counter(key: str) -> None:
    STARTS[key] = STARTS.get(key, 0) + 1
    while True:
        msg = await DBOS.recv_async("ping", timeout_seconds=3600)
        if msg is not None:
            _wl.applied_here(key, msg[0], msg[1])


class DbosAdapter(_wl.Adapter):
    name = "dbos"
    dists = ("dbos",)
    key_cap = 100
    w2_cap = 300
    mem_cap = 100

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="corral-peers-dbos-")

    async def open(self) -> None:
        DBOS(config={"name": "peers",
                     "system_database_url": "sqlite:///" + os.path.join(self._tmp.name,
                                                                         "dbos.db"),
                     "notification_listener_polling_interval_sec": 0.01})
        DBOS.launch()

    async def close(self) -> None:
        DBOS.destroy()
        self._tmp.cleanup()

    async def sws(self, key: str, n: int, notify: bool = False) -> Any:
        with SetWorkflowID(key):
            handle = await DBOS.start_workflow_async(counter, key)
        await DBOS.send_async(key, [n, notify], "ping", idempotency_key=uuid.uuid4().hex)
        return handle.get_workflow_id()

    def runs(self, results: list[Any]) -> int | None:
        race = [k for k in STARTS if k.endswith("-w3")]
        return STARTS[race[0]] if race else 0


if __name__ == "__main__":
    _wl.main(DbosAdapter())
