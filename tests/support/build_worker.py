"""A process on release 1 of `Case` (tests/runtime/test_builds.py):
`python build_worker.py client --db STORE --key K --ready FILE --stop FILE`.

A pure client (`host=False`): it sends one `note` to K, writes its registered process
name to READY, and stays open (its build live in the registry) until STOP exists.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import corral
from build_entities import CaseR1, Note


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["client"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--stop", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(client(args.db, args.key, args.ready, args.stop))


if __name__ == "__main__":
    main()
