"""A client process of one release of `ticketdesk` (`ray_releases_cluster.py` runs it):
it imports that release by `sys.path`, as a web worker of that release would, and
connects to a running deployment as a pure client.

    python ticket_sender.py send --release r1 --address ADDR --namespace NS --store URL
        --shards S --keys k1,k2 --who NAME --stop FILE --out FILE
    python ticket_sender.py churn --release r1 --address ADDR --namespace NS --store URL
        --shards S --keys k1,k2 --who NAME --cycles 20 --out FILE

`send`: `ray.init(address)`, one client, notes round-robin to the tickets until the file
`--stop` exists. `churn`: never calls `ray.init` itself: `--cycles` times it opens a
client with `address=` (so `open_runtime` connects), sends one note, and closes it.
Either writes its `SendLog` as JSON (churn's with `cycles`: seconds per cycle).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _import_release(name: str) -> Any:
    from ticket_releases import release_dir

    sys.path.insert(0, release_dir(name))
    import ticketdesk.agent as agent  # release `name`'s, by sys.path

    return agent


async def _send(args: argparse.Namespace, agent: Any) -> dict[str, Any]:
    import corral
    from ticket_releases import send_notes

    async with corral.open_runtime(args.store, entities=[agent.Ticket], backend="ray",
                                   namespace=args.namespace, shards=args.shards) as rt:
        await asyncio.to_thread(Path(args.out + ".ready").write_text, "ready")
        log = await send_notes(rt, agent, args.keys.split(","), args.who,
                               Path(args.stop).exists)
    return log.as_json()


async def _churn(args: argparse.Namespace, agent: Any) -> dict[str, Any]:
    import corral
    from ticket_releases import SendLog, send_notes

    log, cycles = SendLog(), []
    keys = args.keys.split(",")
    for cycle in range(args.cycles):
        started = time.monotonic()
        async with corral.open_runtime(args.store, entities=[agent.Ticket], backend="ray",
                                       address=args.address, namespace=args.namespace,
                                       shards=args.shards) as rt:
            await send_notes(rt, agent, [keys[cycle % len(keys)]], f"{args.who}-{cycle}",
                             lambda: True, least=1, log=log)
        cycles.append(time.monotonic() - started)
    return {**log.as_json(), "cycles": cycles}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["send", "churn"])
    for flag in ("--release", "--address", "--namespace", "--store", "--keys", "--who",
                 "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--stop", default="")
    parser.add_argument("--cycles", type=int, default=20)
    args = parser.parse_args(argv)
    agent = _import_release(args.release)
    if args.role == "churn":
        report = asyncio.run(_churn(args, agent))
    else:
        import ray

        from ray_workers import RUNTIME_ENV

        ray.init(address=args.address, namespace=args.namespace, runtime_env=RUNTIME_ENV,
                 log_to_driver=False)
        try:
            report = asyncio.run(_send(args, agent))
        finally:
            ray.shutdown()
    tmp = Path(args.out + ".tmp")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
