"""A process still on release 1 of `Ticket` (tests/test_renames.py):
`python rename_worker.py send --db STORE --key K --count N --done FILE`.

A pure client (`host=False`) with the old class: it sends `customer_reply` by its old
name, N times, then writes FILE. The test's process hosts release 2.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import corral
from rename_entities import Reply, TicketV1


async def send(db: str, key: str, count: int) -> None:
    async with corral.open_runtime(db, entities=[TicketV1], shards=2, host=False) as rt:
        ref = rt.ref(TicketV1, key)
        for i in range(count):
            await ref.signal_with_start(TicketV1.customer_reply, Reply(text=f"old-{i}"),
                                        start=None, message_id=f"old-{i}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["send"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--done", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(send(args.db, args.key, args.count))
    args.done.write_text("done")


if __name__ == "__main__":
    main()
