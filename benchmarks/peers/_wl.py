"""The six workloads, run by every peer's driver in the peer's own interpreter.

Standard library only: each driver imports this module from its own virtual environment.
A driver wraps its system in an `Adapter` and calls `main(adapter)`; the result goes to
stdout as one line `RESULT {json}` for the orchestrator (`__main__.py`).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
_LOOP: asyncio.AbstractEventLoop | None = None
_WAITERS: dict[str, asyncio.Future[float]] = {}
COUNTS: dict[str, int] = {}  # applied signals per key, for peers whose handlers run here
_LOCK = threading.Lock()


# -- applied marks: in-process handlers call `applied_here`, others send a datagram -------


def applied_here(key: str, n: int, notify: bool) -> None:
    """Count one applied signal of `key`; with `notify`, wake the W5 waiter (thread-safe)."""
    with _LOCK:
        COUNTS[key] = COUNTS.get(key, 0) + 1
    if notify and _LOOP is not None:
        _LOOP.call_soon_threadsafe(_resolve, f"{key}|{n}", time.perf_counter())


def _resolve(tag: str, t: float) -> None:
    fut = _WAITERS.pop(tag, None)
    if fut is not None and not fut.done():
        fut.set_result(t)


def notify_udp(port: int, key: str, n: int) -> None:
    """Called by a handler in another process: tell the driver that (key, n) applied."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(f"{key}|{n}".encode(), ("127.0.0.1", port))


class _Datagrams(asyncio.DatagramProtocol):
    def datagram_received(self, data: bytes, addr: Any) -> None:
        _resolve(data.decode(), time.perf_counter())


# -- the process tree: CPU seconds and proportional memory, from /proc ------------------


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(entry))
    return kids


def tree(roots: list[int]) -> list[int]:
    """`roots` and all their live descendants."""
    kids, out, todo = _children(), [], list(roots)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.append(pid)
            todo.extend(kids.get(pid, []))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """user + sys of each process and of its reaped children, summed."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except (OSError, IndexError, ValueError):
            continue
    return total / CLK_TCK


def pss_bytes(pids: list[int]) -> int:
    """Proportional set size summed (RSS where smaps_rollup is unreadable)."""
    total = 0
    for pid in pids:
        for path, field in ((f"/proc/{pid}/smaps_rollup", "Pss:"),
                            (f"/proc/{pid}/status", "VmRSS:")):
            try:
                with open(path) as f:
                    line = next(x for x in f if x.startswith(field))
                total += int(line.split()[1]) * 1024
                break
            except (OSError, StopIteration, ValueError):
                continue
    return total


# -- the adapter a driver implements -------------------------------------------------------


class Adapter:
    """One system under test. Keys are fresh per workload; `n` numbers the signal."""

    name = "?"
    key_cap: int | None = None  # W1 uses at most this many keys (rate extrapolated)
    w3 = True
    w4 = True
    mem_cap: int | None = None
    w2_cap: int | None = None  # W2 sends at most this many signals per mode
    dists: tuple[str, ...] = ()  # distributions whose versions the result records
    poll = 0.005  # seconds between `applied` polls (a remote count costs a request)
    port = 0  # the driver's datagram port, for handlers in other processes

    async def open(self) -> None: ...
    async def close(self) -> None: ...

    async def sws(self, key: str, n: int, notify: bool = False) -> Any:
        """Signal-with-start; returns what `runs` needs (a run id, a started flag)."""
        raise NotImplementedError

    async def signal(self, key: str, n: int, notify: bool = False) -> Any:
        return await self.sws(key, n, notify)

    async def applied(self, key: str) -> int:
        return COUNTS.get(key, 0)

    def runs(self, results: list[Any]) -> int | None:
        """Runs started by the W3 race, from the callers' results."""
        return len({r for r in results if not isinstance(r, BaseException)})

    def server_pids(self) -> list[int]:
        return [int(p) for p in os.environ.get("PEER_SERVER_PIDS", "").split(",") if p]


async def _gather_limited(n: int, inflight: int, fn: Callable[[int], Awaitable[Any]]) -> None:
    it = iter(range(n))

    async def worker() -> None:
        for i in it:
            await fn(i)

    await asyncio.gather(*(worker() for _ in range(inflight)))


async def _wait_applied(a: Adapter, key: str, target: int, timeout: float) -> float | None:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if await a.applied(key) >= target:
            return time.perf_counter()
        await asyncio.sleep(a.poll)
    return None


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


async def run_all(a: Adapter, cfg: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tag, inflight = cfg["tag"], cfg["inflight"]
    roots = [os.getpid(), *a.server_pids()]

    # W1: signal-with-start on distinct keys
    keys = min(cfg["w1_keys"], a.key_cap or cfg["w1_keys"])
    for mode, conc in (("seq", 1), ("par", inflight)):
        t = time.perf_counter()
        await _gather_limited(keys, conc, lambda i, m=mode: a.sws(f"{tag}-w1{m}-{i}", i))
        out[f"w1_{mode}_per_s"] = keys / (time.perf_counter() - t)
    out["w1_keys"] = keys
    out["w1_extrapolated"] = keys < cfg["w1_keys"]
    print(f"  {a.name} W1 done", file=sys.stderr, flush=True)

    # W2 (+ W6 over the 32-in-flight part): signals into one running entity
    n2 = min(cfg["w2_signals"], a.w2_cap or cfg["w2_signals"])
    out["w2_signals"] = n2
    out["w2_capped"] = n2 < cfg["w2_signals"]
    for mode, conc in (("seq", 1), ("par", inflight)):
        key = f"{tag}-w2{mode}"
        await a.sws(key, -1)
        await _wait_applied(a, key, 1, 30)
        pids = tree(roots)
        cpu0 = cpu_seconds(pids)
        t = time.perf_counter()
        await _gather_limited(n2, conc, lambda i, k=key: a.signal(k, i))
        t_acc = time.perf_counter()
        t_all = await _wait_applied(a, key, n2 + 1, cfg["apply_timeout"])
        cpu1 = cpu_seconds(tree(roots))
        out[f"w2_{mode}_per_s"] = n2 / (t_acc - t)
        out[f"w2_{mode}_applied_s"] = None if t_all is None else t_all - t
        out[f"w2_{mode}_applied"] = await a.applied(key) - 1
        if mode == "par":
            out["w6_cpu_ms_per_signal"] = (cpu1 - cpu0) / n2 * 1000
            out["w6_processes"] = len(tree(roots))
    print(f"  {a.name} W2/W6 done", file=sys.stderr, flush=True)

    # W3: a race of signal-with-start on one fresh key
    if a.w3:
        key, n3 = f"{tag}-w3", cfg["race"]
        res = await asyncio.gather(*(a.sws(key, i) for i in range(n3)), return_exceptions=True)
        errors = [r for r in res if isinstance(r, BaseException)]
        await _wait_applied(a, key, n3 - len(errors), 30)
        out["w3_runs"] = a.runs(list(res))
        out["w3_applied"] = await a.applied(key)
        out["w3_errors"] = len(errors)
        out["w3_error_sample"] = repr(errors[0])[:200] if errors else None
        print(f"  {a.name} W3 done", file=sys.stderr, flush=True)

    # W4: memory per idle entity (the whole system's PSS growth)
    if a.w4:
        n4 = min(cfg["mem_entities"], a.mem_cap or cfg["mem_entities"])
        await asyncio.sleep(0.3)
        m0 = pss_bytes(tree(roots))
        await _gather_limited(n4, inflight, lambda i: a.sws(f"{tag}-w4-{i}", i))
        for i in range(0, n4, max(1, n4 // 20)):
            await _wait_applied(a, f"{tag}-w4-{i}", 1, 30)
        await _wait_applied(a, f"{tag}-w4-{n4 - 1}", 1, 30)
        await asyncio.sleep(0.5)
        m1 = pss_bytes(tree(roots))
        out["w4_entities"] = n4
        out["w4_capped"] = n4 < cfg["mem_entities"]
        out["w4_bytes_per_entity"] = (m1 - m0) / n4
        print(f"  {a.name} W4 done", file=sys.stderr, flush=True)

    # W5: one signal to an idle entity, send to handler applied
    key = f"{tag}-w5"
    await a.sws(key, -1)
    await _wait_applied(a, key, 1, 30)
    lat: list[float] = []
    assert _LOOP is not None
    for i in range(cfg["lat_samples"]):
        await asyncio.sleep(0.01)
        fut: asyncio.Future[float] = _LOOP.create_future()
        _WAITERS[f"{key}|{i}"] = fut
        t = time.perf_counter()
        await a.signal(key, i, notify=True)
        try:
            lat.append(await asyncio.wait_for(fut, 10) - t)
        except asyncio.TimeoutError:
            _WAITERS.pop(f"{key}|{i}", None)
    out["w5_p50_ms"] = None if not lat else pct(lat, 0.5) * 1000  # type: ignore[operator]
    out["w5_p99_ms"] = None if not lat else pct(lat, 0.99) * 1000  # type: ignore[operator]
    out["w5_samples"] = len(lat)
    print(f"  {a.name} W5 done", file=sys.stderr, flush=True)
    return out


async def _amain(a: Adapter, cfg: dict[str, Any]) -> dict[str, Any]:
    global _LOOP
    _LOOP = asyncio.get_running_loop()
    transport, _ = await _LOOP.create_datagram_endpoint(_Datagrams, local_addr=("127.0.0.1", 0))
    a.port = transport.get_extra_info("sockname")[1]
    t = time.perf_counter()
    await a.open()
    opened = time.perf_counter() - t
    try:
        out = await run_all(a, cfg)
    finally:
        await a.close()
        transport.close()
    out["open_s"] = opened
    from importlib import metadata
    out["versions"] = {d: metadata.version(d) for d in a.dists}
    return out


def main(a: Adapter) -> None:
    """Entry point of a driver: config JSON in argv[1], result on stdout."""
    cfg = json.loads(sys.argv[1])
    try:
        out = asyncio.run(_amain(a, cfg))
        out["ok"] = True
    except Exception as err:  # reported in the table, never dropped
        import traceback
        traceback.print_exc()
        out = {"ok": False, "error": f"{type(err).__name__}: {err}"[:300]}
    print("RESULT " + json.dumps(out), flush=True)
