"""A process still on release 1 of `Ticket` and `Order` (tests/runtime/test_renames.py):
`python rename_worker.py send --db STORE --key K --count N --done FILE`, or
`python rename_worker.py deliver --db STORE --key K --count N --done FILE`.

A pure client (`host=False`) with the old classes. `send` sends `customer_reply` by its
old name, N times; `deliver` delivers `Decision(approved=True)` to the wait `decision`
by its old name, key "old-1", N times (a retry after the first), and writes the
statuses to FILE, comma-separated. The test's process hosts release 2.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import corral
from rename_entities import Decision, OrderV1, Reply, TicketV1


async def send(db: str, key: str, count: int) -> None:
    async with corral.open_runtime(db, entities=[TicketV1], shards=2, host=False) as rt:
        ref = rt.ref(TicketV1, key)
        for i in range(count):
            await ref.signal_with_start(TicketV1.customer_reply, Reply(text=f"old-{i}"),
                                        start=None, message_id=f"old-{i}")


async def deliver(db: str, key: str, count: int) -> list[str]:
    async with corral.open_runtime(db, entities=[OrderV1], shards=2, host=False) as rt:
        ref = rt.ref(OrderV1, key)
        return [(await ref.deliver(OrderV1.decision, Decision(approved=True), key="old-1",
                                   sender="old")).status for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["send", "deliver"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--done", type=Path, required=True)
    args = parser.parse_args()
    if args.role == "deliver":
        statuses = asyncio.run(deliver(args.db, args.key, args.count))
        part = args.done.with_suffix(".part")  # the test reads FILE once it exists
        part.write_text(",".join(statuses))
        part.replace(args.done)
        return
    asyncio.run(send(args.db, args.key, args.count))
    args.done.write_text("done")


if __name__ == "__main__":
    main()
