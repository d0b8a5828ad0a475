"""A process on release 1 of `Case` (tests/runtime/test_builds.py, test_newest.py):
`python build_worker.py ROLE --db STORE --key K --ready FILE --stop FILE [--ttl S]`.

- `client`: a pure client (`host=False`): it sends one `note` to K, writes its
  registered process name to READY, and stays open (its build live in the registry)
  until STOP exists.
- `stream`: a host (lease term S) that writes its owner to READY and sends notes, each
  text its message id, one after another to the keys K-0 .. K-7 until STOP exists; then
  it writes {"acked": {key: [ids in order]}, "unhosted": sends acknowledged while it held
  no shard} to ACKED (READY with the suffix `.acked.json`) and closes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import corral
from build_entities import CaseR1, Note
from workers import write_json


async def client(db: str, key: str, ready: Path, stop: Path) -> None:
    async with corral.open_runtime(db, entities=[CaseR1], shards=2, host=False) as rt:
        await rt.ref(CaseR1, key).signal_with_start(CaseR1.note, Note(text="from r1"),
                                                    start=None, message_id="r1-note")
        mine = [p.process for b in await rt.builds(CaseR1) for p in b.processes
                if p.process.startswith(f"{os.getpid()}-")]
        part = ready.with_suffix(".part")
        part.write_text(mine[0])
        part.replace(ready)
        while not await asyncio.to_thread(stop.exists):
            await asyncio.sleep(0.02)


async def stream(db: str, key: str, ready: Path, stop: Path, ttl: float) -> None:
    async with corral.open_runtime(db, entities=[CaseR1], shards=4, lease_ttl=ttl) as rt:
        assert rt.host is not None
        host = rt.host
        write_json(ready, {"owner": host.owner})
        refs = [rt.ref(CaseR1, f"{key}-{n}") for n in range(8)]
        acked: dict[str, list[str]] = {ref.key: [] for ref in refs}
        unhosted = 0
        n = 0
        while not await asyncio.to_thread(stop.exists):
            ref = refs[n % len(refs)]
            mid = f"{ref.key}/{n}"
            await ref.signal_with_start(CaseR1.note, Note(text=mid), start=None,
                                        message_id=mid)
            acked[ref.key].append(mid)
            unhosted += not host.shards
            n += 1
            await asyncio.sleep(0.005)
        write_json(ready.with_suffix(".acked.json"), {"acked": acked, "unhosted": unhosted})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["client", "stream"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--stop", type=Path, required=True)
    parser.add_argument("--ttl", type=float, default=1.5)
    args = parser.parse_args()
    if args.role == "client":
        asyncio.run(client(args.db, args.key, args.ready, args.stop))
    else:
        asyncio.run(stream(args.db, args.key, args.ready, args.stop, args.ttl))


if __name__ == "__main__":
    main()
