"""Pykka: one ThreadingActor per entity, in this process, not durable.

Signal-with-start is a get-or-create in a locked dict of actors plus `tell`; a signal
counts as accepted when `tell` returns (nothing is written anywhere). Compared with
corral on its non-durable `:memory:` store (`corral-mem`).
"""

from __future__ import annotations

import threading
from typing import Any

import _wl
import pykka


class Counter(pykka.ThreadingActor):
    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.count = 0

    def on_receive(self, message: Any) -> None:
        n, notify = message
        self.count += 1
        _wl.applied_here(self.key, n, notify)


class PykkaAdapter(_wl.Adapter):
    name = "pykka"
    dists = ("pykka",)
    mem_cap = 2000  # one thread each

    def __init__(self) -> None:
        self._actors: dict[str, pykka.ActorRef[Counter]] = {}
        self._lock = threading.Lock()

    async def close(self) -> None:
        pykka.ActorRegistry.stop_all()

    def _get_or_start(self, key: str) -> pykka.ActorRef[Counter]:
        ref = self._actors.get(key)
        if ref is None:
            with self._lock:
                ref = self._actors.get(key)
                if ref is None:
                    ref = self._actors[key] = Counter.start(key)
        return ref

    async def sws(self, key: str, n: int, notify: bool = False) -> Any:
        ref = self._get_or_start(key)
        ref.tell((n, notify))
        return ref.actor_urn


if __name__ == "__main__":
    _wl.main(PykkaAdapter())
