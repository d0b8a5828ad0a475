"""CPU per signal of the Ray hot-key burst, in the driver and in the shard actors.

    RAY_AUTH_MODE=disabled PYTHONPATH=benchmarks .venv/bin/python benchmarks/ray_hot_cpu.py \
        [--bursts 4] [--py-spy PREFIX]

`ray_backend.py`'s second workload (10,000 signal_with_starts to 10 running keys, 4 shard
actors on one SQLite file) repeated in one deployment; for each burst, its rate and the
process CPU time per signal of the driver and of all shard actors together. CPU time
moves less with a shared machine's load than a rate does: alternate two checkouts
(`PYTHONPATH=<other checkout>/src:benchmarks`) run by run to compare them. With
`--py-spy PREFIX` each shard actor is sampled into `PREFIX-actorN.raw` (py-spy's raw
format) while the bursts run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import ray
from ray_backend import Counter, corral_burst, shard_pids

import corral
from corral.runtime import stop_ray_hosts

SIGNALS, HOT_KEYS = 10_000, 10


def actor_cpu(procs: list[psutil.Process]) -> float:
    return sum(p.cpu_times().user + p.cpu_times().system for p in procs)


def start_spies(procs: list[psutil.Process], prefix: str) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([shutil.which("py-spy") or "py-spy", "record", "-r", "200", "-f",
                              "raw", "-o", f"{prefix}-actor{i}.raw", "--pid", str(p.pid)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for i, p in enumerate(procs)]


async def bursts(count: int, spy: str | None, temp: str) -> None:
    namespace = f"hot-{uuid.uuid4().hex[:6]}"
    async with corral.open_runtime(str(Path(temp) / "c.db"), entities=[Counter],
                                   backend="ray", deploy=True, namespace=namespace, shards=4) as rt:
        hot = [f"hot-{i}" for i in range(HOT_KEYS)]
        await corral_burst(rt, [(f"warm-{i}", 0) for i in range(32)])
        await corral_burst(rt, [(k, 0) for k in hot])
        procs = [psutil.Process(pid) for pid in await shard_pids(rt)]
        await corral_burst(rt, [(hot[n % HOT_KEYS], n) for n in range(SIGNALS // 2)])
        spies = start_spies(procs, spy) if spy else []
        if spies:
            await asyncio.sleep(1.5)  # py-spy attaches
        print(f"corral from {Path(corral.__file__).parent}")
        for _ in range(count):
            driver, actors = time.process_time(), actor_cpu(procs)
            seconds = await corral_burst(rt, [(hot[n % HOT_KEYS], n) for n in range(SIGNALS)])
            driver, actors = time.process_time() - driver, actor_cpu(procs) - actors
            per = 1e6 / SIGNALS
            print(f"{SIGNALS / seconds:>8,.0f} signals/s   CPU per signal: driver "
                  f"{driver * per:4.0f} us, shard actors {actors * per:4.0f} us", flush=True)
        for s in spies:
            s.send_signal(2)  # py-spy writes its file on SIGINT
            s.wait()
    stop_ray_hosts(namespace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bursts", type=int, default=4)
    parser.add_argument("--py-spy", dest="spy", default=None,
                        help="sample each shard actor with py-spy into PREFIX-actorN.raw")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    temp = tempfile.mkdtemp(prefix="corral-hot-")
    ray.init(include_dashboard=False, _temp_dir=temp, log_to_driver=False,
             namespace="corral-hot")
    try:
        asyncio.run(bursts(args.bursts, args.spy, temp))
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
