"""Plain Ray: one named, detached actor per entity, found or created with get_if_exists.

Every send is `Entity.options(name=key, get_if_exists=True, ...).remote(key)` then
`.ping.remote(...)`, awaited: Ray has no separate acceptance, a call returns once the
actor applied it. Nothing is durable or deduplicated. One actor is one worker process
(~90 MB), so W1 runs on `key_cap` keys per mode and W4 on `mem_cap` entities; rates
are per key, marked extrapolated.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import _wl

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
_TMP = tempfile.mkdtemp(prefix="corral-peers-ray-")
os.environ["RAY_TMPDIR"] = _TMP
import ray  # noqa: E402

NAMESPACE = f"peers-{os.getpid()}"


@ray.remote(num_cpus=0)
class Entity:
    def __init__(self, key: str, port: int) -> None:
        self.key, self.port, self.count = key, port, 0

    def ping(self, n: int, notify: bool) -> int:
        self.count += 1
        if notify:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(f"{self.key}|{n}".encode(), ("127.0.0.1", self.port))
        return self.count


class RayAdapter(_wl.Adapter):
    name = "ray"
    dists = ("ray",)
    key_cap = 10
    mem_cap = 5

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(32)
        self._names: set[str] = set()

    async def open(self) -> None:
        ray.init(num_cpus=2, namespace=NAMESPACE, include_dashboard=False,
                 _node_ip_address="127.0.0.1", _temp_dir=_TMP, log_to_driver=False)

    async def close(self) -> None:
        for name in self._names:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(ray.get_actor(name, namespace=NAMESPACE))
        ray.shutdown()
        self._pool.shutdown()
        shutil.rmtree(_TMP, ignore_errors=True)

    def _handle(self, key: str) -> Any:
        self._names.add(key)
        return Entity.options(name=key, namespace=NAMESPACE, get_if_exists=True,
                              lifetime="detached", num_cpus=0).remote(key, self.port)

    async def sws(self, key: str, n: int, notify: bool = False) -> Any:
        handle = await asyncio.get_running_loop().run_in_executor(self._pool, self._handle, key)
        await handle.ping.remote(n, notify)
        _wl.applied_here(key, n, False)
        return handle._actor_id.hex()


if __name__ == "__main__":
    _wl.main(RayAdapter())
