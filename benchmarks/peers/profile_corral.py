"""Profile corral's hot path on W1 and W2 sequential (the latency-bound rows).

    .venv/bin/python benchmarks/peers/profile_corral.py [--keys 500] [--signals 2000]

cProfile over the event loop's thread only (the store's writer thread runs the SQL and
the fsync; its share shows up as time spent waiting). Prints the wall time per call,
then the top functions by own time and by cumulative time per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import time

import _wl
from drive_corral import CorralAdapter


async def phases(keys: int, signals: int, plain: bool) -> None:
    a = CorralAdapter("")
    await a.open()
    try:
        await a.sws("warm", 0)
        for name, n, call in (("W1 sequential signal_with_start, distinct keys", keys,
                               lambda i: a.sws(f"w1-{i}", i)),
                              ("W2 sequential signal, one entity", signals,
                               lambda i: a.signal("warm", i))):
            prof = cProfile.Profile()
            t = time.perf_counter()
            cpu, loop_cpu = time.process_time(), time.thread_time()
            if not plain:
                prof.enable()
            for i in range(n):
                await call(i)
            prof.disable()
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
            loop_cpu = time.thread_time() - loop_cpu
            print(f"\n== {name}: {n} calls, per call {wall / n * 1e6:.0f} us wall, "
                  f"{cpu / n * 1e6:.0f} us process CPU, of which the event loop's thread "
                  f"{loop_cpu / n * 1e6:.0f} us{' (cProfile on)' if not plain else ''} ==")
            for order in () if plain else ("tottime", "cumulative"):
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats(order).print_stats(22)
                print("\n".join(x for x in out.getvalue().splitlines()[6:] if x.strip()))
    finally:
        await a.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=500)
    ap.add_argument("--signals", type=int, default=2000)
    ap.add_argument("--plain", action="store_true", help="no cProfile: timings only (py-spy)")
    args = ap.parse_args()

    async def run() -> None:
        _wl._LOOP = asyncio.get_running_loop()
        await phases(args.keys, args.signals, args.plain)

    asyncio.run(run())


if __name__ == "__main__":
    main()
